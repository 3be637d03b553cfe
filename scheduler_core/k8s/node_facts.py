"""What one v1 Node object says, read node by node: its name, labels and allocatable resources; its GPU
facts; the MIG slices it offers; why its MIG state refuses GPU pods.

Label precedence, per fact: NVIDIA GPU Feature Discovery (``nvidia.com/gpu.product|memory|count``)
wins over the project's own labels (``gpu.nvidia.com/model|memory|count``), which the node-state
refresher writes from EC2 instance-type data. A garbled value never raises: the node is treated as
having no GPU information, and :attr:`NodeGpuFacts.error` says why. The node table
(:mod:`scheduler_core.k8s.nodes`) is built from these.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from scheduler_core.errors import InvalidArgsError
from scheduler_core.k8s.gpu_models import normalize_model
from scheduler_core.k8s.limits import MAX_INT32
from scheduler_core.k8s.mig import MigMode, mig_mode, resource_profile
from scheduler_core.k8s.names import (
    GFD_COUNT,
    GFD_MEMORY,
    GFD_PRODUCT,
    GPU_RESOURCE,
    KARPENTER_GPU_COUNT,
    KARPENTER_GPU_MEMORY,
    KARPENTER_GPU_NAME,
    LABEL_COUNT,
    LABEL_MEMORY,
    LABEL_MODEL,
    MIG_CONFIG_STATE,
)
from scheduler_core.k8s.quantity import CountOutOfRangeError, parse_whole_count, plain_int


@dataclass(frozen=True)
class NodeGpuFacts:
    """GPU facts read from one node's labels and allocatable resources."""

    model: str | None
    memory_mib: int
    count: int
    allocatable: int
    error: str = ""


def node_parts(node: Any, row: int) -> tuple[str, Mapping[str, Any], Mapping[str, Any]]:
    """A v1 Node object's name, labels and allocatable resources (empty where absent); ``row`` names the
    node in the error an item without a name raises."""
    if not isinstance(node, Mapping):
        raise InvalidArgsError(f"Nodes.items[{row}]: expected a v1 Node object, got {type(node).__name__}")
    metadata = node.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise InvalidArgsError(f"Nodes.items[{row}]: metadata.name is missing")
    labels = metadata.get("labels") if isinstance(metadata, Mapping) else None
    status = node.get("status")
    allocatable = status.get("allocatable") if isinstance(status, Mapping) else None
    return (
        name,
        labels if isinstance(labels, Mapping) else {},
        allocatable if isinstance(allocatable, Mapping) else {},
    )


def gpu_facts(labels: Mapping[str, Any], allocatable: Mapping[str, Any], mode: MigMode | None = None) -> NodeGpuFacts:
    """Read GPU model, memory per GPU, count and allocatable GPUs from one node.

    GFD labels win over the project labels, and those over Karpenter's (an instance type's EC2 facts, as
    the project's are where GFD is absent: a node Karpenter just launched carries them before anything
    else labels it), fact by fact. If the winning value of any fact is
    garbled, the node gets no GPU information at all (model ``None``, memory 0, count 0) and
    ``error`` names the label and the value. Allocatable GPUs come from ``status.allocatable``.

    >>> gpu_facts({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"},
    ...           {"nvidia.com/gpu": "8"})
    NodeGpuFacts(model='H100', memory_mib=81559, count=0, allocatable=8, error='')
    """
    picked = [(key, labels.get(key)) for key in (_first(labels, keys) for keys in _FACT_KEYS)]
    raw_alloc = allocatable.get(GPU_RESOURCE, 0)
    refused = mig_refusal(labels, mig_mode(labels, allocatable) if mode is None else mode)
    if refused:  # no GPU facts: GPU pods are refused there, with this reason; CPU-only pods are not
        try:
            alloc = min(parse_whole_count(raw_alloc, what=f"allocatable {GPU_RESOURCE}"), MAX_INT32)
        except CountOutOfRangeError:
            alloc = MAX_INT32  # a figure past any cap: the node is invalid
        except ValueError:
            alloc = 0
        return NodeGpuFacts(None, 0, 0, alloc, refused)
    values = (*(value for _, value in picked), raw_alloc)
    keys = tuple(key for key, _ in picked)
    if all(value is None or isinstance(value, str | int) for value in values):
        # Nodes of one instance type share their label values: parse each combination once.
        return _facts_cached(keys, values)
    return _facts(keys, values)


