"""GPUs that Dynamic Resource Allocation (``resource.k8s.io``) publishes and hands out, per node.

With NVIDIA's DRA driver (:data:`~scheduler_core.k8s.names.DRA_GPU_DRIVER`) a node's GPUs are devices in
``ResourceSlices``, and kube-scheduler itself allocates them to ``ResourceClaims``; neither shows in the
node's ``nvidia.com/gpu`` or in any pod's requests. This module reads those objects (plain dicts, in the
``v1``, ``v1beta2`` or ``v1beta1`` shapes) into per-node counts the state lays over the rest:

- **published**: the GPUs the driver lists on the node, from the newest generation of each pool. A pool
  whose newest generation has fewer slices than ``resourceSliceCount`` is being rewritten: kube-scheduler
  does not allocate from it, and it counts here by what it lists so far, so that its node stays
  DRA-managed meanwhile (older generations never count: they may list what is gone);
- **claimed**: the GPUs held by devices allocated to claims, reserved for a pod or not yet, whatever pod
  holds them (a pod whose only GPU is a claim never reaches the extender). A MIG device holds its parent
  GPU: no whole-GPU pod and no share can have that GPU. A device allocated with ``adminAccess`` holds
  nothing (it monitors a device that another claim may hold).

A GPU is known by its ``uuid`` attribute, a MIG device's by its ``parentUUID``, so that two MIG devices of
one GPU, or a GPU and its partitions (partitionable devices, 1.34), count it once; a device without those
attributes is a GPU of its own. A claim's device that no slice lists (its slice was deleted or rewritten)
still holds a GPU, on the node the allocation's node selector names: one per device, since no slice says
which devices share a GPU (two MIG devices of one GPU then count two, which errs towards refusing).

A pool is known by its driver, its name *and its node*: a node's kubelet may write slices of any pool
name, and a pool of another node's name must not replace that node's devices (one node's pools are never
another's). A node whose slices list more than :data:`~scheduler_core.k8s.limits.MAX_DRA_DEVICES_PER_NODE`
devices, or more GPUs than :data:`~scheduler_core.k8s.limits.MAX_GPUS_PER_NODE` (published, or held by
claims), is invalid on its own (:attr:`DraFacts.over_cap`): the state refuses every pod there and counts
none of its GPUs.

A ``DeviceClass`` with ``extendedResourceName: nvidia.com/gpu`` (KEP-5004, ``DRAExtendedResource``) lets a
pod's ``nvidia.com/gpu`` request be served by a claim kube-scheduler makes for it; such a pod's
``status.extendedResourceClaimStatus`` names it, and its GPUs are counted once, by the claim
(:func:`served_by_claim`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scheduler_core.k8s.limits import MAX_DRA_DEVICES_PER_NODE, MAX_GPUS_PER_NODE, over_cap
from scheduler_core.k8s.names import DRA_GPU_DRIVER, GPU_RESOURCE
from scheduler_core.k8s.resources import _mapping

GPU_TYPES = frozenset({"gpu", "mig", "vfio"})
"""The NVIDIA driver's device types that are (parts of) GPUs."""


@dataclass(frozen=True)
class DraFacts:
    """What DRA says about the GPUs of each node.

    Attributes
    ----------
    published : node name -> GPUs the driver publishes there (newest pool generations)
    claimed : node name -> GPUs that devices allocated to claims hold there
    extended : a DeviceClass maps ``nvidia.com/gpu`` to DRA devices (KEP-5004)
    problems : what could not be read, one line each
    over_cap : node name -> why it is invalid (a cap of :mod:`scheduler_core.k8s.limits`); such a node is in
        neither ``published`` nor ``claimed``
    """

    published: Mapping[str, int] = field(default_factory=dict)
    claimed: Mapping[str, int] = field(default_factory=dict)
    extended: bool = False
    problems: tuple[str, ...] = ()
    over_cap: Mapping[str, str] = field(default_factory=dict)

    @property
    def managed(self) -> frozenset[str]:
        """The nodes whose GPUs DRA manages: it publishes some there, or claims hold some."""
        return frozenset(name for name, count in (*self.published.items(), *self.claimed.items()) if count > 0)


