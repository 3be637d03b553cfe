"""The extender's verdicts and scores for one pod over one :class:`~scheduler_core.extender.view.NodeView`.

Pure: :func:`filter_verdict` and :func:`prioritize_scores` return frozen outcomes that carry the view
they were computed on, so that the wire replies, the adapters' logs and ``explain`` all read the same
decision.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.extender.view import NodeView, fragmentation_inputs, locality_inputs
from scheduler_core.extender.wire import encode_json, json_string
from scheduler_core.k8s.pods import PodDemand
from scheduler_core.scoring.gpu_fit import (
    MAX_EXTENDER_PRIORITY,
    FilterResult,
    Reason,
    ScoreResult,
    ScoreWeights,
)
from scheduler_core.scoring.locality import LocalitySettings
from scheduler_core.scoring.mig_fit import mig_preference
from scheduler_core.scoring.policy import SharePolicy

UNKNOWN_NODE_REASON = "node is not in the cluster state"
_SCORE_TAILS = np.array([f',"Score":{score}}},' for score in range(MAX_EXTENDER_PRIORITY + 1)], dtype=object)
"""``',"Score":7},'``: the end of a HostPriority entry after its host, per score (scores are 0..10)."""
_NO_NAMES = np.zeros(0, dtype=object)
_NO_IDS = np.zeros(0, dtype=np.intp)


@dataclass(frozen=True, eq=False)
class FilterOutcome:
    """A filter decision: what goes on the wire, plus what an adapter logs about it.

    ``kept_rows`` are the rows of the view that pass, and :attr:`kept` their node names
    (``names_only``) or the Node objects sent (``nodes``); ``unknown`` the names the cluster state
    lacks. ``error_kind`` says why ``error`` is set: ``invalid_pod`` or a
    :class:`~scheduler_core.errors.ClusterStateUnavailableError` kind.
    """

    names_only: bool
    kept_rows: npt.NDArray[np.intp] = field(default_factory=lambda: _NO_IDS)
    demand: PodDemand | None = None
    result: FilterResult | None = None
    unknown: list[str] = field(default_factory=list)
    error: str = ""
    error_kind: str = ""
    view: NodeView | None = None
    nodes: Sequence[Any] | None = None
    hint: str = ""
    """Where no node passes: what an autoscaler could add (:func:`~scheduler_core.k8s.autoscaler.autoscaler_hint`),
    ended to every refusal in the reply, which kube-scheduler's ``FailedScheduling`` event quotes."""

    @cached_property
    def kept(self) -> list[Any]:
        """The node names (``names_only``) or the Node objects that pass, in the request's order. The
        reply does not read it: it gathers the names' JSON by :attr:`kept_rows`."""
        source: Sequence[Any] = self.nodes if self.nodes is not None else self.view.table.names if self.view else ()
        return list(map(source.__getitem__, self.kept_rows.tolist()))

    def to_json(self) -> bytes:
        """The reply, kube-scheduler's ``ExtenderFilterResult``, as JSON: the one writer of it.

        The keys are the Go field names. The form the request did not use is ``null`` (``Nodes`` is a
        NodeList, ``{"metadata":{},"items":[...]}``, of the objects sent), the two failure maps are
        objects, ``{}`` when empty, and ``Error`` is a string, ``""`` without one. Written directly:
        each distinct reason is encoded once, and no dict is built per failed node (tens of thousands
        per call with ``NodeNames``)."""
        if self.result is None:
            return self._envelope(_json_map(_NO_NAMES, _NO_IDS, (), extra=self.unknown), "{}")
        failed = _json_map(*self._failed(unresolvable=False), extra=self.unknown)
        return self._envelope(failed, _json_map(*self._failed(unresolvable=True)))

    def _failed(self, *, unresolvable: bool) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.intp], tuple[str, ...]]:
        assert self.result is not None
        rows, text_id, texts = self.result.failed_rows(unresolvable=unresolvable)
        if self.hint:
            texts = tuple(f"{text}; {self.hint}" for text in texts)
        return self.result.table.json_names_at(rows), text_id, texts

    def _envelope(self, failed: str, unresolvable: str) -> bytes:
        """The reply with its kept nodes and its error, around the two failure maps written as JSON."""
        if not self.names_only:
            nodes, names = f'{{"metadata":{{}},"items":{encode_json(self.kept).decode()}}}', "null"
        elif self.view is not None:  # the kept names, encoded once per node table, gathered in C
            nodes, names = "null", "[" + ",".join(self.view.table.json_names_at(self.kept_rows).tolist()) + "]"
        else:
            nodes, names = "null", "[]"
        return (
            f'{{"Nodes":{nodes},"NodeNames":{names},"FailedNodes":{failed},'
            f'"FailedAndUnresolvableNodes":{unresolvable},"Error":{json_string(self.error)}}}'
        ).encode()

    def to_json_within(self, max_bytes: int) -> bytes:
        """:meth:`to_json` in at most ``max_bytes`` (a Lambda's reply is capped at 6 MB). Past that the
        reasons go first: ``FailedNodes``, then ``FailedAndUnresolvableNodes`` (kube-scheduler drops
        every node missing from ``NodeNames`` either way; the maps only explain, and mark the nodes
        preemption cannot help). A reply whose kept nodes alone are too large is an ``Error``."""
        body = self.to_json()
        if len(body) <= max_bytes:
            return body
        unresolvable = "{}" if self.result is None else _json_map(*self._failed(unresolvable=True))
        for failed_unresolvable in (unresolvable, "{}"):
            body = self._envelope("{}", failed_unresolvable)
            if len(body) <= max_bytes:
                return body
        message = (
            f"the filter keeps {len(self.kept_rows)} nodes, which do not fit in a {max_bytes}-byte reply; "
            "use nodeCacheCapable: true (names only), or serve the extender outside Lambda"
        )
        return encode_json({"Error": message})

    @property
    def nodes_feasible(self) -> int:
        return len(self.kept_rows)

    @property
    def nodes_in(self) -> int:
        failed = 0 if self.result is None else int(np.count_nonzero(self.result.reason))
        return len(self.kept_rows) + failed + len(self.unknown)

    def reason_counts(self) -> dict[str, int]:
        """Rejected nodes per reason category (``model``, ``too_few_free``, ``unknown_node``...)."""
        counts: dict[str, int] = {}
        if self.result is not None:
            tally = np.bincount(self.result.reason, minlength=len(Reason))
            counts = {Reason(code).name.lower(): int(n) for code, n in enumerate(tally.tolist()) if code and n}
        if self.unknown:
            counts["unknown_node"] = len(self.unknown)
        return counts

    def top_messages(self, count: int = 3) -> dict[str, int]:
        """The most common rejection messages, with how many nodes got each."""
        tally: Counter[str] = Counter(self.result.message_counts() if self.result is not None else {})
        if self.unknown:
            tally[UNKNOWN_NODE_REASON] += len(self.unknown)
        return {text: n for text, n in tally.most_common(count) if n}

    def summary(self) -> dict[str, Any]:
        """Nodes in and out and a histogram of reasons, for one structured log line."""
        return {
            "nodes_in": self.nodes_in,
            "nodes_feasible": self.nodes_feasible,
            "reasons": self.reason_counts(),
            "top_messages": self.top_messages(),
            "error": self.error,
        }


