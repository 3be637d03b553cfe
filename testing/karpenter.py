"""A test model of Karpenter's provisioning decision for one pending pod: which instance types it would
launch a node of. Karpenter does not run here; this is its documented, deterministic rule, written from
its source (``kubernetes-sigs/karpenter`` v1.14, ``aws/karpenter-provider-aws``):

- ``pkg/utils/pod/scheduling.go`` ``IsProvisionable``: kube-scheduler marked the pod ``Unschedulable``,
  and it is not bound, not nominated (preempting), not a DaemonSet's or a Node's (mirror) pod;
- ``pkg/scheduling/requirements.go``: a pod's requirements are its ``nodeSelector`` and the *first*
  required ``nodeSelectorTerm``; ``Compatible`` refuses a key the NodePool does not define unless it is
  well known (``WellKnownLabels``, with the AWS provider's instance labels) or the operator is
  ``NotIn``/``DoesNotExist``; ``Intersects`` needs, for each key both sides have, some value in common
  (two ``NotIn``/``DoesNotExist`` excepted);
- ``preferences.go``: if no instance type fits, the first required term is dropped while more than one
  is left, and the pod is tried again (the last term is never dropped);
- ``nodeclaim.go`` ``filterInstanceTypesByRequirements``: an instance type whose requirements intersect
  the NodePool's and the pod's, whose allocatable holds the pod's requests (``resources.Fits``; a
  resource it lacks counts as zero), with an offering in a zone the requirements allow;
- the NodePool's taints must be tolerated.

Karpenter then launches the cheapest of them; the product's claim is about all of them.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler_core.k8s.autoscaler import INSTANCE_TYPES, InstanceGpus
from scheduler_core.k8s.names import GPU_RESOURCE, LABEL_INSTANCE_TYPE, LABEL_ZONE
from scheduler_core.k8s.pod_requests import effective_cpu_milli, effective_request
from scheduler_core.k8s.taints import untolerated
from testing.kube_binaries import machine_folder

_INF = 2**63
WELL_KNOWN = frozenset({
    "karpenter.sh/nodepool", LABEL_ZONE, "topology.kubernetes.io/region", LABEL_INSTANCE_TYPE,
    "kubernetes.io/arch", "kubernetes.io/os", "karpenter.sh/capacity-type", "node.kubernetes.io/windows-build",
    # aws/karpenter-provider-aws pkg/apis/v1/labels.go init()
    "karpenter.k8s.aws/instance-category", "karpenter.k8s.aws/instance-family",
    "karpenter.k8s.aws/instance-generation", "karpenter.k8s.aws/instance-size",
    "karpenter.k8s.aws/instance-cpu", "karpenter.k8s.aws/instance-memory",
    "karpenter.k8s.aws/instance-gpu-name", "karpenter.k8s.aws/instance-gpu-manufacturer",
    "karpenter.k8s.aws/instance-gpu-count", "karpenter.k8s.aws/instance-gpu-memory",
    "topology.k8s.aws/zone-id",
})  # fmt: skip
"""``WellKnownLabels``: a pod may require them though no NodePool defines them."""
GPU_LABEL_KEYS = (
    "karpenter.k8s.aws/instance-gpu-name", "karpenter.k8s.aws/instance-gpu-manufacturer",
    "karpenter.k8s.aws/instance-gpu-count", "karpenter.k8s.aws/instance-gpu-memory",
)  # fmt: skip
VCPUS = {
    "p3.2xlarge": 8, "p3.8xlarge": 32, "p3.16xlarge": 64, "p3dn.24xlarge": 96, "p4d.24xlarge": 96,
    "p4de.24xlarge": 96, "p5.48xlarge": 192, "p5e.48xlarge": 192, "p5en.48xlarge": 192, "p6-b200.48xlarge": 192,
    "g4dn.xlarge": 4, "g4dn.12xlarge": 48, "g5.xlarge": 4, "g5.12xlarge": 48, "g5.48xlarge": 192,
    "g5g.xlarge": 4, "g6.xlarge": 4, "g6.12xlarge": 48, "g6e.xlarge": 4, "g6e.12xlarge": 48, "g6e.48xlarge": 192,
    "m5.large": 2, "m5.4xlarge": 16,
}  # fmt: skip
"""vCPUs per instance type (EC2), for ``Fits`` only."""


@dataclass(frozen=True)
class Requirement:
    """Karpenter's ``scheduling.Requirement``: a set of values (or its complement), with integer bounds."""

    complement: bool
    values: frozenset[str] = frozenset()
    greater_than: int = -_INF
    less_than: int = _INF

    @classmethod
    def of(cls, operator: str, values: Iterable[str] = ()) -> Requirement:
        given = frozenset(values)
        if operator == "In":
            return cls(False, given)
        if operator == "NotIn":
            return cls(True, given)
        if operator == "Exists":
            return cls(True)
        if operator == "DoesNotExist":
            return cls(False)
        if operator in ("Gt", "Gte", "Lt", "Lte"):
            (value,) = given
            bound = int(value) + {"Gt": 0, "Gte": -1, "Lt": 0, "Lte": 1}[operator]
            return cls(True, greater_than=bound) if operator in ("Gt", "Gte") else cls(True, less_than=bound)
        raise ValueError(f"unknown operator {operator!r}")

    def _allows(self, value: str) -> bool:
        if self.greater_than > -_INF or self.less_than < _INF:
            try:
                number = int(value)
            except ValueError:
                return False
            if not self.greater_than < number < self.less_than:
                return False
        return (value in self.values) != self.complement

    def intersection(self, other: Requirement) -> Requirement:
        gt, lt = max(self.greater_than, other.greater_than), min(self.less_than, other.less_than)
        if self.complement and other.complement:
            return Requirement(True, self.values | other.values, gt, lt)
        pool = self.values if not self.complement else other.values
        kept = frozenset(v for v in pool if self._allows(v) and other._allows(v))
        return Requirement(False, kept)

    def __len__(self) -> int:
        if not self.complement:
            return len(self.values)
        return 0 if self.greater_than >= self.less_than - 1 else _INF

    @property
    def operator(self) -> str:
        if self.complement:
            return "Exists" if not self.values else "NotIn"
        return "In" if self.values else "DoesNotExist"