def dra_facts(
    slices: Iterable[Any],
    claims: Iterable[Any],
    classes: Iterable[Any] = (),
    drivers: Iterable[str] = (DRA_GPU_DRIVER,),
) -> DraFacts:
    """Read ResourceSlices, ResourceClaims and DeviceClasses (see the module docstring).

    >>> def slice_(node, *devices, count=1, generation=1):
    ...     return {"spec": {"driver": "gpu.nvidia.com", "nodeName": node,
    ...             "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
    ...             "devices": [{"name": d, "attributes": {"uuid": {"string": "GPU-" + d}}} for d in devices]}}
    >>> claim = {"status": {"allocation": {"devices": {"results": [
    ...     {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-1"}]}}}}
    >>> facts = dra_facts([slice_("n1", "gpu-0", "gpu-1"), slice_("n2", "gpu-0", count=2)], [claim])
    >>> dict(facts.published), dict(facts.claimed)  # n2's pool lacks a slice so far: it counts what it lists
    ({'n1': 2, 'n2': 1}, {'n1': 1})
    """
    wanted = frozenset(drivers)
    problems: list[str] = []
    over: dict[str, str] = {}  # node -> why it is over a cap: nothing more of it is read
    where, published = _published(_newest_pools(slices, wanted, problems), over)
    claimed = _claimed(claims, wanted, where, over, problems)
    extended = any(_mapping(_mapping(item).get("spec")).get("extendedResourceName") == GPU_RESOURCE for item in classes)
    return DraFacts(
        published={node: len(gpus) for node, gpus in published.items() if node not in over},
        claimed={node: len(gpus) for node, gpus in claimed.items() if node not in over},
        extended=extended,
        problems=tuple(problems),
        over_cap=over,
    )


_Pools = dict[tuple[str, str, str], list[Mapping[str, Any]]]
"""(driver, pool, node) -> the specs of the pool's newest generation."""
_Where = dict[tuple[str, str, str], dict[str, str]]
"""(driver, pool, device) -> node -> the GPU the device holds there."""


def _newest_pools(slices: Iterable[Any], wanted: frozenset[str], problems: list[str]) -> _Pools:
    """The slices of ``wanted`` drivers, grouped by pool, of each pool's newest generation only; a slice
    without a valid pool is a problem (appended to ``problems``)."""
    pools: _Pools = {}
    newest: dict[tuple[str, str, str], int] = {}
    for position, item in enumerate(slices):
        spec = _mapping(_mapping(item).get("spec"))
        driver, about = spec.get("driver"), _mapping(spec.get("pool"))
        name, generation = about.get("name"), _count(about.get("generation"))
        if not isinstance(driver, str) or driver not in wanted:
            continue
        if not isinstance(name, str) or generation < 0 or _count(about.get("resourceSliceCount")) < 1:
            problems.append(f"{_name(item, position, 'resourceslices')}: no valid spec.pool (name, generation, "
                            "resourceSliceCount); its devices are not counted")  # fmt: skip
            continue
        node = spec.get("nodeName")
        key = (driver, name, node if isinstance(node, str) else "")  # a pool is one node's: no node takes another's
        if generation > newest.get(key, -1):
            pools[key], newest[key] = [spec], generation
        elif generation == newest[key]:
            pools[key].append(spec)
    return pools


def _published(pools: _Pools, over: dict[str, str]) -> tuple[_Where, dict[str, set[str]]]:
    """Where each listed device is, and the GPUs published per node; a node whose slices list more devices
    or GPUs than a cap allows goes into ``over`` (node -> why), and the rest of its devices are not read."""
    where: _Where = {}
    published: dict[str, set[str]] = {}
    devices: dict[str, int] = {}  # node -> devices its slices list
    for (driver, pool, _), specs in pools.items():
        for spec in specs:
            for device in _list(spec.get("devices")):
                found = _device(driver, pool, spec, device)
                if found is None:
                    continue
                node, gpu = found
                if node in over:
                    continue
                devices[node] = devices.get(node, 0) + 1
                gpus = published.setdefault(node, set())
                gpus.add(gpu)
                reason = over_cap("the devices its ResourceSlices list", devices[node], MAX_DRA_DEVICES_PER_NODE)
                reason = reason or over_cap("the GPUs DRA publishes on it", len(gpus), MAX_GPUS_PER_NODE)
                if reason:  # stop reading it: what a node over a cap lists sizes nothing
                    over[node] = reason
                    continue
                where.setdefault((driver, pool, str(_mapping(device).get("name"))), {})[node] = gpu
    return where, published


