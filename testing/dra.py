"""DRA objects as NVIDIA's DRA driver (``gpu.nvidia.com``) publishes them, for tests: no driver runs here.

The devices carry the attributes the driver's ``cmd/gpu-kubelet-plugin/deviceinfo.go`` writes (``type``,
``uuid``, ``parentUUID`` and ``profile`` for MIG devices, ``productName``, ``architecture``, versions,
``pcieBusID``) with the facts a real H200 reported (``../shared/fixtures/gpu/h200/nvml.json``): its name,
driver, compute capability, memory, and GPU 0's UUID; the other GPUs' UUIDs follow its pattern. A GPU with
MIG on is published as its MIG devices only, as the driver does without partitionable devices.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from scheduler_core.k8s.names import DRA_GPU_DRIVER
from testing.control_plane import REPO

H200_FACTS = REPO.parent / "shared" / "fixtures" / "gpu" / "h200" / "nvml.json"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"


def _h200() -> dict[str, Any]:
    """The real H200's facts where the fixture is present; the same values written out otherwise."""
    if H200_FACTS.is_file():
        facts = json.loads(H200_FACTS.read_text())
        gpu = facts["gpus"][0]
        return {"name": gpu["name"], "uuid": gpu["uuid"], "memory": gpu["memory_total_bytes"],
                "driver": facts["driver"], "cc": ".".join(map(str, gpu["cc"]))}  # fmt: skip
    return {"name": "NVIDIA H200", "uuid": "GPU-f4ece6de-2ed3-261b-742e-c0d1f016a17d", "memory": 150754820096,
            "driver": "580.159.04", "cc": "9.0"}  # fmt: skip


def gpu_uuid(node: str, index: int) -> str:
    """A UUID per (node, GPU) in the real one's pattern (its last group made unique)."""
    real = _h200()["uuid"]
    return f"{real[:-12]}{hashlib.sha256(f'{node}/{index}'.encode()).hexdigest()[:12]}"


def _semver(text: str) -> str:
    parts = [str(int(p)) for p in text.split(".")] + ["0", "0"]
    return ".".join(parts[:3])


def h200_devices(
    node: str, gpus: int = 8, mig: dict[int, list[str]] | None = None, *, v1beta1: bool = False
) -> list[dict[str, Any]]:
    """The devices of a node with ``gpus`` H200s; ``mig`` maps a GPU index to the MIG profiles cut on it."""
    facts = _h200()
    common = {
        "productName": {"string": facts["name"]},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": _semver(facts["cc"])},
        "driverVersion": {"version": _semver(facts["driver"])},
    }
    devices = []
    for index in range(gpus):
        uuid = gpu_uuid(node, index)
        bus = {"pcieBusID": {"string": f"00000000:{index * 2 + 6:02x}:00.0"}}
        profiles = (mig or {}).get(index)
        if not profiles:
            attributes = {"type": {"string": "gpu"}, "uuid": {"string": uuid}, **common, **bus}
            capacity = {"memory": {"value": str(facts["memory"])}}
            devices.append(_device(f"gpu-{index}", attributes, capacity, v1beta1))
            continue
        for k, profile in enumerate(profiles):
            attributes = {"type": {"string": "mig"}, "uuid": {"string": f"MIG-{uuid[4:-4]}{k:04x}"},
                          "parentUUID": {"string": uuid}, "profile": {"string": profile}, **common, **bus}  # fmt: skip
            name = f"gpu-{index}-mig-{profile.replace('.', '')}-{k}"
            devices.append(_device(name, attributes, {"multiprocessors": {"value": "16"}}, v1beta1))
    return devices


def _device(name: str, attributes: dict[str, Any], capacity: dict[str, Any], v1beta1: bool) -> dict[str, Any]:
    if v1beta1:
        return {"name": name, "basic": {"attributes": attributes, "capacity": capacity}}
    return {"name": name, "attributes": attributes, "capacity": capacity}


def resource_slice(api: str, node: str, devices: list[dict[str, Any]], *, generation: int = 1,
                   count: int = 1, part: int = 0) -> dict[str, Any]:  # fmt: skip
    """One slice of ``node``'s pool (the driver names the pool after the node)."""
    return {
        "apiVersion": api,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRA_GPU_DRIVER}-{generation}-{part}"},
        "spec": {
            "driver": DRA_GPU_DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }


def device_classes(api: str) -> list[dict[str, Any]]:
    """The driver's classes: whole GPUs, and MIG devices."""

    def cls(name: str, kind: str) -> dict[str, Any]:
        expression = f"device.driver == '{DRA_GPU_DRIVER}' && device.attributes['{DRA_GPU_DRIVER}'].type == '{kind}'"
        return {"apiVersion": api, "kind": "DeviceClass", "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expression}}]}}  # fmt: skip

    return [cls(GPU_CLASS, "gpu"), cls(MIG_CLASS, "mig")]


def claim(api: str, namespace: str, name: str, requests: list[dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": api, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": requests}}}  # fmt: skip


def exactly(name: str, device_class: str, count: int = 1, selector: str = "") -> dict[str, Any]:
    """A request for ``count`` devices of a class (``v1beta2`` and ``v1``: under ``exactly``)."""
    body: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    if selector:
        body["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": body}


def first_available(name: str, *choices: tuple[str, str, int]) -> dict[str, Any]:
    """A request with ``firstAvailable`` sub-requests: (name, class, count), in order of preference."""
    return {"name": name, "firstAvailable": [
        {"name": sub, "deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
        for sub, device_class, count in choices
    ]}  # fmt: skip


def allocated(api: str, namespace: str, name: str, node: str, devices: list[str], *,
              reserved_for: str = "", admin: bool = False) -> dict[str, Any]:  # fmt: skip
    """A claim as kube-scheduler leaves it once it allocated ``devices`` of ``node``'s pool (and, with
    ``reserved_for``, reserved it for that pod): for the API double, where no scheduler runs."""
    body = claim(api, namespace, name, [exactly("gpu", GPU_CLASS, len(devices))])
    results = [{"request": "gpu", "driver": DRA_GPU_DRIVER, "pool": node, "device": device,
                **({"adminAccess": True} if admin else {})} for device in devices]  # fmt: skip
    selector = {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    body["status"] = {"allocation": {"devices": {"results": results}, "nodeSelector": selector}}
    if reserved_for:
        body["status"]["reservedFor"] = [{"resource": "pods", "name": reserved_for, "uid": f"uid-{reserved_for}"}]
    return body