Requirements = dict[str, Requirement]


def requirements(expressions: Iterable[Mapping[str, Any]]) -> Requirements:
    """``matchExpressions`` as Karpenter's ``Requirements``; a key given twice is the intersection."""
    out: Requirements = {}
    for e in expressions:
        req = Requirement.of(e["operator"], e.get("values") or ())
        out[e["key"]] = out[e["key"]].intersection(req) if e["key"] in out else req
    return out


def add(base: Requirements, more: Requirements) -> Requirements:
    out = dict(base)
    for key, req in more.items():
        out[key] = out[key].intersection(req) if key in out else req
    return out


def intersects(existing: Requirements, incoming: Requirements) -> str:
    """``Requirements.Intersects``: '' when every key both have has a value in common, else why not."""
    for key in existing.keys() & incoming.keys():
        if len(existing[key].intersection(incoming[key])) == 0:
            quiet = ("NotIn", "DoesNotExist")
            if incoming[key].operator in quiet and existing[key].operator in quiet:
                continue
            return f"key {key}, {incoming[key].operator} not in {existing[key].operator}"
    return ""


def compatible(base: Requirements, pod: Requirements, allow_undefined: frozenset[str] = WELL_KNOWN) -> str:
    """``Requirements.Compatible`` with ``AllowUndefinedWellKnownLabels``."""
    for key, req in pod.items():
        if key in allow_undefined or key in base or req.operator in ("NotIn", "DoesNotExist"):
            continue
        return f'label "{key}" does not have known values'
    return intersects(base, pod)


