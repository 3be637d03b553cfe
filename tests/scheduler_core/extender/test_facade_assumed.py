"""What the facade assumes before the cluster state shows it (the only node a filter keeps, prioritize's
best node, an assumed pod's CPU), for how long, and a state source that lags behind a deletion or a
node's GPUs."""

from collections.abc import Collection

from scheduler_core.extender.facade import Extender, ExtenderConfig
from scheduler_core.state.cluster import ClusterState
from tests.conftest import make_nodes, make_pod
from tests.scheduler_core.extender.conftest import body, call


def _with_uid(pod, uid):
    pod["metadata"]["uid"] = uid
    return pod


def test_the_only_node_a_filter_keeps_takes_the_pod_at_once_in_the_extenders_view():
    """kube-scheduler skips prioritize with one node left: that is where the pod goes, so the next pod
    sees it there before any watch or snapshot does."""
    from adapters.ledger_readings import LedgerReadings

    state = ClusterState.from_objects(make_nodes("A100", "T4"))
    readings = LedgerReadings()
    extender = Extender(cluster=lambda: state, readings=readings)
    _, reply = call(extender, "filter", body(_with_uid(make_pod("p", 3, models="T4"), "u-1"), names=["a100-0", "t4-1"]))
    assert reply["NodeNames"] == ["t4-1"]
    assert [(r.node, r.taken, r.uid) for r in readings.pending(None, assumed=True)] == [
        ("t4-1", ((0, 1000), (1, 1000), (2, 1000)), "u-1")
    ]
    _, scores = call(extender, "prioritize", body(make_pod("q", 1), names=["a100-0", "t4-1"]))
    assert {p["Host"]: p["Score"] for p in scores}["t4-1"] == 10  # one GPU left there: the best fit now


def test_prioritizes_one_best_node_is_assumed_and_a_tie_always_goes_to_the_same_node():
    from adapters.ledger_readings import LedgerReadings

    state = ClusterState.from_objects(make_nodes("A100", "A100", "A100"))
    readings = LedgerReadings()
    extender = Extender(cluster=lambda: state, readings=readings)
    names = ["a100-0", "a100-1", "a100-2"]
    first = call(extender, "prioritize", body(_with_uid(make_pod("p", 2), "u-1"), names=names))[1]
    again = call(Extender(cluster=lambda: state), "prioritize", body(make_pod("p", 2), names=names))[1]
    assert first == again  # every instance breaks the tie the same way
    winner = next(p["Host"] for p in first if p["Score"] == 10)
    assert sorted(p["Score"] for p in first) == [9, 9, 10]
    assert [(r.node, r.taken, r.uid) for r in readings.pending(None, assumed=True)] == [
        (winner, ((0, 1000), (1, 1000)), "u-1")
    ]
    # The next pod packs onto the assumed node: 6 GPUs left there, a better fit than 8.
    second = call(extender, "prioritize", body(_with_uid(make_pod("q", 2), "u-2"), names=names))[1]
    assert next(p["Host"] for p in second if p["Score"] == 10) == winner


