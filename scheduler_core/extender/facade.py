"""The extender facade: ``handle(verb, body) -> (status, body)``, shared by every adapter.

The extender service both transports share (``application/extender/service.py``: the Lambda handler and
``gpu-scheduler serve``) moves bytes in and out and records each answer; parsing, validation and the
decision live here and in :mod:`scheduler_core.extender.decide`. Status codes follow DESIGN section 4:

- 200 with a result, or 200 with ``Error`` for a semantic failure (an invalid pod annotation);
- 400 with ``{"Error": ...}`` for a body that cannot be parsed, has the wrong shape or is too large;
- 404 for a verb this extender does not serve;
- 503 for ``prioritize`` when the cluster state it needs is unavailable (kube-scheduler ignores
  prioritize errors; ``filter`` reports the same condition as ``Error``).

``bind`` and ``preempt`` (GPU sharing, DESIGN section 5) are served when the extender has an
:class:`Accounting`: the GPU ledger that records every bind. ``bind`` answers ``{"Error": ""}`` or
``{"Error": why}`` in a 200; ``preempt`` answers 503 when the cluster state is unavailable.

Anything else is a genuine fault: :meth:`Extender.handle` lets it propagate, and the service logs it
and answers 500.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from scheduler_core.errors import (
    ClusterStateUnavailableError,
    ConfigError,
    InvalidArgsError,
    InvalidPodError,
    Namer,
    Validatable,
    by_path,
)
from scheduler_core.extender.admission import bind_refusal, room_refusal
from scheduler_core.extender.decide import FilterOutcome, PrioritizeOutcome, filter_verdict, prioritize_scores
from scheduler_core.extender.holding import HoldsSource, with_holds
from scheduler_core.extender.preemption import Holdings, PreemptOutcome, candidates, decide_on_view, proposed_nodes
from scheduler_core.extender.view import NodeView, node_view
from scheduler_core.extender.wire import (
    STATUS,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderPreemptionArgs,
    decode_json,
    encode_json,
    error_body,
)
from scheduler_core.k8s.autoscaler import KNOWN_MODELS, autoscaler_hint
from scheduler_core.k8s.names import LABEL_MODEL, MILLI_PER_GPU, PEERS_ANNOTATION
from scheduler_core.k8s.pod_requests import assumed_cpu_milli
from scheduler_core.k8s.pods import PodDemand, pod_demand
from scheduler_core.scoring.gpu_fit import MAX_EXTENDER_PRIORITY, FilterResult, Reason, ScoreWeights
from scheduler_core.scoring.locality import LocalitySettings
from scheduler_core.scoring.policy import DEFAULT_SHARE_POLICY, SharePolicy, share_policy
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.ledger import Demand, choose_gpus
from scheduler_core.state.readings import NoReadings, Readings

VERBS = ("filter", "prioritize")
SHARING_VERBS = ("bind", "preempt")
DEFAULT_MAX_BODY_BYTES = 16 * 2**20
MAX_PREEMPT_NODES = 5000
"""Nodes one ``preempt`` may name. kube-scheduler sends at most its dry-run candidates (10 % of the
nodes, at least 100); past this a request is not from it, and is refused before the ledger is read."""

ClusterSource = Callable[[], ClusterState | None]
"""Returns the current cluster state, or ``None`` when none is configured. May raise
:class:`ClusterStateUnavailableError` (for example when a snapshot is too old)."""

CATCH_UP_S = 0.25
"""How long filter waits, before it refuses a node for what is in use there, for a source that has
received a change which may free capacity but not yet built it into its state (well inside the
generated ``httpTimeout`` of 3 s)."""


@runtime_checkable
class CatchingUp(Protocol):
    """A :data:`ClusterSource` that knows when changes it has received are not in its state yet
    (``adapters.live_state.LiveState``): ``catch_up(timeout_s, nodes)`` waits for those that may free
    capacity (and, briefly, for the deletion of a terminating pod on one of ``nodes`` to arrive), or with
    ``node_facts`` for changes of ``nodes`` themselves (their labels or allocatable), and says whether it
    waited for one that is in the state now."""

    def catch_up(self, timeout_s: float, nodes: Collection[str] = (), *, node_facts: bool = False) -> bool: ...

    # node_facts: wait for changes of ``nodes`` only, nodes the caller knows the state is behind on.


@dataclass(frozen=True)
class ExtenderConfig(Validatable):
    """Settings of the extender core. ``max_body_bytes`` is the largest request accepted;
    ``share_policy`` names the policy that places pods (:attr:`policy`,
    :mod:`scheduler_core.scoring.policy`); ``assume`` see below."""

    weights: ScoreWeights = field(default_factory=ScoreWeights)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    locality: LocalitySettings = field(default_factory=LocalitySettings)
    share_policy: str = DEFAULT_SHARE_POLICY
    assume: bool = True
    """Lay the extender's own predictions over its state at once: the only node a filter keeps, or the
    one node prioritize alone scores highest, takes the pod's GPUs there (as kube-scheduler assumes a
    pod on its node before the bind returns), until the state shows where the pod really went."""

    def problems(self, name: Namer = by_path) -> list[str]:
        """Every invalid field, named by ``name`` of its path (``weights.fit``, ``share_policy``...): the one
        check of the extender's settings, which the Lambda's, ``serve``'s and the CDK app's validation call
        with their own names for each path."""
        problems = self.weights.problems(name) + self.locality.problems(name)
        if (
            isinstance(self.max_body_bytes, bool)
            or not isinstance(self.max_body_bytes, int)
            or self.max_body_bytes <= 0
        ):
            problems.append(f"{name('max_body_bytes')}: must be a positive integer, got {self.max_body_bytes!r}")
        try:
            _ = self.policy
        except ConfigError as exc:
            problems.append(f"{name('share_policy')}: {exc}")
        return problems

    @property
    def policy(self) -> SharePolicy:
        """The share policy named by ``share_policy``; :class:`ConfigError` for an unknown name."""
        return share_policy(self.share_policy)


@dataclass(frozen=True, eq=False)
class BindOutcome:
    """A bind: ``error`` empty when the pod is bound; ``error_kind`` names the failure for metrics
    (``pod_gone``, ``no_room``, ``conflict``, ``ledger_error``, ``kube_error``...)."""

    pod: str
    node: str
    error: str = ""
    error_kind: str = ""
    assigned: str = ""  # the gpu-scheduler.io/assigned-gpus value, "" for a pod with no GPU
    conflicts: int = 0
    already: bool = False  # a repeat of a bind that had already happened
    rolled_back: bool = False

    def to_json(self) -> bytes:
        return encode_json({"Error": self.error})

    def summary(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "node": self.node,
            "assigned": self.assigned,
            "conflicts": self.conflicts,
            "already": self.already,
            "rolled_back": self.rolled_back,
            "error": self.error,
        }


Admit = Callable[[Mapping[str, Any], Mapping[str, Any]], str]
"""``admit(pod, node)``: why binding the pod to the node (both as the API server has them) is refused,
``""`` when it is the extender's to do (:meth:`Extender.admit`)."""