@dataclass(frozen=True, eq=False)
class PrioritizeOutcome:
    """A prioritize decision: one integer score per host, in the request's order (names the state
    lacks last, scored 0)."""

    hosts: list[str]
    score: npt.NDArray[np.int64]
    """Shape (len(hosts),): the score sent for each host."""
    demand: PodDemand | None = None
    scores: ScoreResult | None = None
    view: NodeView | None = None
    locality: npt.NDArray[np.float64] | None = None
    """Shape (n_nodes,): the locality component before any filter, for a pod with peers."""

    def to_json(self) -> bytes:
        """The reply, kube-scheduler's ``HostPriorityList``, as JSON (the one writer of it):
        ``[{"Host": name, "Score": 0..10}, ...]``, one entry per host sent, in order. Written with no
        Python work per host: the known hosts' names come encoded once per node table
        (:attr:`~scheduler_core.k8s.nodes.NodeTable.json_names`), and the entries' pieces are gathered
        from object arrays and joined once."""
        known = self.view.table.json_names if self.view is not None else _NO_NAMES
        hosts = known
        if len(self.hosts) > len(known):
            hosts = np.concatenate([known, _json_strings(self.hosts[len(known) :])])
        parts = np.empty(3 * len(hosts), dtype=object)
        parts[0::3] = '{"Host":'
        parts[1::3] = hosts
        parts[2::3] = _SCORE_TAILS[self.score]
        return ("[" + "".join(parts.tolist())[:-1] + "]").encode()

    @cached_property
    def values(self) -> list[int]:
        """:attr:`score` as a list."""
        values: list[int] = self.score.tolist()
        return values

    def summary(self) -> dict[str, Any]:
        best = self.values.index(max(self.values)) if self.values else None
        return {
            "nodes_in": len(self.hosts),
            "top_node": None if best is None else self.hosts[best],
            "top_score": None if best is None else self.values[best],
        }


