"""What an autoscaler knows of a GPU node before it exists, and a pod's GPU needs said in its terms.

Karpenter and cluster-autoscaler add a node for a pending pod when their own simulation of
kube-scheduler says the pod fits a node they can launch. They read the pod's resources, node selector
and required node affinity; the product's annotations (``gpu.nvidia.com/model``,
``gpu.nvidia.com/memory``) are invisible to them, so a pod that wants an H100 may get an L40S node
that the extender then refuses.

- **Karpenter** (AWS provider) labels each instance type with its GPUs before it launches one
  (:data:`GPU_LABELS`: ``karpenter.k8s.aws/instance-gpu-name`` and the rest, from EC2's ``GpuInfo``),
  and its nodes keep those labels. It compares a pod's requirements on them with each instance type.
- **cluster-autoscaler** builds a template node per node group from the group's labels (EKS managed
  node groups' labels, or ``k8s.io/cluster-autoscaler/node-template/label/<key>`` tags on an ASG) and
  runs kube-scheduler's filters on it: requirements on the product's own labels
  (``gpu.nvidia.com/model|memory|count``) work once the node group declares them.

:func:`autoscaler_affinity` writes a pod's GPU needs as required node affinity both read: one term on
Karpenter's labels, one on the product's, ORed (Karpenter tries the terms in order and never launches
for the second, whose labels no NodePool defines; kube-scheduler admits a node that matches either).
The Karpenter term admits exactly the known instance types whose GPUs pass the extender's filter as
those GPUs report themselves (:data:`INSTANCE_TYPES`): EC2's memory figure, which Karpenter compares,
is not always what the GPUs report (an H100 of ``p5.48xlarge``: 81920 MiB to EC2, 81559 to NVML).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler_core.k8s.gpu_models import normalize_model
from scheduler_core.k8s.names import (
    KARPENTER_GPU_COUNT,
    KARPENTER_GPU_MANUFACTURER,
    KARPENTER_GPU_MEMORY,
    KARPENTER_GPU_NAME,
    LABEL_COUNT,
    LABEL_INSTANCE_TYPE,
    LABEL_MEMORY,
    LABEL_MODEL,
)
from scheduler_core.k8s.pods import PodDemand


@dataclass(frozen=True)
class GpuLabel:
    """One GPU fact, as each autoscaler reads it off a node that does not exist yet."""

    fact: str
    karpenter: str
    karpenter_value: str
    product: str
    product_value: str


GPU_LABELS: tuple[GpuLabel, ...] = (
    GpuLabel("GPU model", KARPENTER_GPU_NAME, "EC2's GPU name, lower case, spaces as `-`: `h100`, `a10g`, `l40s`",
             LABEL_MODEL, "the short model, upper case: `H100`"),
    GpuLabel("memory per GPU", KARPENTER_GPU_MEMORY, "MiB per GPU, EC2's figure (`MemoryInfo.SizeInMiB`)",
             LABEL_MEMORY, "MiB per GPU, as the GPUs report it (GFD's `nvidia.com/gpu.memory`), else EC2's"),
    GpuLabel("GPUs per node", KARPENTER_GPU_COUNT, "EC2's count", LABEL_COUNT, "the same count"),
    GpuLabel("manufacturer", KARPENTER_GPU_MANUFACTURER, "`nvidia` (`amd` on g4ad, which the product does not place)",
             "", "the product places NVIDIA GPUs only"),
)  # fmt: skip
"""The labels that carry each GPU fact. Karpenter's are set on every instance type with exactly one
kind of GPU (``computeRequirements`` in ``aws/karpenter-provider-aws``), and well known to Karpenter
(``WellKnownLabels``), so that a pod may require them though no NodePool names them. The product's are
written by the node-state refresher on each node (GFD first, else EC2), and are what a
cluster-autoscaler node group must declare (labels of an EKS managed node group, or
``k8s.io/cluster-autoscaler/node-template/label/gpu.nvidia.com/model`` tags on an ASG)."""


@dataclass(frozen=True)
class InstanceGpus:
    """An EC2 instance type's GPUs, as EC2 (and so Karpenter) describes them and as they report themselves."""

    instance_type: str
    gpu_name: str
    """EC2's ``GpuInfo.Gpus[0].Name``; Karpenter's ``instance-gpu-name`` is it lower-cased."""
    count: int
    ec2_mib: int
    """EC2's ``MemoryInfo.SizeInMiB`` per GPU: Karpenter's ``instance-gpu-memory``."""
    reported_mib: int | None = None
    """What the GPUs report (NVML's total, GFD's ``nvidia.com/gpu.memory``) where that is on record here;
    None where it is not."""

    @property
    def model(self) -> str:
        """The product's short model name (:func:`~scheduler_core.k8s.gpu_models.normalize_model`)."""
        return normalize_model(self.gpu_name) or self.gpu_name

    @property
    def karpenter_name(self) -> str:
        return self.gpu_name.lower().replace(" ", "-")

    @property
    def least_mib(self) -> int:
        """The least memory per GPU the extender may read on a node of this type: the refresher labels
        it with EC2's figure until GFD reports the GPUs' own, and the lower of the two stands."""
        return self.ec2_mib if self.reported_mib is None else min(self.ec2_mib, self.reported_mib)

    def karpenter_labels(self) -> dict[str, str]:
        """The labels Karpenter gives an instance type of this kind, and its nodes."""
        return {
            LABEL_INSTANCE_TYPE: self.instance_type,
            KARPENTER_GPU_NAME: self.karpenter_name,
            KARPENTER_GPU_MANUFACTURER: "nvidia",
            KARPENTER_GPU_COUNT: str(self.count),
            KARPENTER_GPU_MEMORY: str(self.ec2_mib),
        }


INSTANCE_TYPES: tuple[InstanceGpus, ...] = (
    InstanceGpus("p3.2xlarge", "V100", 1, 16384),
    InstanceGpus("p3.8xlarge", "V100", 4, 16384),
    InstanceGpus("p3.16xlarge", "V100", 8, 16384),
    InstanceGpus("p3dn.24xlarge", "V100", 8, 32768),
    InstanceGpus("p4d.24xlarge", "A100", 8, 40960, 40960),
    InstanceGpus("p4de.24xlarge", "A100", 8, 81920),
    InstanceGpus("p5.48xlarge", "H100", 8, 81920, 81559),
    InstanceGpus("p5e.48xlarge", "H200", 8, 144384, 143771),
    InstanceGpus("p5en.48xlarge", "H200", 8, 144384, 143771),
    InstanceGpus("p6-b200.48xlarge", "B200", 8, 183359),
    InstanceGpus("g4dn.xlarge", "T4", 1, 16384, 15360),
    InstanceGpus("g4dn.12xlarge", "T4", 4, 16384, 15360),
    InstanceGpus("g5.xlarge", "A10G", 1, 22888),
    InstanceGpus("g5.12xlarge", "A10G", 4, 22888),
    InstanceGpus("g5.48xlarge", "A10G", 8, 22888),
    InstanceGpus("g5g.xlarge", "T4g", 1, 16384),
    InstanceGpus("g6.xlarge", "L4", 1, 22888),
    InstanceGpus("g6.12xlarge", "L4", 4, 22888),
    InstanceGpus("g6e.xlarge", "L40S", 1, 45776, 46068),
    InstanceGpus("g6e.12xlarge", "L40S", 4, 45776, 46068),
    InstanceGpus("g6e.48xlarge", "L40S", 8, 45776, 46068),
)
"""The NVIDIA GPU instance types the product knows. EC2's figures are Karpenter's, as its generated
instance-type reference prints them (``website/content/en/preview/reference/instance-types.md`` in
``aws/karpenter-provider-aws``; the p3 rows from its v1.12 copy) and its EC2 test data confirms for
``g4dn``, ``g5`` and ``p5`` (``pkg/fake/zz_generated.describe_instance_types.go``). The reported
figures are those on record in this project: an H200's from ``../shared/fixtures/gpu/h200`` (NVML's
total), the others as GFD labels those nodes (``scheduler_core.simulator.synthetic.CATALOGUE``)."""


KNOWN_MODELS = frozenset(t.model for t in INSTANCE_TYPES)
"""The GPU models the product knows by name (those of :data:`INSTANCE_TYPES`); any a node has is known too."""


@dataclass(frozen=True)
class AutoscalerTerms:
    """A GPU demand in an autoscaler's terms: ``karpenter`` and ``product`` are the ``matchExpressions``
    to AND into a node selector term (empty: nothing to add), ``fits`` the known instance types whose
    GPUs pass the extender's filter, and ``refusal`` why none does ('' when one does)."""

    karpenter: tuple[dict[str, Any], ...] = ()
    product: tuple[dict[str, Any], ...] = ()
    fits: tuple[InstanceGpus, ...] = ()
    refusal: str = ""


def gpu_terms(demand: PodDemand, catalogue: Sequence[InstanceGpus] = INSTANCE_TYPES) -> AutoscalerTerms:
    """The requirements on each autoscaler's labels that say the GPU model and memory ``demand`` asks.

    The Karpenter term names the GPU models of the known instance types that fit and, where some known
    type of those models has too little memory, ``instance-gpu-memory Gt`` the largest EC2 figure of
    those (EC2's figures are what Karpenter compares); if no single bound separates them, the fitting
    instance types by name. The product's term says the model and the memory floor on the product's
    labels. A pod that names no model and no memory needs neither.

    >>> terms = gpu_terms(PodDemand(gpus=1, models=frozenset({"H100", "H200"}), min_memory_mib=81920))
    >>> [t.instance_type for t in terms.fits], terms.karpenter[0]["values"]
    (['p5e.48xlarge', 'p5en.48xlarge'], ['h200'])
    >>> gpu_terms(PodDemand(gpus=1, models=frozenset({"H100"}), min_memory_mib=81920)).refusal[:70]
    'no instance type the product knows has H100 GPUs that report 81920 MiB'
    """
    if not demand.wants_gpu or (demand.models is None and not demand.min_memory_mib):
        return AutoscalerTerms()
    of_models = [t for t in catalogue if demand.models is None or t.model in demand.models]
    fits = tuple(t for t in of_models if t.least_mib >= demand.min_memory_mib)
    wanted = "any" if demand.models is None else ",".join(sorted(demand.models))
    if not fits:
        known = "; ".join(f"{t.instance_type}: {t.least_mib}" for t in of_models) or "none of those models"
        most = max((t.least_mib for t in of_models), default=0)
        ask = f"; ask for {most // 1024}Gi ({most} MiB) or less to fit them" if most >= 1024 else ""
        return AutoscalerTerms(
            refusal=f"no instance type the product knows has {wanted} GPUs that report "
            f"{demand.min_memory_mib} MiB or more each (MiB per GPU as the GPUs report it: {known}){ask}"
        )
    names = sorted({t.karpenter_name for t in fits})
    karpenter: list[dict[str, Any]] = [_expression(KARPENTER_GPU_NAME, "In", names)]
    short = [t for t in catalogue if t.karpenter_name in names and t not in fits]
    if short:
        bound = max(t.ec2_mib for t in short)
        if all(t.ec2_mib > bound for t in fits):
            karpenter.append(_expression(KARPENTER_GPU_MEMORY, "Gt", [str(bound)]))
        else:  # EC2's figures do not separate them: name the instance types
            karpenter.append(_expression(LABEL_INSTANCE_TYPE, "In", sorted(t.instance_type for t in fits)))
    product: list[dict[str, Any]] = []
    if demand.models is not None:
        product.append(_expression(LABEL_MODEL, "In", sorted(demand.models)))
    if demand.min_memory_mib:
        product.append(_expression(LABEL_MEMORY, "Gt", [str(demand.min_memory_mib - 1)]))
    return AutoscalerTerms(tuple(karpenter), tuple(product), fits)


def autoscaler_affinity(pod: Mapping[str, Any], demand: PodDemand) -> tuple[list[dict[str, Any]] | None, str]:
    """The ``nodeSelectorTerms`` a pod's required node affinity should have so that an autoscaler reads
    its GPU needs (:func:`gpu_terms`): each term of its own ANDed with the Karpenter expressions, then
    each ANDed with the product's (a pod without terms has one empty term). ``(None, '')`` when there is
    nothing to add, or when its first term (the one Karpenter reads) carries the Karpenter expressions
    already; ``(None, why)`` when no known instance type fits.

    >>> terms, _ = autoscaler_affinity({"spec": {}}, PodDemand(gpus=1, models=frozenset({"L4"})))
    >>> [[e["key"] for e in term["matchExpressions"]] for term in terms]
    [['karpenter.k8s.aws/instance-gpu-name'], ['gpu.nvidia.com/model']]
    """
    terms = gpu_terms(demand)
    if terms.refusal:
        return None, terms.refusal
    if not terms.karpenter:
        return None, ""
    own = _own_terms(pod)
    if _has(own[0], terms.karpenter):
        return None, ""
    return [_with(term, terms.karpenter) for term in own] + [_with(term, terms.product) for term in own], ""


def autoscaler_hint(pod: Mapping[str, Any], demand: PodDemand) -> str:
    """For a pod that no node takes: which known instance types would pass, and, where its first term
    does not say its GPU needs in Karpenter's terms, that an autoscaler cannot see them. The filter adds
    it to its refusals (kube-scheduler's ``FailedScheduling`` event quotes them) and ``explain`` shows it;
    '' for a pod that names no GPU model or memory.

    >>> autoscaler_hint({"spec": {}}, PodDemand(gpus=1, models=frozenset({"L4"})))[:60]
    'instance types that fit: g6.xlarge, g6.12xlarge; an autoscal'
    """
    terms = gpu_terms(demand)
    if terms.refusal:
        return terms.refusal
    if not terms.karpenter:
        return ""
    names = [t.instance_type for t in terms.fits if t.count >= demand.gpus]  # the GPUs a node needs, too
    if not names:
        most = max(t.count for t in terms.fits)
        return (
            f"no instance type the product knows has {demand.gpus} GPUs of that kind on one node (the most: "
            f"{most}, {', '.join(t.instance_type for t in terms.fits if t.count == most)})"
        )
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    if _has(_own_terms(pod)[0], terms.karpenter):
        return f"instance types that fit: {shown}"
    return (
        f"instance types that fit: {shown}; an autoscaler cannot see this pod's GPU needs: add the node "
        "affinity `gpu-scheduler autoscaler-affinity` writes (docs/autoscalers.md)"
    )


def _own_terms(pod: Mapping[str, Any]) -> list[dict[str, Any]]:
    spec = pod.get("spec")
    affinity = spec.get("affinity") if isinstance(spec, Mapping) else None
    node = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(node, Mapping) else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    if not isinstance(terms, list) or not terms:
        return [{}]
    return [dict(term) if isinstance(term, Mapping) else {} for term in terms]


def _with(term: Mapping[str, Any], expressions: Sequence[dict[str, Any]]) -> dict[str, Any]:
    merged = dict(term)
    own = [e for e in term.get("matchExpressions") or [] if e not in expressions]
    merged["matchExpressions"] = [*own, *expressions]
    return merged


def _has(term: Mapping[str, Any], expressions: Sequence[dict[str, Any]]) -> bool:
    own = term.get("matchExpressions") or []
    return all(e in own for e in expressions)


def _expression(key: str, operator: str, values: list[str]) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": values}


def labels_table() -> str:
    """:data:`GPU_LABELS` as a Markdown table (``docs/autoscalers.md``)."""
    rows = ["| fact | Karpenter's label | its value | the product's label (cluster-autoscaler) | its value |",
            "|---|---|---|---|---|"]  # fmt: skip
    for label in GPU_LABELS:
        product = f"`{label.product}`" if label.product else "-"
        rows.append(
            f"| {label.fact} | `{label.karpenter}` | {label.karpenter_value} | {product} | {label.product_value} |"
        )
    return "\n".join(rows)


def instance_types_table() -> str:
    """:data:`INSTANCE_TYPES` as a Markdown table (``docs/autoscalers.md``)."""
    rows = ["| instance type | GPUs | `instance-gpu-name` | EC2 MiB per GPU | reported MiB per GPU |",
            "|---|---:|---|---:|---:|"]  # fmt: skip
    for t in INSTANCE_TYPES:
        reported = "not on record" if t.reported_mib is None else str(t.reported_mib)
        rows.append(f"| `{t.instance_type}` | {t.count} | `{t.karpenter_name}` | {t.ec2_mib} | {reported} |")
    return "\n".join(rows)
