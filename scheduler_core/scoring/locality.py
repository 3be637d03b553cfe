"""Network locality: place a pod near the workloads it talks to.

A pod names its peers in annotation ``gpu-scheduler.io/peers``: label selectors with traffic weights,
``app=feature-store:3,app=redis:1`` (or JSON). The cluster state indexes pods by the configured label
keys, counting them per node and per zone (:class:`AppIndex`). A candidate node then scores, for each
peer, the share of that peer's pods it would be close to::

    value(peer, node) = (pods on the node) * 1.0 + (pods elsewhere in its zone) * alpha
                        + (pods in other zones) * 0          ... all divided by the peer's pods

    locality(node) = sum(weight * value) / sum(weight)           in [0, 1]

An optional per-zone-pair table replaces the ``alpha`` / 0 steps (same node stays 1.0). No CRDs and
no hand-kept cost tables are needed: the annotation is the whole interface.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import Namer, by_path
from scheduler_core.k8s.annotations import LABEL_KEY, Peer
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pods import bound_row

DEFAULT_LABEL_KEYS = ("app", "app.kubernetes.io/name")


@dataclass(frozen=True)
class LocalitySettings:
    """Which label keys are indexed, and how close a zone is.

    ``zone_alpha`` is the value of a peer pod in the same zone but on another node (1.0 is the same
    node, 0 another zone). ``zone_values``, when given, replaces those steps per pair of zones:
    ``{"us-east-1a": {"us-east-1a": 0.5, "us-east-1b": 0.1}}``; pairs it omits are 0.

    ``self_weight``: a pod that names peers also counts its own workload (its own value of the first
    indexed label key) as a peer, weighted ``self_weight`` x the sum of its peers' weights. Without
    it, the first workload of a call graph spreads over every zone before any peer exists, and with
    requests spread evenly over replicas nothing downstream can then be local. The price is that such
    workloads gather in fewer zones; a hard zone spread constraint (kube-scheduler enforces it before
    the extender runs) keeps the replicas of a workload that must survive a zone outage apart. 0
    turns it off.
    """

    label_keys: tuple[str, ...] = DEFAULT_LABEL_KEYS
    zone_alpha: float = 0.5
    zone_values: Mapping[str, Mapping[str, float]] | None = None
    self_weight: float = 1.0

    def with_self(self, peers: Sequence[Peer], labels: Mapping[str, Any]) -> tuple[Peer, ...]:
        """``peers`` plus the pod's own workload, when it names peers (see ``self_weight``)."""
        if not peers or self.self_weight <= 0:
            return tuple(peers)
        key = next((k for k in self.label_keys if isinstance(labels.get(k), str)), None)
        if key is None or any(p.key == key and p.value == labels[key] for p in peers):
            return tuple(peers)
        return (*peers, Peer(key, str(labels[key]), self.self_weight * sum(p.weight for p in peers)))

    def problems(self, name: Namer = by_path) -> list[str]:
        """Every invalid setting, each named by ``name`` of its path (``locality.zone_alpha``)."""
        keys = name("locality.label_keys")
        found = [f"{keys}: {key!r} is not a label key" for key in self.label_keys if not LABEL_KEY.match(key)]
        if not self.label_keys:
            found.append(f"{keys}: at least one key is needed")
        if not (isinstance(self.zone_alpha, int | float) and 0.0 <= self.zone_alpha <= 1.0):
            found.append(f"{name('locality.zone_alpha')}: must be in [0, 1], got {self.zone_alpha!r}")
        if not (isinstance(self.self_weight, int | float) and 0.0 <= self.self_weight <= 10.0):
            found.append(f"{name('locality.self_weight')}: must be in [0, 10], got {self.self_weight!r}")
        for zone, row in (self.zone_values or {}).items():
            for other, value in row.items():
                if not (isinstance(value, int | float) and 0.0 <= value <= 1.0):
                    where = f"{name('locality.zone_values')}[{zone!r}][{other!r}]"
                    found.append(f"{where}: must be in [0, 1], got {value!r}")
        return found

    def zone_matrix(self, zones: Sequence[str]) -> npt.NDArray[np.float64]:
        """Shape (n_zones, n_zones): value of a peer pod in zone j for a candidate in zone i."""
        if self.zone_values is None:
            return np.eye(len(zones)) * self.zone_alpha
        return np.array(
            [[float(self.zone_values.get(a, {}).get(b, 0.0)) for b in zones] for a in zones], dtype=np.float64
        ).reshape(len(zones), len(zones))