@dataclass(frozen=True)
class InstanceType:
    name: str
    labels: Mapping[str, str]
    allocatable: Mapping[str, int]
    """cpu in milli-cores, ``nvidia.com/gpu``, pods."""
    zones: tuple[str, ...] = ("us-east-1a", "us-east-1b", "us-east-1c")

    def requirements(self) -> Requirements:
        out = {key: Requirement.of("In", [value]) for key, value in self.labels.items()}
        for key in GPU_LABEL_KEYS:
            out.setdefault(key, Requirement.of("DoesNotExist"))
        out[LABEL_ZONE] = Requirement.of("In", self.zones)
        out["karpenter.sh/capacity-type"] = Requirement.of("In", ["on-demand", "spot"])
        return out

    @classmethod
    def of_gpus(cls, gpus: InstanceGpus) -> InstanceType:
        family, size = gpus.instance_type.split(".")
        labels = {**gpus.karpenter_labels(), "karpenter.k8s.aws/instance-family": family,
                  "karpenter.k8s.aws/instance-size": size, "karpenter.k8s.aws/instance-category": family[0],
                  "kubernetes.io/arch": "arm64" if family.endswith("g") else "amd64"}  # fmt: skip
        cpu = VCPUS[gpus.instance_type] * 1000
        return cls(gpus.instance_type, labels, {"cpu": cpu - 200, GPU_RESOURCE: gpus.count, "pods": 110})

    @classmethod
    def plain(cls, name: str) -> InstanceType:
        family, size = name.split(".")
        labels = {LABEL_INSTANCE_TYPE: name, "karpenter.k8s.aws/instance-family": family,
                  "karpenter.k8s.aws/instance-size": size, "karpenter.k8s.aws/instance-category": family[0],
                  "kubernetes.io/arch": "amd64"}  # fmt: skip
        return cls(name, labels, {"cpu": VCPUS[name] * 1000 - 200, "pods": 110})


CATALOGUE = (*(InstanceType.of_gpus(t) for t in INSTANCE_TYPES), InstanceType.plain("m5.large"),
             InstanceType.plain("m5.4xlarge"))  # fmt: skip
"""The instance types the model launches: the GPU ones the product knows, and two without GPUs."""


@dataclass(frozen=True)
class NodePool:
    name: str
    expressions: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()

    def requirements(self) -> Requirements:
        base = requirements(self.expressions)
        base = add(base, {k: Requirement.of("In", [v]) for k, v in self.labels.items()})
        return add(base, {"karpenter.sh/nodepool": Requirement.of("In", [self.name])})

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> NodePool:
        spec = manifest["spec"]["template"]["spec"]
        return cls(
            manifest["metadata"]["name"],
            tuple(spec.get("requirements") or ()),
            dict((manifest["spec"]["template"].get("metadata") or {}).get("labels") or {}),
            tuple(spec.get("taints") or ()),
        )


def is_provisionable(pod: Mapping[str, Any]) -> bool:
    """``IsProvisionable``."""
    status, spec = pod.get("status") or {}, pod.get("spec") or {}
    unschedulable = any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable" for c in status.get("conditions") or ()
    )
    owners = pod.get("metadata", {}).get("ownerReferences") or ()
    owned = any((o.get("apiVersion"), o.get("kind")) in (("apps/v1", "DaemonSet"), ("v1", "Node")) for o in owners)
    return unschedulable and not spec.get("nodeName") and not status.get("nominatedNodeName") and not owned


def pod_requirements(pod: Mapping[str, Any], term: int = 0) -> Requirements:
    """The pod's ``nodeSelector`` and its required node affinity's ``term``-th term."""
    spec = pod.get("spec") or {}
    out = {k: Requirement.of("In", [v]) for k, v in (spec.get("nodeSelector") or {}).items()}
    terms = _terms(pod)
    if terms:
        out = add(out, requirements(terms[term].get("matchExpressions") or ()))
    return out