def test_a_share_is_assumed_on_the_tightest_gpu_as_the_ledger_would_choose():
    from adapters.ledger_readings import LedgerReadings

    shares = [make_pod("s", 0, milli=600, node_name="t4-0", phase="Running")]
    shares[0]["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = "0:600"
    state = ClusterState.from_objects(make_nodes("T4"), shares)
    readings = LedgerReadings()
    extender = Extender(ExtenderConfig(share_policy="gpu_packing"), cluster=lambda: state, readings=readings)
    _, reply = call(extender, "filter", body(_with_uid(make_pod("p", 0, milli=300), "u-3"), names=["t4-0"]))
    assert reply["NodeNames"] == ["t4-0"]
    assert [(r.taken, r.uid) for r in readings.pending(None, assumed=True)] == [(((0, 300),), "u-3")]  # 100 left


def test_an_assumed_pods_cpu_counts_for_the_next_pod_before_the_state_shows_it():
    """fgd_cpu reads each node's free CPU. Pod 1 (1 GPU, 30 cores) goes to t4-0, where the typical pod
    (8 cores, 1 GPU) still fits after it; the state does not show it yet. Pod 2 (1 GPU, 5 cores) would
    then leave t4-0 4.81 cores and one GPU nobody typical can use: with pod 1's CPU assumed, t4-1 is
    the better node. Without the assumption the two look alike."""
    from adapters.ledger_readings import LedgerReadings

    typical = [make_pod(f"t{i}", 1, node_name=node, phase="Running") for i, node in enumerate(["t4-0", "t4-1", "t4-1"])]
    for pod in typical:
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "8"
    state = ClusterState.from_objects(make_nodes("T4", "T4"), typical)

    def pod(name, cpu):
        made = _with_uid(make_pod(name, 1), f"u-{name}")
        made["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
        return made

    names = ["t4-0", "t4-1"]
    readings = LedgerReadings()
    extender = Extender(cluster=lambda: state, readings=readings)
    first = {p["Host"]: p["Score"] for p in call(extender, "prioritize", body(pod("one", "30"), names=names))[1]}
    assert first["t4-0"] == 10 > first["t4-1"]
    assert [(r.node, r.cpu) for r in readings.pending(None, assumed=True)] == [("t4-0", 30_000)]
    second = {p["Host"]: p["Score"] for p in call(extender, "prioritize", body(pod("two", "5"), names=names))[1]}
    assert second["t4-1"] == 10 and second["t4-0"] < 9
    # The GPUs alone assumed (pod 1 holding no CPU): a tie, which the fixed order breaks.
    gpus_only = LedgerReadings()
    gpus_only.assume("t4-0", readings.pending(None, assumed=True)[0].taken, "u-one")
    blind = Extender(cluster=lambda: state, readings=gpus_only)
    assert sorted(p["Score"] for p in call(blind, "prioritize", body(pod("two", "5"), names=names))[1]) == [9, 10]


def test_without_assume_nothing_is_laid_over_the_state():
    from adapters.ledger_readings import LedgerReadings

    state = ClusterState.from_objects(make_nodes("T4"))
    readings = LedgerReadings()
    extender = Extender(ExtenderConfig(assume=False), cluster=lambda: state, readings=readings)
    call(extender, "filter", body(_with_uid(make_pod("p", 1), "u-4"), names=["t4-0"]))
    assert readings.pending(None, assumed=True) == []


class CatchingUpSource:
    """A cluster source behind on a deletion: ``catch_up`` brings the state in which it is, and says
    so (``adapters.live_state.LiveState`` does this on its watch)."""

    def __init__(self, before: ClusterState, after: ClusterState, *, behind: bool = True) -> None:
        self.states, self.behind, self.waited = [before, after], behind, []

    def __call__(self) -> ClusterState:
        return self.states[0]

    def catch_up(self, timeout_s: float, nodes: Collection[str] = (), *, node_facts: bool = False) -> bool:
        self.waited.append(timeout_s)
        self.nodes, self.node_facts = list(nodes), node_facts
        if not self.behind:
            return False
        self.states.pop(0)
        self.behind = False
        return True


def halves_on_t4(count: int) -> ClusterState:
    """t4-0 (4 GPUs) holding ``count`` half-GPU shares, two a GPU."""
    shares = []
    for i in range(count):
        pod = make_pod(f"half-{i}", 0, milli=500, node_name="t4-0", phase="Running")
        pod["metadata"]["annotations"]["gpu-scheduler.io/assigned-gpus"] = f"{i // 2}:500"
        shares.append(pod)
    return ClusterState.from_objects(make_nodes("T4"), shares)


def test_filter_refusing_a_node_for_shares_in_use_decides_again_once_a_lagging_source_caught_up():
    full, freed = halves_on_t4(8), halves_on_t4(7)
    source = CatchingUpSource(full, freed)
    status, reply = call(Extender(cluster=source), "filter", body(make_pod("p", 0, milli=500), names=["t4-0"]))
    assert status == 200 and reply["NodeNames"] == ["t4-0"] and source.waited == [0.25]
    assert source.nodes == ["t4-0"]  # the nodes refused for use: a deletion may be on its way to one
    # Nothing pending: the refusal stands, after one question.
    source = CatchingUpSource(full, freed, behind=False)
    status, reply = call(Extender(cluster=source), "filter", body(make_pod("p", 0, milli=500), names=["t4-0"]))
    assert reply["NodeNames"] == [] and "500 milli free" in reply["FailedNodes"]["t4-0"] and source.waited == [0.25]


def test_filter_does_not_wait_on_a_refusal_no_deletion_can_change():
    # The wrong model is unresolvable: no freed GPU makes it fit, so the source is not asked.
    state = ClusterState.from_objects(make_nodes("T4"), [])
    source = CatchingUpSource(state, state)
    _, reply = call(Extender(cluster=source), "filter", body(make_pod("p", 1, models="A100"), names=["t4-0"]))
    assert "t4-0" in reply["FailedAndUnresolvableNodes"] and source.waited == []


def test_a_node_whose_allocatable_gpus_the_state_has_not_caught_up_with_is_decided_again():
    """kube-scheduler sent the node, so its own count of nvidia.com/gpu passed: a state that says the node
    has too few is behind on it (a new node whose device plugin reported its GPUs after it registered).
    Filter waits for the node's change instead of refusing it as unresolvable, which would leave the pod
    waiting minutes for another event."""
    registered = make_nodes("H100")
    registered[0]["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    before, after = ClusterState.from_objects(registered, []), ClusterState.from_objects(make_nodes("H100"), [])
    source = CatchingUpSource(before, after)
    _, reply = call(Extender(cluster=source), "filter", body(make_pod("p", 8, models="H100"), names=["h100-0"]))
    assert reply["NodeNames"] == ["h100-0"] and source.node_facts and source.nodes == ["h100-0"]


def test_filter_never_refuses_a_node_for_what_a_request_predicted_and_prioritize_forgets_it_in_time():
    """A request body is input from the network: four filter calls for invented 999-milli pods on an
    empty T4 used to make a real 250-milli pod fail there. Predictions move prioritize's scores only,
    for at most ASSUMED_TTL_S, and at most MAX_ASSUMED are kept."""
    from adapters.ledger_readings import LedgerReadings
    from scheduler_core.state.readings import ASSUMED_TTL_S, MAX_ASSUMED

    now = [1000.0]
    state = ClusterState.from_objects(make_nodes("T4"))
    readings = LedgerReadings(clock=lambda: now[0])
    extender = Extender(ExtenderConfig(share_policy="gpu_packing"), cluster=lambda: state, readings=readings)
    for i in range(4):
        call(extender, "filter", body(_with_uid(make_pod(f"ghost-{i}", 0, milli=999), f"ghost-{i}"), names=["t4-0"]))
    assert len(readings.pending(None, assumed=True)) == 4 and readings.pending(None) == []
    _, reply = call(extender, "filter", body(_with_uid(make_pod("real", 0, milli=250), "real"), names=["t4-0"]))
    assert reply["NodeNames"] == ["t4-0"], reply
    now[0] += ASSUMED_TTL_S + 0.1
    assert readings.pending(None, assumed=True) == []
    for i in range(MAX_ASSUMED + 50):
        readings.assume("t4-0", (), f"cpu-only-{i}", 100_000_000)
    kept = readings.pending(None, assumed=True)
    assert len(kept) == MAX_ASSUMED and kept[0].uid == "cpu-only-50"  # the oldest went first
