"""The GPU labels the node-state refresher owns, and what each node's should be.

The refresher writes ``gpu.nvidia.com/model|memory|count`` and nothing else. Facts come, in order:

1. NVIDIA GPU Feature Discovery labels on the node (``nvidia.com/gpu.product|memory|count``);
2. the EC2 ``GpuInfo`` of the node's instance type (``node.kubernetes.io/instance-type``);
3. otherwise the node is left unlabelled, and the reason is returned for the log.

Policies: ``fill`` writes labels that are missing; ``enforce`` also corrects values that differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from scheduler_core.k8s.gpu_models import normalize_model
from scheduler_core.k8s.names import (
    GFD_COUNT,
    GFD_MEMORY,
    GFD_PRODUCT,
    LABEL_COUNT,
    LABEL_INSTANCE_TYPE,
    LABEL_MEMORY,
    LABEL_MODEL,
)
from scheduler_core.k8s.quantity import plain_int

OWNED_LABELS = (LABEL_MODEL, LABEL_MEMORY, LABEL_COUNT)
LabelPolicy = Literal["fill", "enforce"]
LABEL_POLICIES: tuple[LabelPolicy, ...] = ("fill", "enforce")


@dataclass(frozen=True)
class GpuInfo:
    """GPU facts for one node: short model name, MiB per GPU, GPUs per node."""

    model: str
    memory_mib: int
    count: int

    def labels(self) -> dict[str, str]:
        return {LABEL_MODEL: self.model, LABEL_MEMORY: str(self.memory_mib), LABEL_COUNT: str(self.count)}


@dataclass(frozen=True)
class Desired:
    """What a node's owned labels should be (``info``), or why there is nothing to write."""

    info: GpuInfo | None
    source: str  # "gfd", "ec2" or "" when info is None
    reason: str = ""


def gpu_info_from_ec2(instance_type: str, gpu_info: Mapping[str, Any] | None) -> tuple[GpuInfo | None, str]:
    """Read an EC2 ``DescribeInstanceTypes`` ``GpuInfo`` block; ``(None, reason)`` when unusable.

    >>> gpu_info_from_ec2("p4d.24xlarge", {"Gpus": [{"Name": "A100", "Manufacturer": "NVIDIA", "Count": 8,
    ...                                              "MemoryInfo": {"SizeInMiB": 40960}}]})
    (GpuInfo(model='A100', memory_mib=40960, count=8), '')
    """
    if not gpu_info:
        return None, f"instance type {instance_type} has no GPUs"
    gpus = gpu_info.get("Gpus")
    if not isinstance(gpus, list) or len(gpus) != 1 or not isinstance(gpus[0], Mapping):
        return None, f"instance type {instance_type}: expected one GPU kind in GpuInfo, got {gpus!r}"
    gpu = gpus[0]
    if gpu.get("Manufacturer") != "NVIDIA":
        return None, f"instance type {instance_type}: GPUs by {gpu.get('Manufacturer')!r}, not NVIDIA"
    model = normalize_model(str(gpu.get("Name", "")))
    memory = (gpu.get("MemoryInfo") or {}).get("SizeInMiB")
    count = gpu.get("Count")
    if model is None or not isinstance(memory, int) or not isinstance(count, int) or memory <= 0 or count <= 0:
        return None, f"instance type {instance_type}: unusable GpuInfo {dict(gpu)!r}"
    return GpuInfo(model, memory, count), ""


def desired_info(labels: Mapping[str, Any], ec2: Mapping[str, tuple[GpuInfo | None, str]]) -> Desired:
    """The owned labels a node should carry, from GFD labels first, then EC2 by instance type.

    ``ec2`` maps instance types to :func:`gpu_info_from_ec2` results.

    >>> desired_info({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559",
    ...               "nvidia.com/gpu.count": "8"}, {}).info
    GpuInfo(model='H100', memory_mib=81559, count=8)
    """
    if GFD_PRODUCT in labels:
        raw = (labels.get(GFD_PRODUCT), labels.get(GFD_MEMORY), labels.get(GFD_COUNT))
        model = normalize_model(raw[0]) if isinstance(raw[0], str) else None
        numbers = [plain_int(v) for v in raw[1:]]
        if model is not None and numbers[0] and numbers[1]:
            return Desired(GpuInfo(model, numbers[0], numbers[1]), "gfd")
        shown = dict(zip((GFD_PRODUCT, GFD_MEMORY, GFD_COUNT), raw, strict=True))
        gfd_reason = f"GFD labels are incomplete or garbled ({shown})"
    else:
        gfd_reason = "no GFD labels"
    instance_type = labels.get(LABEL_INSTANCE_TYPE)
    if not isinstance(instance_type, str) or not instance_type:
        return Desired(None, "", f"{gfd_reason} and no {LABEL_INSTANCE_TYPE} label")
    found = ec2.get(instance_type)
    if found is None:
        return Desired(None, "", f"{gfd_reason}; GpuInfo for {instance_type} was not looked up")
    info, reason = found
    if info is None:
        return Desired(None, "", f"{gfd_reason}; {reason}")
    return Desired(info, "ec2")


def label_changes(current: Mapping[str, Any], info: GpuInfo, policy: LabelPolicy) -> dict[str, str]:
    """The owned labels to write: missing ones (``fill``), or also differing ones (``enforce``).

    >>> label_changes({"gpu.nvidia.com/model": "V100"}, GpuInfo("A100", 40960, 8), "fill")
    {'gpu.nvidia.com/memory': '40960', 'gpu.nvidia.com/count': '8'}
    >>> label_changes({"gpu.nvidia.com/model": "V100"}, GpuInfo("A100", 40960, 8), "enforce")["gpu.nvidia.com/model"]
    'A100'
    """
    changes = {}
    for key, value in info.labels().items():
        have = current.get(key)
        if have is None or (policy == "enforce" and have != value):
            changes[key] = value
    return changes
