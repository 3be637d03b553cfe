"""MIG (Multi-Instance GPU) as the NVIDIA device plugin and GPU Feature Discovery present it.

A node is in one of five MIG modes (:data:`MIG_MODES`), read from its labels and allocatable resources:

- ``none``: no MIG; ``nvidia.com/gpu`` counts whole GPUs.
- ``single``: the device plugin's ``single`` strategy with MIG on. ``nvidia.com/gpu`` counts *slices*, all
  of one profile, and GFD writes the slice's facts on the node: ``nvidia.com/gpu.product`` ends in
  ``-MIG-<profile>``, ``nvidia.com/gpu.memory`` is the slice's memory, ``nvidia.com/gpu.count`` the slices.
- ``mixed``: the ``mixed`` strategy (``nvidia.com/mig.strategy=mixed``). Each profile is its own extended
  resource, ``nvidia.com/mig-<profile>`` (:func:`mig_resource`); ``nvidia.com/gpu`` counts only the GPUs
  with MIG off. GFD writes ``nvidia.com/mig-<profile>.count|memory|slices.gi``.
- ``invalid``: the ``single`` strategy on GPUs whose layouts differ (GFD's product ``...-MIG-INVALID``).
- ``pending``: the MIG manager is changing the layout, or failed to (``nvidia.com/mig.config.state``).

Which slice of which GPU a pod gets is the kubelet's choice and is not in the API, so the product counts
slices per profile, as kube-scheduler does, and never puts them on the milli ledger.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from scheduler_core.k8s.names import (
    GFD_PRODUCT,
    MIG_BUSY_STATES,
    MIG_CONFIG_STATE,
    MIG_INVALID_SUFFIX,
    MIG_RESOURCE_PREFIX,
    MIG_STRATEGY,
)


class MigMode(IntEnum):
    NONE = 0
    SINGLE = 1
    MIXED = 2
    INVALID = 3
    PENDING = 4


MIG_MODES = tuple(mode.name.lower() for mode in MigMode)
"""The modes by value: ``none``, ``single``, ``mixed``, ``invalid``, ``pending``."""

# "1g.10gb", "1g.10gb+me" (nvidia-smi's spelling), "1g.10gb.me" (the device plugin's resource name),
# and the compute-instance profiles the mixed strategy names "1c.3g.40gb".
_PROFILE = re.compile(r"^(?:(\d{1,2})c\.)?(\d{1,2})g\.(\d{1,4})gb(?:[+.-]me)?$")


@dataclass(frozen=True)
class Profile:
    """One MIG profile: its name as the resource spells it, and the GPU's compute slices it takes."""

    name: str
    slices: int
    memory_gb: int


def parse_profile(text: str) -> Profile | None:
    """A profile from its name (``1g.18gb``, ``1g.18gb+me``, ``1c.3g.40gb``), or None when it is not one.

    >>> parse_profile("1g.18gb+me")
    Profile(name='1g.18gb.me', slices=1, memory_gb=18)
    >>> parse_profile("3g.71gb").slices, parse_profile("mig") is None
    (3, True)
    """
    match = _PROFILE.match(text.strip().lower())
    if match is None:
        return None
    name = match.group(0).replace("+me", ".me").replace("-me", ".me")
    return Profile(name, int(match.group(2)), int(match.group(3)))


def mig_resource(profile: str) -> str:
    """``nvidia.com/mig-<profile>``, the mixed strategy's resource for one profile."""
    return MIG_RESOURCE_PREFIX + profile


def resource_profile(resource: str) -> Profile | None:
    """The profile of a ``nvidia.com/mig-<profile>`` resource name; None for any other name."""
    if not resource.startswith(MIG_RESOURCE_PREFIX):
        return None
    return parse_profile(resource.removeprefix(MIG_RESOURCE_PREFIX))


def mig_mode(labels: Mapping[str, Any], allocatable: Mapping[str, Any]) -> MigMode:
    """The node's MIG mode (see the module docstring).

    >>> mig_mode({"nvidia.com/gpu.product": "NVIDIA-H200-MIG-1g.18gb"}, {"nvidia.com/gpu": "56"}).name
    'SINGLE'
    >>> mig_mode({"nvidia.com/mig.strategy": "mixed"}, {"nvidia.com/mig-3g.71gb": "8"}).name
    'MIXED'
    """
    # Called for every node of every full-object request: plain string tests, no regex, no generator.
    if labels.get(MIG_CONFIG_STATE) in MIG_BUSY_STATES:
        return MigMode.PENDING
    product = labels.get(GFD_PRODUCT)
    if type(product) is str and "-MIG-" in product:
        return MigMode.INVALID if product.endswith(MIG_INVALID_SUFFIX) else MigMode.SINGLE
    if labels.get(MIG_STRATEGY) == "mixed":
        return MigMode.MIXED
    for key in allocatable:
        if type(key) is str and key.startswith(MIG_RESOURCE_PREFIX):
            return MigMode.MIXED
    return MigMode.NONE


KNOWN_PROFILES: Mapping[str, tuple[str, ...]] = {
    # GPU instance profiles per GPU, as `nvidia-smi mig -lgip` lists them (H200: ../shared/fixtures/gpu/h200/
    # mig-profiles.txt; the others: NVIDIA's MIG user guide and mig-parted's per-device tables).
    "A30-24GB": ("1g.6gb", "1g.6gb.me", "2g.12gb", "2g.12gb.me", "4g.24gb"),
    "A100-40GB": ("1g.5gb", "1g.5gb.me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    "A100-80GB": ("1g.10gb", "1g.10gb.me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-80GB": ("1g.10gb", "1g.10gb.me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    "H100-94GB": ("1g.12gb", "1g.12gb.me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    "H200-141GB": ("1g.18gb", "1g.18gb.me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
}
"""The MIG profiles of the GPUs the product knows: the resource names the generated profile manages."""


def known_mig_resources() -> tuple[str, ...]:
    """Every ``nvidia.com/mig-<profile>`` name of :data:`KNOWN_PROFILES`, sorted, once each."""
    return tuple(sorted({mig_resource(p) for profiles in KNOWN_PROFILES.values() for p in profiles}))
