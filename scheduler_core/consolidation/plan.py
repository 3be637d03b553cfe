"""Consolidation plans on a real cluster: which opted-in pods to move, and where, so that a Pending pod
of the profile that fits on no node gets one.

The planner is the simulator's (:func:`~scheduler_core.placement.moves.plan_moves`), given the cluster as
kube-scheduler counts it and the rules a real pod brings:

- the nodes are :class:`~scheduler_core.placement.model.Cluster` rows: free CPU (kube-scheduler's rule),
  free memory (requests, MiB), free milli per GPU (whole GPUs and shares, as the cluster state lays them
  out) and the GPU model. Nodes that are not Ready, cordoned, over a cap, under MIG, with GPUs DRA
  manages, or with more than :data:`~scheduler_core.placement.model.MAX_GPUS` GPUs take no part;
- only the pods :func:`~scheduler_core.consolidation.eligibility.why_not_movable` clears may move, each
  only to nodes its taints, node selector and required node affinity admit;
- a plan moves the fewest pods, then the cheapest by ``controller.kubernetes.io/pod-deletion-cost`` (what
  the deletion-cost refresher writes: the value lost when the pod goes), then the fewest GPUs;
- the Pending pods are taken oldest first, each planned on the cluster the earlier plans leave; a pod is
  moved at most once a run, and no plan moves more pods under one PodDisruptionBudget than it allows.

Pure: the objects in, a :class:`Consolidation` out. Nothing here evicts (``application/consolidation``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.consolidation.eligibility import (
    Budget,
    Owner,
    budgets_of,
    owner_of,
    unchecked_constraint,
    why_not_movable,
)
from scheduler_core.consolidation.live import MIB, LiveCluster
from scheduler_core.deletion_cost.policy import parse_cost
from scheduler_core.errors import InvalidArgsError
from scheduler_core.k8s.names import (
    DELETION_COST_ANNOTATION,
    MILLI_PER_GPU,
    PLACEHOLDER_NAMESPACE,
    RESERVATION_NAMESPACE,
    SCHEDULER_NAME,
    TERMINAL_PHASES,
)
from scheduler_core.k8s.pods import pod_demand
from scheduler_core.k8s.resources import pod_requests
from scheduler_core.placement.model import MAX_GPUS, Task
from scheduler_core.placement.moves import Placed, Plan, Rules, gpus_on, plan_emptying, plan_moves
from scheduler_core.state.allocation import PodUse

MAX_PENDING = 32
"""Pending pods looked at per run, oldest first (a run's move budget is far smaller)."""
MAX_MOVABLE = 5000
"""Movable pods considered per run; past it, the rest are left where they are (and counted)."""
MAX_MOVES = 100
"""The largest move budget a run or a plan may be given."""


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PlannedMove:
    """Evict ``pod`` from ``source``; its controller's replacement goes to ``destination``."""

    pod: PodRef
    owner: Owner
    source: str
    destination: str
    gpus: int
    """Whole GPUs the pod holds (1 for a share)."""
    milli: int
    """Milli of one GPU, for a share (0 for whole GPUs)."""
    cost: float
    """Its ``pod-deletion-cost`` (0 when it has none)."""
    reason: str


@dataclass(frozen=True)
class PodPlan:
    """The moves, in order, after which the Pending ``pod`` fits on ``node``, where it needs ``gpus`` GPUs."""

    pod: PodRef
    node: str
    gpus: int
    moves: tuple[PlannedMove, ...]

    @property
    def cost(self) -> float:
        return sum(move.cost for move in self.moves)


@dataclass(frozen=True)
class NodePlan:
    """The moves, in order, after which ``node`` holds no pod of the profile: an autoscaler may remove it."""

    node: str
    moves: tuple[PlannedMove, ...]

    @property
    def cost(self) -> float:
        return sum(move.cost for move in self.moves)


@dataclass(frozen=True)
class Consolidation:
    """A run's plans, why each other Pending pod has none, and why pods could not be moved; ``emptied``: the
    nodes it empties for scale-down (only when no pod is Pending)."""

    plans: tuple[PodPlan, ...] = ()
    emptied: tuple[NodePlan, ...] = ()
    waiting: Mapping[str, str] = field(default_factory=dict)
    """Pending pod (``namespace/name``) -> why no plan was made for it."""
    unmovable: Mapping[str, int] = field(default_factory=dict)
    """Reason -> how many running pods of the profile it kept in place."""
    movable: int = 0

    @property
    def moves(self) -> int:
        return sum(len(plan.moves) for plan in self.plans) + sum(len(node.moves) for node in self.emptied)


def plan_consolidation(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    pdbs: Sequence[Any] = (),
    *,
    max_moves: int,
    max_moves_per_plan: int,
    pending: Sequence[Mapping[str, Any]] | None = None,
    empty_nodes: int = 0,
) -> Consolidation:
    """Plans for the Pending pods of the profile (see the module docstring), at most ``max_moves`` moves
    in all and ``max_moves_per_plan`` for one pod; ``pending``: plan for these pods instead (``explain``).
    With ``empty_nodes`` and no pod Pending, plans that empty up to that many nodes (:meth:`_Planner.empty`).

    Raises
    ------
    InvalidArgsError
        A budget that is not a whole number in 0..:data:`MAX_MOVES`.
    """
    for name, value in (
        ("max_moves", max_moves), ("max_moves_per_plan", max_moves_per_plan), ("empty_nodes", empty_nodes)
    ):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_MOVES:
            raise InvalidArgsError(f"{name}: expected a whole number in 0..{MAX_MOVES}, got {value!r}")
    live = LiveCluster.of(nodes, pods)
    budgets = budgets_of(pdbs)
    planner = _Planner(live, budgets)
    unmovable = planner.load(pods)
    waiting: dict[str, str] = {}
    plans: list[PodPlan] = []
    left = max_moves
    waiting_pods = pending_pods(pods) if pending is None else list(pending)
    for pod in waiting_pods[:MAX_PENDING]:
        ref = _ref(pod)
        if left == 0:
            waiting[ref.key] = "this run's move budget is spent"
            continue
        found, why = planner.plan_for(pod, min(max_moves_per_plan, left))
        if found is None:
            waiting[ref.key] = why
            continue
        plans.append(found)
        left -= len(found.moves)
    emptied = planner.empty(empty_nodes, left, max_moves_per_plan) if empty_nodes and not waiting_pods else ()
    return Consolidation(tuple(plans), tuple(emptied), waiting, dict(unmovable), len(planner.pods))


def consolidation_hint(
    pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], budget: int
) -> str:
    """What ``explain`` says of a pod no node fits: the plan of at most ``budget`` moves that would place it
    (each move, its reason and cost), or why there is none.

    >>> from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
    >>> consolidation_hint(make_pod("p", 9), [make_node("n", CATALOGUE[0], "z")], [], 2)
    'consolidation: no plan: it asks for 9 GPUs, more than any node the planner knows (8)'
    """
    found = plan_consolidation(nodes, pods, max_moves=budget, max_moves_per_plan=budget, pending=[pod])
    if not found.plans:
        return f"consolidation: no plan: {next(iter(found.waiting.values()), 'nothing to plan for')}"
    plan = found.plans[0]
    moves = "; ".join(
        f"{m.pod.key} ({m.owner.kind}/{m.owner.name}) {m.source} -> {m.destination}, cost {m.cost:g}"
        for m in plan.moves
    )
    return f"consolidation: {len(plan.moves)} move(s) would place it on {plan.node}: {moves}"


def pending_pods(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods of the profile that kube-scheduler tried and found no node for (``PodScheduled=False``,
    reason ``Unschedulable``), not the product's own placeholders, oldest first."""
    found = []
    for pod in pods:
        metadata, spec, status = _mapping(pod.get("metadata")), _mapping(pod.get("spec")), _mapping(pod.get("status"))
        if (
            spec.get("schedulerName") != SCHEDULER_NAME or spec.get("nodeName") or metadata.get("deletionTimestamp")
            or status.get("phase") in TERMINAL_PHASES
            or metadata.get("namespace") in (PLACEHOLDER_NAMESPACE, RESERVATION_NAMESPACE)
        ):  # fmt: skip
            continue
        conditions = status.get("conditions") or []
        if any(
            isinstance(c, Mapping) and c.get("type") == "PodScheduled" and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
            for c in conditions
        ):  # fmt: skip
            found.append(pod)
    found.sort(key=lambda p: (str(_mapping(p.get("metadata")).get("creationTimestamp") or ""), _ref(p).key))
    return found


@dataclass
class _Movable:
    pod: Mapping[str, Any]
    ref: PodRef
    owner: Owner
    row: int
    task: Task
    cost: float


class _Planner:
    """The cluster a run plans on, changed by each plan it keeps."""

    def __init__(self, live: LiveCluster, budgets: Sequence[Budget]) -> None:
        self.live, self.budgets = live, budgets
        self.placed = Placed(live.cluster.n_nodes)
        self.pods: dict[int, _Movable] = {}
        self.where: dict[int, npt.NDArray[np.bool_]] = {}
        self.disrupted: Counter[str] = Counter()
        self.bound_on: Counter[int] = Counter()
        """Per row, the pods bound there that an emptied node must lose (not DaemonSets', not reservations)."""
        self.touched: set[int] = set()
        """Rows this run's plans free, fill or move pods off: none of them is emptied."""
        self.targets: set[int] = set()
        """Rows this run's plans freed for their Pending pod: no later plan moves a pod onto one (its hold
        keeps counting the pod's GPUs until it lapses)."""

    def load(self, pods: Sequence[Mapping[str, Any]]) -> Counter[str]:
        """Put each movable bound pod of the profile in :attr:`placed`; count the others by reason."""
        unmovable: Counter[str] = Counter()
        index = {name: row for row, name in enumerate(self.live.names)}
        whole_taken: Counter[int] = Counter()
        for position, use in self.live.uses.items():
            pod = pods[position]
            # Every pod but a DaemonSet's and a reservation pod (those have no kind) keeps its node from emptying.
            if (use.kind is not None or use.problem) and use.node in index:
                self.bound_on[index[use.node]] += 1
            if _mapping(pod.get("spec")).get("schedulerName") != SCHEDULER_NAME:
                continue
            why = why_not_movable(pod, self.budgets) or _readable(use, position in self.live.requested)
            row = index.get(use.node)
            if not why and (row is None or not self.live.open[row]):
                why = "on a node the planner leaves alone"
            if not why and len(self.pods) >= MAX_MOVABLE:
                why = f"past the {MAX_MOVABLE} movable pods a run considers"
            gpus = () if why or row is None else self._gpus_of(use, row, whole_taken)
            if gpus is None:
                why = "its GPUs on the node are not known"
            if why:
                unmovable[_category(why)] += 1
                continue
            assert row is not None
            assert gpus is not None
            try:
                self._add(position, pod, use, row, gpus)
            except ValueError as exc:  # InvalidPodError: an annotation or a request that cannot be read
                unmovable[_category(f"its requests cannot be read: {exc}")] += 1
        return unmovable

    def _gpus_of(self, use: PodUse, row: int, whole_taken: Counter[int]) -> tuple[int, ...] | None:
        """The GPUs a pod holds on ``row``: a share's from its annotation; whole GPUs are interchangeable,
        so the next busy GPUs that carry no share."""
        count = int(self.live.cluster.gpu_count[row])
        if use.assigned and any(not 0 <= gpu < count for gpu, _ in use.assigned):
            return None  # an index the node does not have: nothing to free there
        if use.milli:
            return tuple(gpu for gpu, _ in use.assigned) if use.assigned and len(use.assigned) == 1 else None
        if not use.gpus:
            return ()
        if use.assigned and len(use.assigned) == use.gpus:  # bound by the extender: it says which
            return tuple(gpu for gpu, _ in use.assigned)
        left = self.live.cluster.gpu_left[row]
        busy = [g for g in range(count) if left[g] == 0 and g not in self.live.annotated[row]]
        start = whole_taken[row]
        whole_taken[row] += use.gpus
        taken = busy[start : start + use.gpus]
        return tuple(taken) if len(taken) == use.gpus else None

    def _add(self, position: int, pod: Mapping[str, Any], use: PodUse, row: int, gpus: tuple[int, ...]) -> None:
        demand = pod_demand(pod)
        memory = self.live.requested[position]  # load() checked it is there
        self.where[position] = self.live.allowed(pod)
        milli = use.milli if use.milli else MILLI_PER_GPU
        task = Task(use.cpu, -(-memory // MIB), len(gpus) if use.gpus or use.milli else 0, milli if gpus else 0,
                    demand.models)  # fmt: skip
        metadata = _mapping(pod.get("metadata"))
        cost = float(parse_cost(_mapping(metadata.get("annotations")).get(DELETION_COST_ANNOTATION)) or 0)
        owner = owner_of(pod)
        assert owner is not None  # why_not_movable checked it
        self.pods[position] = _Movable(pod, _ref(pod), owner, row, task, cost)
        self.placed.add(position, row, task, gpus)

    def plan_for(self, pod: Mapping[str, Any], budget: int) -> tuple[PodPlan | None, str]:
        """A plan for the Pending ``pod`` of at most ``budget`` moves, kept (the cluster changed as it
        says), or None and why."""
        try:
            task = _pending_task(pod)
        except ValueError as exc:
            return None, f"its requests cannot be read: {exc}"
        if isinstance(task, str):
            return None, task
        cluster = self.live.cluster
        targets = self.live.allowed(pod)
        if (cluster.feasible(task) & targets).any():
            return None, "it fits on a node now: kube-scheduler will place it"
        costs = {arrival: self.pods[arrival].cost for arrival in self.placed.node_of}
        rules = Rules(costs, self.where, targets, frozenset(self.targets))
        plan = plan_moves(cluster, self.placed, self.live.workload, task, budget, rules)
        if plan is None:
            return None, f"no plan of at most {budget} moves frees what it needs on a node it may use"
        over = self._over_budget(plan)
        if over:
            return None, f"the cheapest plan moves more pods than PodDisruptionBudget {over} allows"
        return self._keep(pod, task, plan), ""

    def _over_budget(self, plan: Plan) -> str:
        wanted: Counter[str] = Counter()
        for move in plan.moves:
            for budget in self.budgets:
                if budget.selects(self.pods[move.arrival].pod):
                    wanted[budget.key] += 1
        for budget in self.budgets:
            if wanted[budget.key] and self.disrupted[budget.key] + wanted[budget.key] > budget.allowed:
                return budget.key
        self.disrupted.update(wanted)
        return ""

    def _keep(self, pod: Mapping[str, Any], task: Task, plan: Plan) -> PodPlan:
        cluster, names, ref = self.live.cluster, self.live.names, _ref(pod)
        moves = self._apply(
            plan,
            lambda src: (
                f"makes room on {names[src]} for "
                + (ref.key if src == plan.target else f"a pod this plan moves to {names[src]}")
            ),
        )
        cluster.place(plan.target, task, gpus_on(cluster, task, plan.target))
        self.targets.add(plan.target)
        return PodPlan(ref, names[plan.target], task.num_gpu, moves)

    def _apply(self, plan: Plan, reason: Callable[[int], str]) -> tuple[PlannedMove, ...]:
        """Carry ``plan``'s moves out on the run's cluster; each as a :class:`PlannedMove` with its
        ``reason`` (of the node it leaves)."""
        cluster, names = self.live.cluster, self.live.names
        moves = []
        for move in plan.moves:
            moved = self.pods[move.arrival]
            cluster.release(move.src, move.task, move.src_gpus)
            cluster.place(move.dst, move.task, move.dst_gpus)
            self.placed.take(move.arrival)  # a pod moves at most once a run
            self.touched |= {plan.target, move.src, move.dst}
            moves.append(PlannedMove(
                moved.ref, moved.owner, names[move.src], names[move.dst],
                move.task.num_gpu, move.task.gpu_milli if move.task.sharing else 0, moved.cost,
                reason(move.src),
            ))  # fmt: skip
        return tuple(moves)

    def empty(self, most: int, budget: int, per_node: int) -> list[NodePlan]:
        """Plans that empty up to ``most`` GPU nodes, at most ``budget`` moves in all and ``per_node`` for
        one: nodes whose every pod
        (DaemonSets' and reservations aside) may move and has somewhere to go, no node this run's other
        plans touched, the fewest pods first, then the cheapest."""
        cluster, placed, names = self.live.cluster, self.placed, self.live.names
        costs = {arrival: self.pods[arrival].cost for arrival in placed.node_of}
        rules = Rules(costs, self.where)
        candidates = [
            row for row in np.flatnonzero(self.live.open & (cluster.gpu_count > 0)).tolist()
            if placed.on[row] and len(placed.on[row]) == self.bound_on[row] and row not in self.touched
        ]  # fmt: skip
        candidates.sort(key=lambda row: (len(placed.on[row]), sum(costs[a] for a in placed.on[row]), row))
        emptied: list[NodePlan] = []
        for row in candidates:
            if len(emptied) == most or budget == 0:
                break
            if row in self.touched:  # an earlier plan of this run moved pods onto it
                continue
            cap = min(per_node, budget)
            plan = plan_emptying(cluster, placed, self.live.workload, row, cap, rules, frozenset(self.touched))
            if plan is None or self._over_budget(plan):
                continue
            budget -= len(plan.moves)
            self.touched.add(row)
            emptied.append(NodePlan(names[row], self._apply(plan, partial(_emptying, names[row]))))
        return emptied


def _emptying(node: str, _src: int) -> str:
    return f"empties {node} for scale-down"


def _pending_task(pod: Mapping[str, Any]) -> Task | str:
    """The Pending pod as a :class:`Task`, or why it is not planned for."""
    demand = pod_demand(pod)
    if not demand.wants_gpu:
        return "it asks for no GPU: the consolidator makes room for GPU pods only"
    if demand.mig:
        return "it asks for MIG slices, which the planner does not move"
    unchecked = unchecked_constraint(_mapping(pod.get("spec")))
    if unchecked:
        return f"it has {unchecked}: left to kube-scheduler, which the planner cannot check for it"
    if _mapping(pod.get("spec")).get("resourceClaims"):
        return "it asks for DRA claims, which the planner does not model"
    if demand.gpus > MAX_GPUS:
        return f"it asks for {demand.gpus} GPUs, more than any node the planner knows ({MAX_GPUS})"
    request = pod_requests(pod)
    milli = demand.share or (MILLI_PER_GPU if demand.gpus else 0)
    return Task(int(request[0]), -(-int(request[1]) // MIB), demand.gpus, milli, demand.models)


def _readable(use: PodUse, memory_read: bool) -> str:
    if use.problem or use.cpu_problem:
        return f"its requests cannot be read: {use.problem or use.cpu_problem}"
    return "" if memory_read else "its requests cannot be read: memory"


def _category(why: str) -> str:
    """A reason without the names in it, to count pods by (``PodDisruptionBudget ns/x allows...``)."""
    if why.startswith("PodDisruptionBudget "):
        return "a PodDisruptionBudget allows no disruption"
    for prefix in ("its requests cannot be read", "a spec that cannot be read"):
        if why.startswith(prefix):
            return prefix
    return why


def _ref(pod: Mapping[str, Any]) -> PodRef:
    metadata = _mapping(pod.get("metadata"))
    return PodRef(str(metadata.get("namespace") or ""), str(metadata.get("name") or ""), str(metadata.get("uid") or ""))


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
