"""Pure scheduling core of eks-gpu-scheduler: numpy and the standard library only.

Entry points are named after what kube-scheduler calls: :func:`filter_nodes`, :func:`score_nodes`,
:func:`normalize_scores`; :class:`Extender` is the wire-level facade every adapter shares.
"""

from scheduler_core.cluster import ClusterState
from scheduler_core.errors import (
    ClusterStateUnavailableError,
    ConfigError,
    InvalidArgsError,
    InvalidPodError,
    SchedulerCoreError,
)
from scheduler_core.extender import Extender, ExtenderConfig
from scheduler_core.gpu_fit import Reason, ScoreWeights, filter_nodes, free_gpus, normalize_scores, score_nodes
from scheduler_core.nodes import NodeTable
from scheduler_core.pods import PodDemand, pod_demand

__all__ = [
    "ClusterState",
    "ClusterStateUnavailableError",
    "ConfigError",
    "Extender",
    "ExtenderConfig",
    "InvalidArgsError",
    "InvalidPodError",
    "NodeTable",
    "PodDemand",
    "Reason",
    "SchedulerCoreError",
    "ScoreWeights",
    "filter_nodes",
    "free_gpus",
    "normalize_scores",
    "pod_demand",
    "score_nodes",
]
