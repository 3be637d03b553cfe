import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_core.errors import InvalidPodError
from scheduler_core.extender.explain import explain
from scheduler_core.extender.facade import Extender, ExtenderConfig
from scheduler_core.extender.wire import ExtenderArgs
from scheduler_core.k8s.annotations import Peer, parse_peers
from scheduler_core.k8s.pods import pod_demand
from scheduler_core.scoring.locality import (
    AppIndex,
    LocalitySettings,
    PeerPlacement,
    index_apps,
    locality_scores,
    peer_placement,
)
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.snapshot import build_snapshot, read_snapshot, write_snapshot
from testing.reference import reference_locality
from tests.conftest import make_nodes, make_pod


def app_pod(name, app, node, gpus=0, key="app"):
    pod = make_pod(name, gpus, node_name=node, phase="Running")
    pod["metadata"]["labels"] = {key: app}
    return pod


def peer_pod(name, peers, gpus=1):
    pod = make_pod(name, gpus)
    pod["metadata"]["annotations"]["gpu-scheduler.io/peers"] = peers
    return pod


# nodes: a100-0 (zone a), t4-1 (zone b), a100-2 (zone c), t4-3 (zone a)
NODES = make_nodes("A100", "T4", "A100", "T4")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("app=feature-store:3,app=redis:1", [("app=feature-store", 3.0), ("app=redis", 1.0)], id="compact"),
        pytest.param(" app=redis ", [("app=redis", 1.0)], id="weight defaults to one"),
        pytest.param('{"app=redis": 2}', [("app=redis", 2.0)], id="JSON object"),
        pytest.param(
            '[{"selector": "app.kubernetes.io/name=db", "weight": 0.5}]',
            [("app.kubernetes.io/name=db", 0.5)],
            id="JSON list",
        ),
    ],
)
def test_peers_annotation_forms(text, expected):
    assert [(p.selector, p.weight) for p in parse_peers(text)] == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "expected selectors", id="empty"),
        pytest.param("redis", "'redis' is not a key=value selector", id="no equals sign"),
        pytest.param("app=redis:lots", "weight 'lots' of 'app=redis' must be a number", id="bad weight"),
        pytest.param("app=redis:0", "weight '0' of 'app=redis'", id="zero weight"),
        pytest.param("app=redis:1e9", "weight '1e9'", id="huge weight"),
        pytest.param("app=re dis", "'re dis' in 'app=re dis' is not a label value", id="bad value"),
        pytest.param("-app=x", "'-app' in '-app=x' is not a label key", id="bad key"),
        pytest.param("[1, 2]", "JSON must be an object or a list of objects", id="JSON of the wrong shape"),
        pytest.param("{nope", "not valid JSON", id="broken JSON"),
        pytest.param(",".join(f"app=s{i}" for i in range(40)), "at most 32 peers", id="too many"),
    ],
)
def test_malformed_peers_are_pod_errors_naming_the_part(text, message):
    with pytest.raises(InvalidPodError, match=message):
        parse_peers(text)


def test_pod_demand_carries_peers():
    assert pod_demand(peer_pod("p", "app=redis:2")).peers == (Peer("app", "redis", 2.0),)


def test_apps_are_indexed_per_node_and_zone_under_every_configured_key():
    pods = [
        app_pod("r1", "redis", "a100-0"),
        app_pod("r2", "redis", "t4-3"),
        app_pod("r3", "redis", "t4-1"),
        app_pod("d", "db", "a100-2", key="app.kubernetes.io/name"),
    ]
    state = ClusterState.from_objects(NODES, pods)
    apps = state.apps
    assert apps.apps == ("app.kubernetes.io/name=db", "app=redis")
    assert apps.node_counts("app=redis", 4).tolist() == [1, 1, 0, 1]
    assert apps.zone_counts[apps.app_id("app=redis")].tolist() == [2, 1, 0]
    snapshot = read_snapshot(write_snapshot(build_snapshot(NODES, pods, cluster="c", generated_at=0.0)))
    assert snapshot.apps.apps == apps.apps
    assert np.array_equal(snapshot.apps.node_entries, apps.node_entries)


def test_scores_on_a_hand_built_cluster():
    # redis: 2 pods on a100-0 (zone a), 2 pods on t4-1 (zone b). Candidates: all four nodes.
    pods = [app_pod(f"r{i}", "redis", node) for i, node in enumerate(["a100-0", "a100-0", "t4-1", "t4-1"])]
    state = ClusterState.from_objects(NODES, pods)
    placement = peer_placement(state.apps, state.table.zones, [Peer("app", "redis")], np.arange(4))
    scores = locality_scores(placement, state.table.zone_id)
    # a100-0: 2 of 4 on the node (0.5); t4-1 likewise; a100-2 in zone c: 0; t4-3 in zone a: 2 of 4 at alpha.
    assert scores.tolist() == pytest.approx([0.5, 0.5, 0.0, 0.25])


def test_a_zone_pair_table_replaces_the_steps():
    placement = PeerPlacement(
        np.array([[0.0, 0.0]]), np.array([[0.0, 4.0]]), np.array([4.0]), np.array([1.0]), ("a", "b")
    )
    table = LocalitySettings(zone_values={"a": {"b": 0.2}, "b": {"b": 0.9}})
    assert locality_scores(placement, [0, 1], table).tolist() == pytest.approx([0.2, 0.9])