class Accounting(Protocol):
    """The GPU ledger behind ``bind`` and ``preempt`` (``shares.binder.LedgerBinder``). ``bind`` asks
    ``admit`` before it writes anything; ``holdings`` raises :class:`ClusterStateUnavailableError` when
    the ledger cannot be read."""

    def bind(self, args: ExtenderBindingArgs, admit: Admit) -> BindOutcome: ...

    def holdings(self, nodes: Sequence[str]) -> Holdings: ...


Outcome = FilterOutcome | PrioritizeOutcome | BindOutcome | PreemptOutcome


@dataclass(frozen=True, eq=False)
class Reply:
    """An answer: its body, the decision behind it when there was one, the error kind its metrics and logs
    name, and ``ended`` (a key of :data:`~scheduler_core.extender.wire.STATUS`): "" for a decision, else
    why the call was refused, which gives its HTTP status."""

    body: bytes
    outcome: Outcome | None = None
    error_kind: str = ""
    ended: str = ""

    @property
    def status(self) -> int:
        return STATUS[self.ended]

    @classmethod
    def refused(cls, ended: str, message: str, error_kind: str = "") -> Reply:
        """A refusal: ``{"Error": message}`` with the status of ``ended``."""
        return cls(error_body(message), error_kind=error_kind or ended, ended=ended)