def filter_verdict(view: NodeView, demand: PodDemand, nodes: Sequence[Any] | None) -> FilterOutcome:
    """The filter over ``view``; ``nodes`` are the full Node objects sent (None in the names form),
    which the reply returns as they came.

    >>> from scheduler_core.extender.view import node_view
    >>> from scheduler_core.extender.wire import ExtenderArgs
    >>> from scheduler_core.state.readings import NoReadings
    >>> node = {"metadata": {"name": "n"}, "status": {"allocatable": {"nvidia.com/gpu": "2"}}}
    >>> args = ExtenderArgs(pod={}, nodes=[node])
    >>> demand = PodDemand(gpus=4)
    >>> outcome = filter_verdict(node_view(None, args, demand, NoReadings()), demand, args.nodes)
    >>> outcome.kept, outcome.result.failed_unresolvable
    ([], {'n': '2 GPUs allocatable, pod needs 4'})
    """
    check_free: bool | npt.NDArray[np.bool_] = True
    if demand.counted_by_scheduler:
        # kube-scheduler's own count is fresher than any state here: leave it the count, except on the
        # nodes where shares hold GPUs, which that count cannot see.
        held = view.held_by_shares()
        check_free = False if held is None else held > 0
    result = view.filter(demand, check_free)
    kept = np.flatnonzero(result.feasible)
    return FilterOutcome(nodes is None, kept, demand, result, view.unknown, view=view, nodes=nodes)


def prioritize_scores(
    view: NodeView,
    demand: PodDemand,
    pod: Any,
    weights: ScoreWeights,
    locality: LocalitySettings,
    policy: SharePolicy,
) -> PrioritizeOutcome:
    """Score every node of ``view`` by ``policy`` (:meth:`SharePolicy.scores`); nodes that would not
    pass the filter score 0, and so do the names the cluster state lacks (they cannot be ranked, and
    they must not vanish from the reply)."""
    # Nodes this view has no room on score 0 (they are no better than stale here), but are never refused.
    feasible = view.filter(demand).feasible
    local = locality_inputs(view, demand, locality)
    fit = None
    if demand.mig and not demand.gpus:  # slices only: best fit on the nodes' layouts
        fit = mig_preference(view.table, view.mig_free(), demand, feasible)
    elif view.free_milli is not None and policy.places(demand):
        fragmentation = fragmentation_inputs(view, pod) if policy.reads_cpu else None
        fit = policy.preference(view.free_milli, view.table.alloc_gpus, demand, feasible, fragmentation)
    scores = policy.scores(view.table, view.free, view.utilization, demand, weights, feasible, locality=local, fit=fit)
    hosts = [*view.table.names, *view.unknown]
    score = np.concatenate([scores.score, np.zeros(len(view.unknown), dtype=np.int64)])
    return PrioritizeOutcome(hosts, score, demand, scores, view, local)


def _json_strings(values: Sequence[str]) -> npt.NDArray[np.object_]:
    """Each of ``values`` as a JSON string literal, in an object array."""
    return np.array(list(map(json_string, values)), dtype=object)


def _json_map(
    names: npt.NDArray[np.object_], text_id: npt.NDArray[np.intp], texts: tuple[str, ...], extra: Sequence[str] = ()
) -> str:
    """``{"name":"reason",...}`` for failed nodes: ``names`` already JSON literals, each with the index
    of its reason in ``texts``; plus ``extra`` names with the unknown-node reason. The pairs are put
    together by numpy's object gathers and one join: no Python work per node."""
    reasons = _json_strings([*texts, UNKNOWN_NODE_REASON])
    if len(extra):
        names = np.concatenate([names, _json_strings(extra)])
        text_id = np.concatenate([text_id, np.full(len(extra), len(texts), dtype=np.intp)])
    if not len(names):
        return "{}"
    parts = np.empty(2 * len(names), dtype=object)
    parts[0::2] = names
    parts[1::2] = (":" + reasons + ",")[text_id]
    return "{" + "".join(parts.tolist())[:-1] + "}"