def _terms(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    affinity = ((pod.get("spec") or {}).get("affinity") or {}).get("nodeAffinity") or {}
    return list((affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    spec = pod.get("spec") or {}
    return {"cpu": effective_cpu_milli(spec), GPU_RESOURCE: effective_request(spec, GPU_RESOURCE), "pods": 1,
            **{r: 1 for r in _other_extended(spec)}}  # fmt: skip


def _other_extended(spec: Mapping[str, Any]) -> set[str]:
    """Extended resources other than ``nvidia.com/gpu`` (a share's ``gpu-scheduler.io/gpu-milli``): no
    instance type has them, so a pod that asks one fits none."""
    found = set()
    for container in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        for part in ("limits", "requests"):
            found |= {r for r in ((container.get("resources") or {}).get(part) or {}) if "/" in r and r != GPU_RESOURCE}
    return found


def fits(requests: Mapping[str, int], allocatable: Mapping[str, int]) -> bool:
    """``resources.Fits``: each request at most the allocatable, a missing one counting zero."""
    return all(amount <= allocatable.get(name, 0) for name, amount in requests.items() if amount)


def launchable(
    pod: Mapping[str, Any], pools: Sequence[NodePool], catalogue: Sequence[InstanceType] = CATALOGUE
) -> list[tuple[str, str]]:
    """``(nodepool, instance type)`` of every node Karpenter could launch for ``pod``, after relaxing its
    required terms as it does; empty when it would launch none."""
    if not is_provisionable(pod):
        return []
    requests = pod_requests(pod)
    tolerated = [p for p in pools if not untolerated({"spec": {"taints": list(p.taints)}}, pod)]
    for term in range(max(1, len(_terms(pod)))):
        wanted = pod_requirements(pod, term)
        found = []
        for pool in tolerated:
            base = pool.requirements()
            if compatible(base, wanted):
                continue
            combined = add(base, wanted)
            found += [(pool.name, it.name) for it in catalogue
                      if not intersects(it.requirements(), combined) and fits(requests, it.allocatable)]  # fmt: skip
        if found:
            return found
    return []


def pending(pod: Mapping[str, Any]) -> dict[str, Any]:
    """``pod`` as kube-scheduler leaves one it could not place: ``PodScheduled`` False, ``Unschedulable``."""
    out = dict(pod)
    out["status"] = {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}  # fmt: skip
    return out


def karpenter_node(name: str, gpus: InstanceGpus, pool: NodePool, zone: str = "us-east-1a") -> dict[str, Any]:
    """A v1 Node as Karpenter launches one of ``gpus``'s type in ``pool``, before GFD or the node-state
    refresher label its GPUs: the instance type's labels, the pool's template labels and taints, and the
    allocatable the device plugin then reports."""
    it = InstanceType.of_gpus(gpus)
    labels = {
        **it.labels, **pool.labels, "karpenter.sh/nodepool": pool.name, "karpenter.sh/capacity-type": "on-demand",
        "karpenter.sh/registered": "true", "karpenter.sh/initialized": "true", "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux", LABEL_ZONE: zone, "topology.kubernetes.io/region": zone[:-1],
    }  # fmt: skip
    resources = {"cpu": f"{it.allocatable['cpu']}m", "memory": f"{VCPUS[gpus.instance_type] * 7}Gi", "pods": "110",
                 GPU_RESOURCE: str(gpus.count)}  # fmt: skip
    return {
        "metadata": {"name": name, "uid": f"uid-{name}", "labels": labels},
        "spec": {
            "providerID": f"aws:///{zone}/i-{zlib.crc32(name.encode()):08x}",
            "taints": [dict(t) for t in pool.taints],
        },
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


SHARED_KARPENTER = Path(__file__).resolve().parent.parent.parent / "shared" / "fixtures" / "karpenter"
"""Where ``../shared`` keeps Karpenter's files (its README says which tag and commit each is from)."""


def karpenter_source() -> Path | str:
    """The folder of Karpenter's own files the tests read: the NodePool and EC2NodeClass CRDs of
    ``aws/karpenter-provider-aws`` v1.14.1 (``pkg/apis/crds/``) and its generated instance-type reference
    (``website/content/en/v1.14`` and ``v1.12/reference/instance-types.md``). ``$KARPENTER_SOURCE_DIR``
    where it is set, else ``../shared/fixtures/karpenter`` where it has them, else the machine's cache
    folder beside the Kubernetes binaries; none of them is ever committed. A reason (str) when the folder
    lacks them."""
    explicit = os.environ.get("KARPENTER_SOURCE_DIR")
    if explicit:
        folder = Path(explicit)
    elif all((SHARED_KARPENTER / name).is_file() for name in SOURCE_FILES):
        folder = SHARED_KARPENTER
    else:
        folder = machine_folder().parent / "karpenter"
    missing = [name for name in SOURCE_FILES if not (folder / name).is_file()]
    if missing:
        shown = ", ".join(missing)
        return f"Karpenter's source files are not in {folder} ({shown}): docs/autoscalers.md says how to get them"
    return folder


SOURCE_FILES = ("karpenter.sh_nodepools.yaml", "karpenter.k8s.aws_ec2nodeclasses.yaml", "instance-types.md",
                "instance-types-v1.12.md")  # fmt: skip