class Extender:
    """Filter and prioritize for GPU pods (whole GPUs and shares); bind and preempt with a ledger.

    Parameters
    ----------
    config : ExtenderConfig
    cluster : callable returning ClusterState or None
        Source of per-node usage. Without one, every node counts as empty (kube-scheduler's own
        accounting of ``nvidia.com/gpu`` still applies), and the ``NodeNames`` form is refused.
    readings : Readings, optional
        What this instance's binds read from the ledger, laid over the cluster state; shared with
        ``accounting``, which records them (``adapters.ledger_readings.LedgerReadings``).
    accounting : Accounting, optional
        The GPU ledger; with it ``bind`` and ``preempt`` are served.
    holds : HoldsSource, optional
        A consolidation's holds, which the filter obeys (:mod:`scheduler_core.extender.holding`).
    """

    def __init__(
        self,
        config: ExtenderConfig | None = None,
        cluster: ClusterSource | None = None,
        readings: Readings | None = None,
        accounting: Accounting | None = None,
        holds: HoldsSource | None = None,
    ) -> None:
        self.config = (config or ExtenderConfig()).validated()
        self._cluster = cluster or (lambda: None)
        # Checked once: an isinstance against a runtime Protocol reads its members each time (4 % of
        # serve's time under a burst, measured with py-spy).
        self._catching_up: CatchingUp | None = self._cluster if isinstance(self._cluster, CatchingUp) else None
        self.readings: Readings = readings or NoReadings()
        self.accounting = accounting
        self._holds = holds
        self._last_args: tuple[bytes, ExtenderArgs] | None = None
        self._last_demand: tuple[Any, PodDemand] | None = None

    @property
    def verbs(self) -> tuple[str, ...]:
        return VERBS + (SHARING_VERBS if self.accounting is not None else ())

    # -- wire level ---------------------------------------------------------------------------
    def handle(self, verb: str, body: bytes) -> tuple[int, bytes]:
        """Answer one extender call. See the module docstring for the status codes.

        >>> import json
        >>> status, reply = Extender().handle("filter", b'{"Pod": {}, "Nodes": {"items": []}}')
        >>> status, json.loads(reply)["Error"]
        (200, '')
        """
        reply = self.respond(verb, body)
        return reply.status, reply.body

    def refuse_size(self, length: int) -> Reply | None:
        """The body limit, the one rule for every transport: a 400 for a body of ``length`` bytes over
        ``config.max_body_bytes``, else None. :meth:`respond` applies it to the body; ``serve`` applies it
        to ``Content-Length`` first, so that it never reads a body it would refuse.

        >>> Extender(ExtenderConfig(max_body_bytes=10)).refuse_size(11).body
        b'{"Error":"request body is 11 bytes; the limit is 10"}'
        """
        if length <= self.config.max_body_bytes:
            return None
        message = f"request body is {length} bytes; the limit is {self.config.max_body_bytes}"
        return Reply.refused("too_large", message)

    def respond(self, verb: str, body: bytes) -> Reply:
        """:meth:`handle`, plus the decision and the error kind for an adapter's logs and metrics."""
        verb = verb.strip("/")
        if verb not in self.verbs:
            message = f"unknown verb {verb[:64]!r}: this extender serves {', '.join(self.verbs)}"
            return Reply.refused("unknown_verb", message)
        refused = self.refuse_size(len(body))
        if refused is not None:
            return refused
        try:
            if verb == "bind":
                assert self.accounting is not None  # checked with the verb
                bound = self.accounting.bind(ExtenderBindingArgs.from_wire(decode_json(body)), self.admit)
                return Reply(bound.to_json(), bound, bound.error_kind)
            if verb == "preempt":
                preempted = self.preempt(ExtenderPreemptionArgs.from_wire(decode_json(body)))
                return Reply(encode_json(preempted.to_wire()), preempted)
            args = self._args(body)
            if verb == "filter":
                outcome = self.filter(args)
                return Reply(outcome.to_json(), outcome, outcome.error_kind)
            scored = self.prioritize(args)
            return Reply(scored.to_json(), scored)
        except InvalidArgsError as exc:
            return Reply.refused("bad_request", str(exc))
        except InvalidPodError as exc:  # prioritize and preempt: filter reports it as Error in a 200
            return Reply.refused("invalid_pod", str(exc))
        except ClusterStateUnavailableError as exc:  # prioritize only, as above
            return Reply.refused("unavailable", str(exc), exc.kind)

    def _args(self, body: bytes) -> ExtenderArgs:
        """The request, decoded; kube-scheduler sends prioritize the very bytes it sent filter when the
        filter kept every node, so the last body's decoding is reused then (the args are never mutated)."""
        last = self._last_args
        if last is not None and body == last[0]:
            return last[1]
        args = ExtenderArgs.decode(body)
        self._last_args = (body, args)  # one tuple, swapped whole: safe across request threads
        return args

    # -- decision level -----------------------------------------------------------------------
    def filter(self, args: ExtenderArgs) -> FilterOutcome:
        """Filter ``args`` and build the reply in the request's node form."""
        try:
            demand = self.demand(args.pod)
            view = self.view(args, demand)
            unknown_models(demand, view)
        except (InvalidPodError, ClusterStateUnavailableError) as exc:
            kind = exc.kind if isinstance(exc, ClusterStateUnavailableError) else "invalid_pod"
            return FilterOutcome(args.names_only, error=str(exc), error_kind=kind)
        outcome = filter_verdict(view, demand, args.nodes)
        if outcome.result is not None and self._refreshed_for(outcome.result):
            outcome = filter_verdict(self.view(args, demand), demand, args.nodes)
        outcome = with_holds(outcome, args.pod, self._holds)
        if not len(outcome.kept_rows) and outcome.result is not None and len(outcome.result.reason):
            outcome = replace(outcome, hint=autoscaler_hint(args.pod, demand))
        if len(outcome.kept_rows) == 1:
            self._assume(view, int(outcome.kept_rows[0]), demand, args.pod)  # kube-scheduler skips prioritize: its node
        return outcome

    def _refreshed_for(self, result: FilterResult) -> bool:
        """Whether a refusal met a source behind on a change that may undo it, and the source has caught
        up: then filter decides again. A refusal for what is in use there (``FailedNodes``: GPUs or milli
        taken, which a deletion frees) waits for any change that may free capacity. One for a node's own
        facts (``FailedAndUnresolvableNodes``) waits only where the state is known to be behind on that
        node: too few allocatable GPUs for a whole-GPU pod that kube-scheduler, which counts
        ``nvidia.com/gpu`` itself, sent the node for. kube-scheduler 1.33 retries a pod the extender
        refused on a cluster event, at once when its queue is empty, so it can ask before the source has
        the change: a deletion that freed the node, or a new node's GPUs, which its device plugin reports
        after the node registered. Refused again as unresolvable, the pod would wait minutes for another
        event."""
        source = self._catching_up
        if source is None or result.feasible.all():
            return False
        names = result.table.names
        refused = np.flatnonzero(~result.feasible & ~result.unresolvable)
        if refused.size:
            return source.catch_up(CATCH_UP_S, [names[row] for row in refused.tolist()])
        if not result.demand.counted_by_scheduler:
            return False
        behind = np.flatnonzero(result.reason == Reason.TOO_FEW_GPUS)
        return bool(behind.size) and source.catch_up(
            CATCH_UP_S, [names[row] for row in behind.tolist()], node_facts=True
        )

    def prioritize(self, args: ExtenderArgs) -> PrioritizeOutcome:
        """Score every node of ``args``; nodes that would not pass the filter score 0.

        Raises
        ------
        InvalidPodError, ClusterStateUnavailableError
            ``prioritize`` has no ``Error`` field; :meth:`handle` maps these to 400 and 503.
        """
        demand = self.demand(args.pod)
        config = self.config
        policy = config.policy
        view = self.view(args, demand, per_gpu=policy.places(demand), assumed=True)
        outcome = prioritize_scores(view, demand, args.pod, config.weights, config.locality, policy)
        if outcome.scores is not None:
            top = np.flatnonzero(outcome.scores.score == MAX_EXTENDER_PRIORITY)
            if top.size == 1:
                self._assume(view, int(top[0]), demand, args.pod)
        return outcome

    def preempt(self, args: ExtenderPreemptionArgs) -> PreemptOutcome:
        """Keep the proposed nodes where the victims free enough GPU
        (:mod:`scheduler_core.extender.preemption`).

        Raises
        ------
        InvalidPodError, ClusterStateUnavailableError
            As for :meth:`prioritize`.
        """
        demand = self.demand(args.pod)
        names = proposed_nodes(args)
        if len(names) > MAX_PREEMPT_NODES:
            raise InvalidArgsError(f"preempt names {len(names)} nodes; the limit is {MAX_PREEMPT_NODES}")
        state = self._cluster()
        if state is None:
            raise ClusterStateUnavailableError("preempt needs cluster state and this extender has none")
        names = [name for name in names if name in state.table.index]  # only those read the ledger
        holdings = self.accounting.holdings(names) if self.accounting is not None and names else {}
        view = self.view(ExtenderArgs(pod={}, node_names=names), demand, per_gpu=True)
        return decide_on_view(demand, candidates(args, holdings), view)

    def admit(self, pod: Mapping[str, Any], node: Mapping[str, Any]) -> str:
        """:data:`Admit` on the current state (:func:`~scheduler_core.extender.admission.bind_refusal`).
        Without a cluster source the node object just read stands in for the state; a source that
        fails (a stale snapshot, say) refuses the bind, naming only the failure's kind: the bind's answer
        reaches the pod's events, and the source's own words (a bucket, a key, S3's text) are the
        operator's, in filter's answer and the logs.

        A source that follows the cluster as it changes (a watch: :class:`CatchingUp`) also refuses a
        node whose bound pods leave too little CPU for the pod
        (:func:`~scheduler_core.extender.admission.room_refusal`), after waiting, as filter does, for a
        change it has received that may free room there. Any other source may be minutes old: what is in
        use there may only score, never refuse (DESIGN section 5)."""
        source, watch = self._cluster, self._catching_up
        try:
            demand = pod_demand(pod)
            state = source()
            if state is None:
                state = ClusterState.from_objects([node])
            refusal = bind_refusal(pod, node, demand, state)
            if refusal or watch is None:
                return refusal
            refusal = room_refusal(pod, node, state)
            if refusal and watch.catch_up(CATCH_UP_S, [(node.get("metadata") or {}).get("name", "")]):
                refusal = room_refusal(pod, node, source() or state)
        except InvalidPodError as exc:
            return str(exc)
        except ClusterStateUnavailableError as exc:
            return f"no cluster state to check the node against ({exc.kind}); kube-scheduler will retry the pod"
        except InvalidArgsError:
            return "no cluster state to check the node against (invalid); kube-scheduler will retry the pod"
        return refusal

    def demand(self, pod: Any) -> PodDemand:
        """The pod's demand, with its peers' label keys checked against the indexed ones.

        Raises
        ------
        InvalidPodError
            An invalid GPU request or annotation, or a peer selector on a key that is not indexed.
        """
        last = self._last_demand
        if last is not None and last[0] is pod:  # prioritize of the args filter decoded (see _args)
            return last[1]
        demand = pod_demand(pod)
        keys = self.config.locality.label_keys
        for peer in demand.peers:
            if peer.key not in keys:
                raise InvalidPodError(
                    f"annotation {PEERS_ANNOTATION}: label key {peer.key!r} (in {peer.selector!r}) is not indexed; "
                    f"use one of {', '.join(keys)}"
                )
        self._last_demand = (pod, demand)  # one tuple, swapped whole; holds the pod, so its id is not reused
        return demand

    def view(self, args: ExtenderArgs, demand: PodDemand, *, per_gpu: bool = False, assumed: bool = False) -> NodeView:
        """The request's nodes as filter and prioritize see them (:func:`~scheduler_core.extender.view.node_view`);
        ``assumed`` (prioritize) lays this instance's predictions over them too.

        Raises
        ------
        ClusterStateUnavailableError
            The cluster source has no usable state, or the request names nodes and there is none.
        """
        return node_view(self._cluster(), args, demand, self.readings, per_gpu=per_gpu, assumed=assumed)

    def _assume(self, view: NodeView, row: int, demand: PodDemand, pod: Any) -> None:
        """Record that the pod takes its GPUs on ``view``'s node ``row`` (what the ledger's bind would
        choose there: the tightest GPU for a share, the lowest-index free ones for whole GPUs), and its
        CPU, which a policy that reads CPU needs; a pod without GPUs, its CPU only, where the policy
        places such pods (:meth:`SharePolicy.assumes_cpu_only`)."""
        if not self.config.assume or not demand.uid:
            return
        cpu = assumed_cpu_milli(pod)
        node = view.table.names[row]
        if not demand.gpus:
            if cpu and self.config.policy.assumes_cpu_only():
                self.readings.assume(node, (), demand.uid, cpu)
            return
        need = Demand(1, demand.share) if demand.share else Demand(demand.gpus, MILLI_PER_GPU)
        pairs = choose_gpus(view.free_milli_at(row).astype(np.int64), need)
        if pairs is None:
            return
        self.readings.assume(node, pairs, demand.uid, cpu)

    def state(self) -> ClusterState | None:
        """The cluster state this extender decides from now (may raise, as the source does)."""
        return self._cluster()


def unknown_models(demand: PodDemand, view: NodeView) -> None:
    """Refuse a pod whose GPU models are all ones neither a node of the cluster has nor the product knows
    (:data:`~scheduler_core.k8s.autoscaler.KNOWN_MODELS`): a typo (``H1OO``) would otherwise leave it
    Pending for good, every node refused for its model. A model the product has not heard of is taken as
    soon as one node has it, in the cluster state or the request; a list with one known model is left to
    the filter (the trace replay's pods name models some clusters lack).

    Raises
    ------
    InvalidPodError
        Naming the unknown models and the ones known.
    """
    if demand.models is None:
        return
    known = set(KNOWN_MODELS) | set(view.table.models)
    if view.state is not None:
        known |= set(view.state.table.models)
    if demand.models and not demand.models & known:
        raise InvalidPodError(
            f"annotation {LABEL_MODEL}: {', '.join(sorted(demand.models))} is no GPU model a node of this cluster "
            f"has nor one the product knows (known: {', '.join(sorted(known))})"
        )
