"""The ``preempt`` verb: which of kube-scheduler's proposed evictions actually free GPUs for the pod.

kube-scheduler proposes, per candidate node, the lower-priority pods whose eviction would make the pod
fit by its own accounting. It cannot see what the extender owns: shares of a GPU
(it ignores ``gpu-scheduler.io/gpu-milli``), which GPU each share sits on, and the model
and memory annotations. Per candidate node this module:

- drops the node when the pod can never run there (the filter's unresolvable reasons: model, memory,
  too few GPUs, no GPU labels) or the cluster state does not know it;
- drops the victims known to hold no GPU on the node: evicting them frees nothing the extender
  accounts (CPU and memory are kube-scheduler's; if those still fall short, it preempts again on the
  next cycle);
- keeps the node only when the GPUs the victims free, added to what is free now, fit the pod;
- never returns a node with no victims.

A pod that requests no GPU needs only what kube-scheduler counts (CPU, memory): its proposal stands,
victims and all, on every node the cluster state knows.

What a victim holds comes from the GPU ledger by pod UID, else from the victim Pod object when
kube-scheduler sent full objects (its ``gpu-scheduler.io/assigned-gpus`` annotation, or its
``nvidia.com/gpu`` count as whole GPUs on unknown indices). A victim with none of these is
*unknown*: it is kept, and for a pod that asks for ``nvidia.com/gpu`` (which kube-scheduler does
account) the node is trusted on kube-scheduler's word; for a share, only known holdings count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import InvalidPodError
from scheduler_core.extender.view import NodeView, all_free
from scheduler_core.extender.wire import ExtenderPreemptionArgs, MetaVictims
from scheduler_core.k8s.annotations import Pairs, trusted_assigned_gpus
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION, GPU_RESOURCE, MILLI_PER_GPU, MILLI_RESOURCE
from scheduler_core.k8s.pod_requests import effective_requests
from scheduler_core.k8s.pods import PodDemand

Holdings = Mapping[str, Mapping[str, Pairs]]
"""Per node, per pod UID, the ``(gpu, milli)`` pairs the ledger says the pod holds there."""


@dataclass(frozen=True)
class Frees:
    """What evicting one victim frees on its node: exact pairs, whole GPUs on unknown indices, or unknown."""

    pairs: Pairs = ()
    whole: int = 0
    known: bool = True

    @property
    def nothing(self) -> bool:
        return self.known and not self.pairs and not self.whole


@dataclass(frozen=True)
class Candidate:
    """One node's proposal: victim UIDs in kube-scheduler's order, what each frees, and the PDB count."""

    node: str
    uids: tuple[str, ...]
    frees: tuple[Frees, ...]
    num_pdb_violations: int = 0


@dataclass(frozen=True)
class PreemptOutcome:
    """The accepted nodes with their (possibly fewer) victims, and why each other node was dropped."""

    kept: dict[str, MetaVictims]
    dropped: dict[str, str] = field(default_factory=dict)
    victims_in: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"NodeNameToMetaVictims": {node: victims.to_wire() for node, victims in self.kept.items()}}

    def summary(self) -> dict[str, Any]:
        return {
            "nodes_in": len(self.kept) + len(self.dropped),
            "nodes_kept": len(self.kept),
            "victims_in": self.victims_in,
            "victims_kept": sum(len(v.uids) for v in self.kept.values()),
            "dropped": dict(list(self.dropped.items())[:5]),
        }


def victim_frees(uid: str, node: str, holdings: Holdings, pod: Mapping[str, Any] | None = None) -> Frees:
    """What evicting ``uid`` frees on ``node`` (see the module docstring for the order of sources)."""
    held = holdings.get(node, {}).get(uid)
    if held is not None:
        return Frees(pairs=tuple(held))
    if pod is None:
        return Frees(known=False)
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    assigned = annotations.get(ASSIGNED_GPUS_ANNOTATION) if isinstance(annotations, Mapping) else None
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    try:
        whole, milli = effective_requests(spec, (GPU_RESOURCE, MILLI_RESOURCE))
        if assigned is not None:
            return Frees(pairs=trusted_assigned_gpus(assigned, spec.get("schedulerName"), whole, milli))
    except InvalidPodError:
        return Frees(known=False)
    if milli and milli % MILLI_PER_GPU:
        return Frees(known=False)  # a share whose GPU is not recorded
    return Frees(whole=whole + milli // MILLI_PER_GPU)


def proposed_nodes(args: ExtenderPreemptionArgs) -> list[str]:
    """The candidate nodes kube-scheduler proposes, in its order, in either form."""
    if args.node_name_to_victims is not None:
        return list(args.node_name_to_victims)
    return list(args.node_name_to_meta_victims or {})


def candidates(args: ExtenderPreemptionArgs, holdings: Holdings) -> list[Candidate]:
    """Each proposed node with what each of its victims frees (:func:`victim_frees`)."""
    pods_by_node: dict[str, tuple[Any, ...]] = {}
    if args.node_name_to_victims is not None:  # full objects (nodeCacheCapable: false)
        proposals = {node: victims.to_meta() for node, victims in args.node_name_to_victims.items()}
        pods_by_node = {node: victims.pods for node, victims in args.node_name_to_victims.items()}
    else:
        proposals = dict(args.node_name_to_meta_victims or {})
    found = []
    for node, meta in proposals.items():
        pods = pods_by_node.get(node) or (None,) * len(meta.uids)
        frees = tuple(victim_frees(uid, node, holdings, pod) for uid, pod in zip(meta.uids, pods, strict=True))
        found.append(Candidate(node, meta.uids, frees, meta.num_pdb_violations))
    return found


def decide_on_view(demand: PodDemand, proposed: Sequence[Candidate], view: NodeView) -> PreemptOutcome:
    """:func:`decide` with the free milli and the filter's unresolvable reasons of ``view``, the
    proposed nodes as the filter sees them."""
    result = view.filter(demand)
    free_milli = view.free_milli if view.free_milli is not None else all_free(view.table)
    free_by_node = dict(zip(view.table.names, free_milli, strict=True))
    return decide(demand, proposed, free_by_node, result.failed_unresolvable)


def decide(
    demand: PodDemand,
    candidates: Sequence[Candidate],
    free_milli: Mapping[str, npt.NDArray[np.int32]],
    unresolvable: Mapping[str, str],
) -> PreemptOutcome:
    """Keep the candidates where the victims free enough GPU for ``demand``.

    Parameters
    ----------
    free_milli : node name to free milli per GPU now (victims still running); a node missing here is
        not in the cluster state.
    unresolvable : node name to the filter's reason the pod can never run there.

    >>> free = {"a": np.array([0, 0, 1000, 1000], dtype=np.int32)}
    >>> c = Candidate("a", ("u1", "u2"), (Frees(pairs=((0, 1000), (1, 1000))), Frees()))
    >>> decide(PodDemand(gpus=4), [c], free, {}).to_wire()
    {'NodeNameToMetaVictims': {'a': {'Pods': [{'UID': 'u1'}], 'NumPDBViolations': 0}}}
    """
    kept: dict[str, MetaVictims] = {}
    dropped: dict[str, str] = {}
    for candidate in candidates:
        node = candidate.node
        if node in unresolvable:
            dropped[node] = f"the pod can never run here: {unresolvable[node]}"
            continue
        if node not in free_milli:
            dropped[node] = "node is not in the cluster state"
            continue
        if not demand.gpus and candidate.uids:
            kept[node] = MetaVictims(candidate.uids, candidate.num_pdb_violations)
            continue
        chosen = [(uid, frees) for uid, frees in zip(candidate.uids, candidate.frees, strict=True) if not frees.nothing]
        if not chosen:
            dropped[node] = "no victim holds a GPU here"
            continue
        after = free_milli[node].astype(np.int64).copy()
        whole_extra, unknown = 0, False
        for _uid, frees in chosen:
            for gpu, milli in frees.pairs:
                if gpu < after.shape[0]:
                    after[gpu] = min(MILLI_PER_GPU, after[gpu] + milli)
            whole_extra += frees.whole
            unknown |= not frees.known
        if not _fits(demand, after, whole_extra, unknown):
            dropped[node] = "evicting the victims does not free enough GPU for the pod"
            continue
        # kube-scheduler's PDB count is for its full set; fewer victims can only violate fewer, and
        # which ones were protected is not said, so the count is kept as an upper bound.
        kept[node] = MetaVictims(tuple(uid for uid, _ in chosen), candidate.num_pdb_violations)
    return PreemptOutcome(kept, dropped, sum(len(c.uids) for c in candidates))


def _fits(demand: PodDemand, after: npt.NDArray[np.int64], whole_extra: int, unknown: bool) -> bool:
    if demand.share:
        return bool((after >= demand.share).any()) or whole_extra > 0
    wholly_free = int(np.count_nonzero(after >= MILLI_PER_GPU)) + whole_extra
    if wholly_free >= demand.gpus:
        return True
    # kube-scheduler accounts nvidia.com/gpu itself: its proposal stands for victims the ledger lacks.
    return unknown and not demand.milli_managed