@dataclass(frozen=True, eq=False)
class AppIndex:
    """Pods per label selector (``"app=feature-store"``), counted per node and per zone.

    A pod is indexed under every configured key it carries.

    Attributes
    ----------
    apps : tuple of str, length n_apps
    node_entries : ndarray of shape (3, n_entries), int32
        Sparse (app_id, node row, pod count) triples, sorted by app_id.
    zone_counts : ndarray of shape (n_apps, n_zones), int32
    """

    apps: tuple[str, ...]
    node_entries: npt.NDArray[np.int32]
    zone_counts: npt.NDArray[np.int32]

    @classmethod
    def empty(cls, n_zones: int = 0) -> AppIndex:
        return cls((), np.zeros((3, 0), dtype=np.int32), np.zeros((0, n_zones), dtype=np.int32))

    @cached_property
    def _app_id(self) -> dict[str, int]:
        return {app: i for i, app in enumerate(self.apps)}

    @cached_property
    def _bounds(self) -> npt.NDArray[np.intp]:
        """Start of each app's entries (entries are sorted by app_id), shape (n_apps + 1,)."""
        return np.searchsorted(self.node_entries[0], np.arange(len(self.apps) + 1)).astype(np.intp)

    def app_id(self, selector: str) -> int:
        return self._app_id.get(selector, -1)

    def nodes_of(self, app_id: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """(node rows, pod counts) of one app."""
        start, stop = self._bounds[app_id], self._bounds[app_id + 1]
        return self.node_entries[1, start:stop], self.node_entries[2, start:stop]

    def node_counts(self, app: str, n_nodes: int) -> npt.NDArray[np.int32]:
        """Pods of ``app`` on each node, shape (n_nodes,); zeros for an unknown app."""
        counts = np.zeros(n_nodes, dtype=np.int32)
        app_id = self.app_id(app)
        if app_id >= 0:
            rows, pods = self.nodes_of(app_id)
            counts[rows] = pods
        return counts


def index_apps(table: NodeTable, pods: Sequence[Any], keys: Sequence[str] = DEFAULT_LABEL_KEYS) -> AppIndex:
    """Count non-terminal bound pods per ``key=value`` of each configured label key."""
    placements = []
    index = table.index
    for pod in pods:
        if not isinstance(pod, Mapping):
            continue
        row = bound_row(pod, index)
        metadata = pod.get("metadata")
        labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
        if row is not None and isinstance(labels, Mapping):
            placements.append((table.names[row], labels))
    return index_placements(table, placements, keys)


def index_placements(
    table: NodeTable, placements: Iterable[tuple[str, Mapping[str, Any]]], keys: Sequence[str] = DEFAULT_LABEL_KEYS
) -> AppIndex:
    """:func:`index_apps` from ``(node name, labels)`` of pods already known to be bound and running."""
    counts: dict[tuple[str, int], int] = {}
    index = table.index
    for node, labels in placements:
        row = index.get(node)
        if row is None:
            continue
        for key in keys:
            value = labels.get(key)
            if isinstance(value, str):
                counts[(f"{key}={value}", row)] = counts.get((f"{key}={value}", row), 0) + 1
    apps = tuple(sorted({app for app, _ in counts}))
    app_id = {app: i for i, app in enumerate(apps)}
    entries = np.array([(app_id[app], row, n) for (app, row), n in counts.items()], dtype=np.int32).reshape(-1, 3).T
    entries = entries[:, np.lexsort((entries[1], entries[0]))] if entries.shape[1] else entries
    zone_counts = np.zeros((len(apps), len(table.zones)), dtype=np.int32)
    zones = table.zone_id[entries[1]] if entries.shape[1] else np.zeros(0, dtype=np.int32)
    known = zones >= 0
    np.add.at(zone_counts, (entries[0][known], zones[known]), entries[2][known])
    return AppIndex(apps=apps, node_entries=np.ascontiguousarray(entries), zone_counts=zone_counts)


@dataclass(frozen=True, eq=False)
class PeerPlacement:
    """Where the peers' pods are, for scoring candidates.

    Attributes
    ----------
    node_counts : ndarray of shape (n_peers, n_candidates), float64
        Pods of each peer on each candidate node.
    zone_counts : ndarray of shape (n_peers, n_zones), float64
    totals : ndarray of shape (n_peers,), float64
        Each peer's pods anywhere (including nodes without a zone).
    weights : ndarray of shape (n_peers,), float64
    """

    node_counts: npt.NDArray[np.float64]
    zone_counts: npt.NDArray[np.float64]
    totals: npt.NDArray[np.float64]
    weights: npt.NDArray[np.float64]
    zones: tuple[str, ...] = field(default=())


def peer_placement(
    apps: AppIndex, zones: Sequence[str], peers: Sequence[Peer], state_rows: npt.ArrayLike
) -> PeerPlacement:
    """Gather the peers' pod counts for candidates at ``state_rows`` (rows of the indexed table, -1
    for candidates the state lacks)."""
    rows = np.asarray(state_rows, dtype=np.intp)
    n_state = int(rows.max()) + 1 if rows.size else 0
    position = np.full(max(n_state, 1), -1, dtype=np.intp)
    known = rows >= 0
    position[rows[known]] = np.flatnonzero(known)
    node_counts = np.zeros((len(peers), rows.size))
    zone_counts = np.zeros((len(peers), len(zones)))
    totals = np.zeros(len(peers))
    for p, peer in enumerate(peers):
        app_id = apps.app_id(peer.selector)
        if app_id < 0:
            continue
        app_rows, app_pods = apps.nodes_of(app_id)
        totals[p] = app_pods.sum()
        zone_counts[p, : apps.zone_counts.shape[1]] = apps.zone_counts[app_id]
        inside = app_rows < n_state
        candidate = position[app_rows[inside]]
        hit = candidate >= 0
        node_counts[p, candidate[hit]] = app_pods[inside][hit]
    weights = np.array([peer.weight for peer in peers], dtype=np.float64)
    return PeerPlacement(node_counts, zone_counts, totals, weights, tuple(zones))


def locality_scores(
    placement: PeerPlacement, candidate_zone: npt.ArrayLike, settings: LocalitySettings | None = None
) -> npt.NDArray[np.float64]:
    """Locality of each candidate in [0, 1] (see the module docstring), shape (n_candidates,).

    ``candidate_zone`` holds each candidate's index into ``placement.zones`` (-1: no zone).

    >>> placement = PeerPlacement(np.array([[2.0, 0.0, 0.0]]), np.array([[2.0, 2.0]]), np.array([4.0]),
    ...                           np.array([1.0]), ("a", "b"))
    >>> locality_scores(placement, [0, 0, 1]).tolist()
    [0.5, 0.25, 0.25]
    """
    settings = settings or LocalitySettings()
    zone_of = np.asarray(candidate_zone, dtype=np.intp)
    n_peers, n_candidates = placement.node_counts.shape
    if zone_of.shape != (n_candidates,):
        raise ValueError(f"candidate_zone: expected shape ({n_candidates},), got {zone_of.shape}")
    if n_peers == 0 or placement.weights.sum() <= 0:
        return np.zeros(n_candidates)
    matrix = settings.zone_matrix(placement.zones)  # (n_zones, n_zones)
    # Peers with no pods anywhere contribute 0 (and still count in the weights: a peer that is not
    # running yet gives no reason to prefer any node).
    safe_totals = np.where(placement.totals > 0, placement.totals, 1.0)
    zone_share = placement.zone_counts / safe_totals[:, None]  # (n_peers, n_zones)
    node_share = placement.node_counts / safe_totals[:, None]  # (n_peers, n_candidates)
    # For a candidate in zone z: sum over zones z' of share(z') * matrix[z, z'].
    zone_value = zone_share @ matrix.T  # (n_peers, n_zones)
    has_zone = zone_of >= 0
    safe_zone = np.where(has_zone, zone_of, 0)
    candidate_zone_value = np.where(has_zone, zone_value[:, safe_zone], 0.0)  # (n_peers, n_candidates)
    # Pods on the candidate itself were counted at matrix[z, z]; lift them to the same-node 1.0.
    same_zone = np.where(has_zone, matrix[safe_zone, safe_zone], 0.0)  # (n_candidates,)
    value = candidate_zone_value + node_share * (1.0 - same_zone)[None, :]
    # Clamp to [0, 1]: rounding in the shares can leave a hair outside.
    scores: npt.NDArray[np.float64] = np.clip(placement.weights @ value / placement.weights.sum(), 0.0, 1.0)
    return scores