def test_peers_with_no_pods_and_pods_without_peers_change_nothing():
    state = ClusterState.from_objects(NODES, [])
    placement = peer_placement(state.apps, state.table.zones, [Peer("app", "ghost")], np.arange(4))
    assert locality_scores(placement, state.table.zone_id).tolist() == [0.0] * 4
    extender = Extender(cluster=lambda: state)
    with_peers = extender.prioritize(ExtenderArgs(pod=peer_pod("p", "app=ghost"), node_names=["a100-0", "t4-1"]))
    without = extender.prioritize(ExtenderArgs(pod=make_pod("p", 1), node_names=["a100-0", "t4-1"]))
    assert with_peers.values == without.values


@st.composite
def clusters(draw):
    n_nodes = draw(st.integers(1, 12))
    zones = draw(st.lists(st.integers(-1, 2), min_size=n_nodes, max_size=n_nodes))
    n_peers = draw(st.integers(1, 4))
    peers = []
    for _ in range(n_peers):
        by_node = {row: draw(st.integers(0, 3)) for row in range(n_nodes) if draw(st.booleans())}
        by_zone: dict[int, int] = {}
        for row, pods in by_node.items():
            if zones[row] >= 0:
                by_zone[zones[row]] = by_zone.get(zones[row], 0) + pods
        peers.append((draw(st.floats(0.1, 10)), by_node, by_zone))
    candidates = draw(st.lists(st.integers(-1, n_nodes - 1), min_size=1, max_size=8))
    alpha = draw(st.floats(0, 1))
    return n_nodes, zones, peers, candidates, alpha


@settings(max_examples=200, deadline=None)
@given(clusters())
def test_vectorised_locality_equals_reference(data):
    _, zones, peers, candidates, alpha = data
    node_counts = np.array(
        [[by_node.get(row, 0) if row >= 0 else 0 for row in candidates] for _, by_node, _ in peers], float
    )
    zone_counts = np.array([[by_zone.get(z, 0) for z in range(3)] for _, _, by_zone in peers], float)
    totals = np.array([sum(by_node.values()) for _, by_node, _ in peers], float)
    weights = np.array([w for w, _, _ in peers])
    placement = PeerPlacement(node_counts, zone_counts, totals, weights, ("a", "b", "c"))
    candidate_zones = [zones[row] if row >= 0 else -1 for row in candidates]
    got = locality_scores(placement, candidate_zones, LocalitySettings(zone_alpha=alpha))
    matrix = (np.eye(3) * alpha).tolist()
    assert got.tolist() == pytest.approx(reference_locality(peers, candidates, candidate_zones, matrix))


def test_locality_moves_the_gpu_score_and_explain_shows_it():
    pods = [app_pod("f", "feature-store", "a100-2")]
    state = ClusterState.from_objects(NODES, pods)
    pod = peer_pod("p", "app=feature-store", gpus=8)
    scored = Extender(cluster=lambda: state).prioritize(ExtenderArgs(pod=pod, node_names=["a100-0", "a100-2"]))
    assert dict(zip(scored.hosts, scored.values, strict=True)) == {"a100-0": 6, "a100-2": 10}
    rows = {r.node: r for r in explain(Extender(cluster=lambda: state), pod).nodes}
    assert rows["a100-2"].locality == 1.0 and rows["a100-0"].locality == 0.0


def test_unindexed_peer_keys_are_refused_with_the_allowed_keys():
    extender = Extender(
        ExtenderConfig(locality=LocalitySettings(label_keys=("app",))), cluster=lambda: ClusterState.from_objects(NODES)
    )
    outcome = extender.filter(ExtenderArgs(pod=peer_pod("p", "tier=cache"), node_names=["a100-0"]))
    assert "label key 'tier' (in 'tier=cache') is not indexed; use one of app" in outcome.error


def test_empty_index_is_well_formed():
    apps = AppIndex.empty(3)
    assert apps.node_counts("app=x", 2).tolist() == [0, 0]
    assert index_apps(ClusterState.from_objects(NODES).table, []).apps == ()
    assert json.dumps(list(apps.apps)) == "[]"


def test_a_pod_with_peers_also_counts_its_own_workload():
    settings = LocalitySettings()
    peers = (Peer("app", "redis", 2.0), Peer("app", "db", 1.0))
    assert settings.with_self(peers, {"app": "api"})[-1] == Peer("app", "api", 3.0)
    assert settings.with_self(peers, {"team": "x"}) == peers, "no indexed label: nothing to add"
    assert settings.with_self((), {"app": "api"}) == (), "no peers: locality stays off"
    assert LocalitySettings(self_weight=0).with_self(peers, {"app": "api"}) == peers
    assert settings.with_self((Peer("app", "api"),), {"app": "api"}) == (Peer("app", "api"),), "not twice"


def test_own_workload_pulls_replicas_together():
    pods = [app_pod("api-0", "api", "t4-1")]
    state = ClusterState.from_objects(NODES, pods)
    pod = peer_pod("api-1", "app=redis", gpus=0)  # redis has no pods yet
    pod["metadata"]["labels"] = {"app": "api"}
    names = ["a100-0", "t4-1", "a100-2"]
    with_self = Extender(cluster=lambda: state).prioritize(ExtenderArgs(pod=pod, node_names=names))
    assert dict(zip(with_self.hosts, with_self.values, strict=True)) == {"a100-0": 0, "t4-1": 10, "a100-2": 0}
    off = Extender(ExtenderConfig(locality=LocalitySettings(self_weight=0)), cluster=lambda: state)
    assert off.prioritize(ExtenderArgs(pod=pod, node_names=names)).values == [0, 0, 0]