_FACT_KEYS = (
    (GFD_PRODUCT, LABEL_MODEL, KARPENTER_GPU_NAME),
    (GFD_MEMORY, LABEL_MEMORY, KARPENTER_GPU_MEMORY),
    (GFD_COUNT, LABEL_COUNT, KARPENTER_GPU_COUNT),
)
"""Per fact (model, MiB per GPU, GPUs), the labels that give it, the first present winning."""


def _first(labels: Mapping[str, Any], keys: tuple[str, ...]) -> str:
    """The first of ``keys`` that ``labels`` has (the last when none: it reads as absent)."""
    for key in keys[:-1]:
        if key in labels:
            return key
    return keys[-1]


def offered_mig_slices(allocatable: Mapping[str, Any]) -> dict[str, int]:
    """Allocatable slices per profile of a ``mixed`` node (``nvidia.com/mig-<profile>``); a garbled count is
    no slices."""
    found: dict[str, int] = {}
    for resource, raw in allocatable.items():
        profile = resource_profile(resource) if isinstance(resource, str) else None
        if profile is None:
            continue
        try:
            count = min(parse_whole_count(raw, what=f"allocatable {resource}"), MAX_INT32)
        except CountOutOfRangeError:
            count = MAX_INT32  # a figure past any cap: the node is invalid
        except ValueError:
            continue
        if count > 0:
            found[profile.name] = count
    return found


def mig_refusal(labels: Mapping[str, Any], mode: MigMode | None = None) -> str:
    """Why a node's GPUs cannot be placed on for now, from its MIG labels ("" when they can): a MIG
    reconfiguration under way or failed (``nvidia.com/mig.config.state``), or an invalid layout under the
    device plugin's ``single`` strategy (GFD's product ``...-MIG-INVALID``).

    >>> mig_refusal({"nvidia.com/mig.config.state": "pending"})
    'MIG is being reconfigured on this node (nvidia.com/mig.config.state=pending)'
    >>> mig_refusal({"nvidia.com/mig.config.state": "success", "nvidia.com/gpu.product": "NVIDIA-H200"})
    ''
    """
    if mode is None:
        mode = mig_mode(labels, {})
    if mode == MigMode.PENDING:
        state = labels[MIG_CONFIG_STATE]
        doing = "could not be reconfigured" if state == "failed" else "is being reconfigured"
        return f"MIG {doing} on this node ({MIG_CONFIG_STATE}={state})"
    if mode == MigMode.INVALID:
        product = labels[GFD_PRODUCT]
        return (
            f"the GPUs' MIG layouts differ, which the device plugin's single strategy cannot serve "
            f"({GFD_PRODUCT}={product})"
        )
    return ""


def _facts(keys: tuple[str, ...], values: tuple[Any, ...]) -> NodeGpuFacts:
    model_key, memory_key, count_key = keys
    raw_model, raw_memory, raw_count, raw_alloc = values
    int32_max = MAX_INT32
    alloc_error = ""
    try:
        alloc = parse_whole_count(raw_alloc, what=f"allocatable {GPU_RESOURCE}")
    except CountOutOfRangeError:
        alloc = int32_max  # a figure past any cap: from_nodes makes the node invalid, naming it
    except ValueError as exc:
        alloc, alloc_error = 0, str(exc)
    # Clamp to int32: no node has 2**31 GPUs; a larger figure is over the cap (limits.MAX_GPUS_PER_NODE).
    alloc = min(alloc, int32_max)

    errors: list[str] = []
    model: str | None = None
    if raw_model is not None:
        model = normalize_model(raw_model) if isinstance(raw_model, str) else None
        if model is None:
            errors.append(f"label {model_key}={raw_model!r} is not a GPU model name")
    numbers = []
    for key, raw in ((memory_key, raw_memory), (count_key, raw_count)):
        if raw is None:
            numbers.append(0)
        elif (number := plain_int(raw)) is not None and number <= int32_max:
            numbers.append(number)
        else:
            numbers.append(0)
            errors.append(f"label {key}={raw!r} is not a non-negative integer")
    if errors:
        return NodeGpuFacts(None, 0, 0, alloc, "; ".join(filter(None, [*errors, alloc_error])))
    return NodeGpuFacts(model, numbers[0], numbers[1], alloc, alloc_error)


_facts_cached = lru_cache(maxsize=4096)(_facts)