def _claimed(
    claims: Iterable[Any], wanted: frozenset[str], where: _Where, over: dict[str, str], problems: list[str]
) -> dict[str, set[str]]:
    """The GPUs that devices allocated to claims hold, per node (a device no slice lists: on the node its
    allocation selects, or a problem); a node they put over the cap goes into ``over``."""
    claimed: dict[str, set[str]] = {}
    for position, item in enumerate(claims):
        status = _mapping(_mapping(item).get("status"))
        allocation = _mapping(status.get("allocation"))
        for result in _list(_mapping(allocation.get("devices")).get("results")):
            result = _mapping(result)
            driver = result.get("driver")
            if not isinstance(driver, str) or driver not in wanted or result.get("adminAccess") is True:
                continue
            device = (str(driver), str(result.get("pool")), str(result.get("device")))
            selected = _selected_node(allocation.get("nodeSelector"))
            candidates = where.get(device, {})
            held = [(selected, candidates[selected])] if selected in candidates else list(candidates.items())
            if not held:  # no slice lists it now: it still holds a GPU, where the allocation says
                if not selected:
                    problems.append(f"{_name(item, position, 'resourceclaims')}: device {'/'.join(device)} is in no"
                                    " ResourceSlice and the allocation names no node; not counted")  # fmt: skip
                    continue
                held = [(selected, "/".join(device))]
            for node, gpu in held:  # a device two nodes' pools list, and no selector decides: held on both
                if node in over:
                    continue
                gpus = claimed.setdefault(node, set())
                gpus.add(gpu)
                reason = over_cap("the GPUs DRA claims hold on it", len(gpus), MAX_GPUS_PER_NODE)
                if reason:
                    over[node] = reason
    return claimed


def dra_facts_of(objects: Mapping[str, Iterable[Any]]) -> DraFacts:
    """:func:`dra_facts` of lists keyed by kind (:data:`~scheduler_core.k8s.names.DRA_OBJECTS`)."""
    return dra_facts(
        objects.get("resourceslices", ()), objects.get("resourceclaims", ()), objects.get("deviceclasses", ())
    )


def served_by_claim(status: Any) -> bool:
    """Whether a pod's ``nvidia.com/gpu`` is served by a DRA claim (KEP-5004): its
    ``status.extendedResourceClaimStatus`` maps that resource to a request of a claim.

    >>> served_by_claim({"extendedResourceClaimStatus": {"resourceClaimName": "p-extended-resources-x",
    ...     "requestMappings": [{"containerName": "c", "resourceName": "nvidia.com/gpu", "requestName": "r0"}]}})
    True
    """
    mappings = _mapping(_mapping(status).get("extendedResourceClaimStatus")).get("requestMappings")
    return any(_mapping(m).get("resourceName") == GPU_RESOURCE for m in _list(mappings))


def _device(driver: str, pool: str, spec: Mapping[str, Any], device: Any) -> tuple[str, str] | None:
    """(node, the GPU it is or is part of) for a device of a node-local slice; None for another kind of
    device, or one that is on no single node."""
    device = _mapping(device)
    basic = _mapping(device.get("basic"))  # v1beta1 wraps a device's fields in "basic"
    name = device.get("name")
    node = (
        (device.get("nodeName") or basic.get("nodeName"))
        if spec.get("perDeviceNodeSelection")
        else spec.get("nodeName")
    )
    if not isinstance(name, str) or not isinstance(node, str) or not node:
        return None
    attributes = _mapping(device.get("attributes") or basic.get("attributes"))
    kind = _attribute(attributes, driver, "type")
    if kind is not None and kind not in GPU_TYPES:
        return None
    gpu = _attribute(attributes, driver, "parentUUID" if kind == "mig" else "uuid")
    return node, gpu or f"{pool}/{name}"


def _attribute(attributes: Mapping[str, Any], driver: str, name: str) -> str | None:
    """A string attribute, by its short name or qualified by the driver's domain; None if it has none."""
    value = _mapping(attributes.get(name) or attributes.get(f"{driver}/{name}")).get("string")
    return value if isinstance(value, str) else None


def _selected_node(selector: Any) -> str:
    """The node an allocation's node selector names (``metadata.name In [node]``), or ""."""
    for term in _list(_mapping(selector).get("nodeSelectorTerms")):
        for match in _list(_mapping(term).get("matchFields")):
            match = _mapping(match)
            values = _list(match.get("values"))
            if match.get("key") == "metadata.name" and match.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return ""


def _name(item: Any, position: int, kind: str) -> str:
    metadata = _mapping(_mapping(item).get("metadata"))
    name = metadata.get("name") or f"{kind}[{position}]"
    namespace = metadata.get("namespace")
    return f"{kind[:-1]} {namespace}/{name}" if namespace else f"{kind[:-1]} {name}"


def _count(value: Any) -> int:
    """A non-negative integer, or -1."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else -1


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []
