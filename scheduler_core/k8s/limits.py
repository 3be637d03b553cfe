"""Caps on what one node may say about itself: every per-node quantity that sizes the state.

A node's status is written by its kubelet and by the device plugins on it, a ResourceSlice by its DRA
driver: any of them can say ``nvidia.com/gpu: 2147483647``. The per-GPU arrays of a cluster state have one
column per GPU of the largest node, so one such node would size every row of them (a ``MemoryError``, or a
rebuild of seconds, for the whole cluster). So each quantity has a cap, set from the largest real nodes with
room to spare; a node over any cap is *invalid on its own*: it keeps its row, with no GPU, slice or device,
every pod of the profile is refused there with the reason (``Reason.NODE_INVALID``), and the rest of the
cluster is built and served as if it were absent (``docs/security.md``, "Node facts a node writes").

- :data:`MAX_GPUS_PER_NODE`, 128: 16 GPUs on the largest servers (HGX-2, DGX-2), 8 on p4d, p5, p5en and p6;
  112 MIG slices under the ``single`` strategy (16 GPUs x 7); 8 GPUs x 16 time-slicing replicas.
- :data:`MAX_MIG_SLICES_PER_NODE`, 128: 112 (16 GPUs x 7 slices), every ``nvidia.com/mig-<profile>`` summed.
- :data:`MAX_MIG_PROFILES_PER_NODE`, 32: 7 GPU-instance profiles per GPU kind (H200), about 20 with the
  compute-instance ones (``1c.3g.40gb``); a node has one GPU kind.
- :data:`MAX_DRA_DEVICES_PER_NODE`, 1024: 416 on 16 GPUs x 26 devices, a GPU and each MIG placement of it
  (partitionable devices, 1.34).

The GPUs DRA publishes or its claims hold on one node are capped by :data:`MAX_GPUS_PER_NODE` too. Node
names, labels and annotations are bounded by the API server itself (253 and 63 characters).
"""

from __future__ import annotations

MAX_GPUS_PER_NODE = 128
"""Allocatable ``nvidia.com/gpu`` (and the GPU count labels) per node; also the GPUs DRA publishes or
claims there. A time-sliced node counts its replicas: more than 16 replicas of 8 GPUs is refused."""
MAX_MIG_SLICES_PER_NODE = 128
"""Allocatable ``nvidia.com/mig-<profile>`` of one node (the ``mixed`` strategy), all profiles summed."""
MAX_MIG_PROFILES_PER_NODE = 32
"""Distinct ``nvidia.com/mig-<profile>`` resources of one node."""
MAX_DRA_DEVICES_PER_NODE = 1024
"""Devices of the GPU driver's ResourceSlices on one node (GPUs, MIG devices, their partitions)."""

MAX_INT32 = 2**31 - 1
"""The largest figure the state stores; a count at it may have been clamped from a larger one."""


def over_cap(what: str, value: int, cap: int) -> str:
    """Why a node is invalid, naming the figure and the cap ("" when ``value`` is within it).

    >>> over_cap("allocatable nvidia.com/gpu", 2147483647, MAX_GPUS_PER_NODE)
    'allocatable nvidia.com/gpu is 2147483647 or more, over the cap of 128 per node'
    >>> over_cap("MIG slices", 56, MAX_MIG_SLICES_PER_NODE)
    ''
    """
    if value <= cap:
        return ""
    shown = f"{value} or more" if value >= MAX_INT32 else str(value)
    return f"{what} is {shown}, over the cap of {cap} per node"
