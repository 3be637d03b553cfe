"""How much cross-zone traffic locality scoring saves, on a synthetic microservice graph.

The model (``gpu-scheduler simulate-locality``):

- **Graph.** Services come in groups (an application's call chain). Services in a group talk with
  probability 0.6 and heavy traffic (lognormal, median e^2), services of different groups with
  probability 0.04 and light traffic (median 1). Each service has 2-8 replicas and names the services
  it talks to in ``gpu-scheduler.io/peers``, weighted by traffic.
- **Cluster.** ``n_zones`` zones of ``nodes_per_zone`` nodes with ``slots_per_node`` pod slots.
- **Traffic.** A replica spreads its requests evenly over the peer's replicas (kube-proxy's random
  choice, no topology-aware routing), so the cross-zone share of the traffic between services s and t
  is ``1 - sum_z p_s(z) p_t(z)``, where ``p_s(z)`` is the share of s's replicas in zone z.
- **Arrivals.** Services arrive in random order; each one's replicas are placed one after another.
- **Policies.** All keep only nodes with a free slot (the filter), then pick the best score, ties at
  random:

  - ``spread``: kube-scheduler's default profile as it scores these pods. PodTopologySpread with the
    cluster-default constraints (zone maxSkew 5 and hostname maxSkew 3, ScheduleAnyway) counts
    matching pods of the same service per domain, weighted by log(domains + 2), normalised to 0..100
    the plugin's way (fewest matching pods best), weight 2; NodeResourcesFit LeastAllocated (free
    slots / slots x 100), weight 1.
  - ``random``: any node with a free slot.
  - ``ours``: ``spread`` plus the extender: weight x 10 x our 0..10 locality score, exactly as
    kube-scheduler adds an extender's prioritize score. The locality score is
    :func:`scheduler_core.scoring.locality.locality_scores`, the code the extender runs.

Reported per policy: the traffic-weighted cross-zone fraction; zone imbalance (largest zone's pods
over the mean, minus 1); and how many multi-replica services ended up in a single zone (their
exposure to a zone outage), since pulling peers together trades against spreading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.scoring.gpu_score import normalize_scores
from scheduler_core.scoring.locality import LocalitySettings, PeerPlacement, locality_scores

POLICIES = ("spread", "random", "ours")
SPREAD_WEIGHT = 2  # PodTopologySpread in the default profile
FIT_WEIGHT = 1  # NodeResourcesFit in the default profile
ZONE_MAX_SKEW, HOST_MAX_SKEW = 5, 3  # kube-scheduler's default topology spread constraints


@dataclass(frozen=True)
class MicroserviceGraph:
    """``replicas`` shape (n_services,); ``traffic`` shape (n_services, n_services), symmetric."""

    replicas: npt.NDArray[np.int64]
    traffic: npt.NDArray[np.float64]
    group: npt.NDArray[np.int64]


@dataclass(frozen=True)
class SimCluster:
    n_zones: int = 3
    nodes_per_zone: int = 10
    slots_per_node: int = 12

    @property
    def n_nodes(self) -> int:
        return self.n_zones * self.nodes_per_zone

    @property
    def zone_of(self) -> npt.NDArray[np.intp]:
        return np.arange(self.n_nodes, dtype=np.intp) % self.n_zones


def synthetic_graph(n_services: int, rng: np.random.Generator, group_size: int = 5) -> MicroserviceGraph:
    """A clustered call graph: heavy traffic inside groups of ``group_size``, light across them."""
    group = np.arange(n_services) // group_size
    same = group[:, None] == group[None, :]
    talk = np.where(same, rng.random((n_services, n_services)) < 0.6, rng.random((n_services, n_services)) < 0.04)
    volume = np.where(
        same, rng.lognormal(2.0, 0.5, (n_services, n_services)), rng.lognormal(0.0, 0.5, (n_services, n_services))
    )
    traffic = np.triu(np.where(talk, volume, 0.0), k=1)
    traffic = traffic + traffic.T
    replicas = rng.integers(2, 9, size=n_services)
    return MicroserviceGraph(replicas=replicas, traffic=traffic, group=group)


def _spread_scores(
    node_pods: npt.NDArray[np.int64],
    zone_pods: npt.NDArray[np.int64],
    cluster: SimCluster,
    candidates: npt.NDArray[np.intp],
) -> npt.NDArray[np.float64]:
    """PodTopologySpread's score (0..100) for one service's next pod on each candidate."""
    zone_weight = np.log(cluster.n_zones + 2)
    host_weight = np.log(cluster.n_nodes + 2)
    raw = zone_weight * zone_pods[cluster.zone_of[candidates]] + host_weight * node_pods[candidates]
    top, bottom = raw.max(), raw.min()
    if top == 0:
        return np.full(candidates.size, 100.0)
    # The plugin's NormalizeScore: fewer matching pods scores higher.
    score: npt.NDArray[np.float64] = 100.0 * (top + bottom - raw) / top
    return score


def place(
    graph: MicroserviceGraph,
    cluster: SimCluster,
    policy: str,
    rng: np.random.Generator,
    *,
    extender_weight: float = 2.0,
    settings: LocalitySettings | None = None,
) -> npt.NDArray[np.int64]:
    """Place every replica; return pods per service per node, shape (n_services, n_nodes)."""
    if policy not in POLICIES:
        raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {policy!r}")
    settings = settings or LocalitySettings()
    n_services = graph.replicas.size
    counts = np.zeros((n_services, cluster.n_nodes), dtype=np.int64)
    used = np.zeros(cluster.n_nodes, dtype=np.int64)
    zone_of = cluster.zone_of
    for service in rng.permutation(n_services).tolist():
        peers = np.flatnonzero(graph.traffic[service])
        weights = graph.traffic[service, peers]
        if peers.size and settings.self_weight > 0:  # LocalitySettings.with_self, by service index
            peers, weights = np.append(peers, service), np.append(weights, settings.self_weight * weights.sum())
        for _ in range(int(graph.replicas[service])):
            candidates = np.flatnonzero(used < cluster.slots_per_node)
            if candidates.size == 0:
                raise ValueError("the simulated cluster is full; give it more nodes or slots")
            if policy == "random":
                choice = int(rng.choice(candidates))
            else:
                zone_pods = np.bincount(zone_of, weights=counts[service], minlength=cluster.n_zones)
                score = SPREAD_WEIGHT * _spread_scores(counts[service], zone_pods.astype(np.int64), cluster, candidates)
                score += FIT_WEIGHT * 100.0 * (cluster.slots_per_node - used[candidates]) / cluster.slots_per_node
                if policy == "ours" and peers.size:
                    peer_counts = counts[peers].astype(np.float64)
                    zone_counts = np.stack(
                        [np.bincount(zone_of, weights=row, minlength=cluster.n_zones) for row in peer_counts]
                    ).astype(np.float64)
                    placement = PeerPlacement(
                        peer_counts[:, candidates],
                        zone_counts,
                        peer_counts.sum(axis=1),
                        weights,
                        tuple(str(z) for z in range(cluster.n_zones)),
                    )
                    local = locality_scores(placement, zone_of[candidates], settings)
                    score += extender_weight * 10 * normalize_scores(local)
                best = np.flatnonzero(score == score.max())
                choice = int(candidates[rng.choice(best)])
            counts[service, choice] += 1
            used[choice] += 1
    return counts


def cross_zone_fraction(graph: MicroserviceGraph, counts: npt.NDArray[np.int64], cluster: SimCluster) -> float:
    """Traffic-weighted share of requests that cross zones (see the module docstring)."""
    zone_pods = np.stack([np.bincount(cluster.zone_of, weights=row, minlength=cluster.n_zones) for row in counts])
    share = zone_pods / np.maximum(zone_pods.sum(axis=1, keepdims=True), 1)
    same_zone = share @ share.T  # (n_services, n_services): chance a request stays in its zone
    total = graph.traffic.sum()
    return float((graph.traffic * (1.0 - same_zone)).sum() / total) if total > 0 else 0.0


def zone_imbalance(counts: npt.NDArray[np.int64], cluster: SimCluster) -> float:
    """Largest zone's pods over the mean zone's, minus 1 (0 is perfectly even)."""
    load = np.bincount(cluster.zone_of, weights=counts.sum(axis=0), minlength=cluster.n_zones)
    return float(load.max() / load.mean() - 1.0) if load.sum() else 0.0


def single_zone_services(counts: npt.NDArray[np.int64], cluster: SimCluster) -> int:
    """Services with two or more replicas, all in one zone."""
    zone_pods = np.stack([np.bincount(cluster.zone_of, weights=row, minlength=cluster.n_zones) for row in counts])
    multi = counts.sum(axis=1) >= 2
    return int(((zone_pods > 0).sum(axis=1)[multi] == 1).sum())


def simulate_locality(
    n_services: int = 30, n_zones: int = 3, seed: int = 1, runs: int = 10, extender_weight: float = 2.0
) -> dict[str, Any]:
    """Every policy on ``runs`` graphs (seeds ``seed`` ..); means and per-run figures."""
    cluster = SimCluster(n_zones=n_zones, nodes_per_zone=max(4, n_services // n_zones), slots_per_node=12)
    per_run: dict[str, list[dict[str, float]]] = {policy: [] for policy in POLICIES}
    for run in range(runs):
        graph = synthetic_graph(n_services, np.random.default_rng([seed, run]))
        for policy in POLICIES:
            counts = place(
                graph, cluster, policy, np.random.default_rng([seed, run, 1]), extender_weight=extender_weight
            )
            per_run[policy].append(
                {
                    "cross_zone_fraction": cross_zone_fraction(graph, counts, cluster),
                    "zone_imbalance": zone_imbalance(counts, cluster),
                    "single_zone_services": single_zone_services(counts, cluster),
                }
            )
    summary = {
        policy: {key: round(float(np.mean([r[key] for r in runs_])), 4) for key in runs_[0]}
        for policy, runs_ in per_run.items()
    }
    reduction = 1.0 - summary["ours"]["cross_zone_fraction"] / summary["spread"]["cross_zone_fraction"]
    return {
        "services": n_services,
        "zones": n_zones,
        "nodes": cluster.n_nodes,
        "slots_per_node": cluster.slots_per_node,
        "runs": runs,
        "seed": seed,
        "extender_weight": extender_weight,
        "mean": summary,
        "cross_zone_reduction_vs_spread": round(reduction, 4),
        "max_zone_imbalance_ours": round(max(r["zone_imbalance"] for r in per_run["ours"]), 4),
        "per_run": per_run,
    }
