"""Best fit for MIG slices (the device plugin's ``mixed`` strategy): pack a node's layout before opening
another, so that idle nodes keep their whole GPUs and their large profiles for the pods that need them.

A node's layout is fixed until the MIG manager changes it, and which slice a pod gets is the kubelet's
choice, so the unit is the node: its MIG capacity is the compute slices (the ``g`` of ``3g.71gb``) of all its
slices, and the fit is the share of that capacity in use once the pod is placed. Among nodes equally full,
the one with fewer free slices of the pod's own profile wins (the tightest fit for that profile).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from scheduler_core.k8s.mig import parse_profile
from scheduler_core.k8s.nodes import NodeTable
from scheduler_core.k8s.pods import PodDemand

NODE_WEIGHT = 0.8
"""The share of the fit that is the node's whole MIG capacity in use; the rest is the pod's own profile."""


def mig_preference(
    table: NodeTable, free: npt.NDArray[np.int32], demand: PodDemand, feasible: npt.NDArray[np.bool_]
) -> npt.NDArray[np.float64]:
    """The fit term, in [0, 1] per node (0 off ``feasible``), for a pod that requests MIG slices.

    Parameters
    ----------
    table : NodeTable
        Its ``mig_slices`` are the allocatable slices per profile.
    free : ndarray of shape (n_nodes, len(table.mig_profiles)), int32
        Free slices per profile (allocatable less what bound pods request).

    >>> t = NodeTable.from_columns(alloc_gpus=[0, 0])
    >>> t = NodeTable(**{**t.__dict__, "mig_profiles": ("1g.18gb", "3g.71gb"),
    ...                  "mig_slices": np.array([[16, 8], [16, 8]], dtype=np.int32)})
    >>> free = np.array([[16, 8], [4, 8]], dtype=np.int32)  # the second node runs 12 small pods
    >>> mig_preference(t, free, PodDemand(mig=(("1g.18gb", 1),)), np.array([True, True])).round(3).tolist()
    [0.033, 0.422]
    """
    weights = np.array([_slices(p) for p in table.mig_profiles], dtype=np.float64)
    capacity = table.mig_counts @ weights
    free_units = np.clip(free, 0, None) @ weights
    asked = sum(_slices(profile) * count for profile, count in demand.mig)
    with np.errstate(divide="ignore", invalid="ignore"):
        node_fit = np.where(capacity > 0, 1.0 - (free_units - asked) / capacity, 0.0)
        own = np.ones(table.n_nodes)
        for profile, count in demand.mig:
            if profile in table.mig_profiles:
                k = table.mig_profiles.index(profile)
                total = table.mig_counts[:, k].astype(np.float64)
                left = free[:, k] - count
                own = np.minimum(own, np.where(total > 0, 1.0 - left / total, 0.0))
    fit = NODE_WEIGHT * node_fit + (1.0 - NODE_WEIGHT) * own
    result: npt.NDArray[np.float64] = np.where(feasible, np.clip(fit, 0.0, 1.0), 0.0)
    return result


def _slices(profile: str) -> int:
    parsed = parse_profile(profile)
    return parsed.slices if parsed is not None else 1
