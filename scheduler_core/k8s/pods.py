"""What a pod asks for, and what bound pods already use.

The effective ``nvidia.com/gpu`` request follows kube-scheduler's ``resource.PodRequests``: the larger
of the sum over app containers (plus restartable "sidecar" init containers, which run alongside
them) and the largest init container (plus the sidecars started before it). For an extended
resource the request defaults to the limit, so a limit with no request counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, TypeGuard

import numpy as np

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.annotations import Peer, parse_peers
from scheduler_core.k8s.gpu_models import normalize_model
from scheduler_core.k8s.mig import resource_profile
from scheduler_core.k8s.names import (
    ACCEPT_MIG_ANNOTATION,
    GPU_RESOURCE,
    LABEL_MEMORY,
    LABEL_MODEL,
    MIG_RESOURCE_PREFIX,
    MILLI_RESOURCE,
    PEERS_ANNOTATION,
    TERMINAL_PHASES,
)
from scheduler_core.k8s.node_affinity import affinity_models, required_affinity
from scheduler_core.k8s.quantity import MIB, parse_quantity, parse_whole_count, plain_int, shown, unitless

_INT32_MAX = int(np.iinfo(np.int32).max)
MAX_MODELS_CHARS = 1024
"""Longest ``gpu.nvidia.com/model`` value read: 16 model names of a full label value's 63 characters."""
MAX_MEMORY_CHARS = 64
"""Longest ``gpu.nvidia.com/memory`` value read (a quantity's own bound,
:data:`~scheduler_core.k8s.quantity.MAX_QUANTITY_CHARS`)."""


@dataclass(frozen=True)
class PodDemand:
    """The GPU needs of one pod.

    Attributes
    ----------
    gpus : int
        GPUs the pod takes: its whole-GPU request (``nvidia.com/gpu``, or ``gpu-scheduler.io/gpu-milli``
        in multiples of 1000), or 1 for a share of one GPU; 0 means the pod needs no GPU.
    share : int
        Milli of one GPU (1..999) for a ``gpu-scheduler.io/gpu-milli`` share; 0 otherwise.
    milli_managed : bool
        The pod asks through ``gpu-scheduler.io/gpu-milli``, which kube-scheduler does not account:
        the extender's bind must record it.
    models : frozenset of str, or None
        Allowed short model names (``{"A100", "H100"}``); ``None`` allows any model.
    min_memory_mib : int
        Minimum memory per GPU in MiB; 0 means no constraint.
    peers : tuple of Peer
        Workloads the pod talks to (annotation ``gpu-scheduler.io/peers``), for locality scoring.
    mig : tuple of (profile, count)
        MIG slices the pod requests as ``nvidia.com/mig-<profile>`` (the device plugin's ``mixed``
        strategy), by profile name (:func:`~scheduler_core.k8s.mig.parse_profile`), sorted.
    accept_mig_slices : bool
        Annotation ``gpu-scheduler.io/accept-mig-slices: "true"``: each ``nvidia.com/gpu`` may be a MIG
        slice (a node under the ``single`` strategy).
    """

    namespace: str = ""
    name: str = ""
    uid: str = ""
    gpus: int = 0
    share: int = 0
    milli_managed: bool = False
    models: frozenset[str] | None = None
    min_memory_mib: int = 0
    peers: tuple[Peer, ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    mig: tuple[tuple[str, int], ...] = ()
    accept_mig_slices: bool = False

    @property
    def wants_gpu(self) -> bool:
        """The pod takes a GPU or a MIG slice of one."""
        return self.gpus > 0 or bool(self.mig)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def counted_by_scheduler(self) -> bool:
        """The pod asks for whole ``nvidia.com/gpu``, which kube-scheduler counts itself (an extended
        resource it does not ignore): the extender never refuses a node for its count."""
        return self.gpus > 0 and not self.milli_managed


def pod_demand(pod: Mapping[str, Any]) -> PodDemand:
    """Read a v1 Pod's GPU demand.

    Raises
    ------
    InvalidPodError
        If a GPU quantity or a GPU annotation is invalid, or longer than the product reads
        (:data:`MAX_MODELS_CHARS`, :data:`MAX_MEMORY_CHARS`, and for ``gpu-scheduler.io/peers`` and
        quantities their parsers' bounds). The message names the field and the value that arrived, cut
        to 64 characters.

    Examples
    --------
    >>> pod = {"metadata": {"name": "p", "annotations": {"gpu.nvidia.com/model": "a100,H100",
    ...                                                   "gpu.nvidia.com/memory": "40Gi"}},
    ...        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
    >>> d = pod_demand(pod)
    >>> d.gpus, sorted(d.models), d.min_memory_mib
    (2, ['A100', 'H100'], 40960)
    """
    metadata = pod.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    annotations = metadata.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    spec = pod.get("spec")
    if spec is not None and not isinstance(spec, Mapping):
        raise InvalidPodError(f"pod spec: expected an object, got {type(spec).__name__}")
    return PodDemand(
        namespace=_text(metadata.get("namespace")),
        name=_text(metadata.get("name")),
        uid=_text(metadata.get("uid")),
        **_gpu_request(spec or {}),
        models=_allowed_models(parse_models(annotations.get(LABEL_MODEL)), pod),
        min_memory_mib=_parse_memory_mib(annotations.get(LABEL_MEMORY)),
        peers=parse_peers(annotations[PEERS_ANNOTATION]) if PEERS_ANNOTATION in annotations else (),
        labels=_string_map(metadata.get("labels")),
        mig=mig_request(spec or {}),
        accept_mig_slices=annotations.get(ACCEPT_MIG_ANNOTATION) == "true",
    )


def _mig_resources(spec: Mapping[str, Any]) -> tuple[str, ...]:
    """The ``nvidia.com/mig-*`` resource names any container of the pod names, sorted (usually none: one
    look at each container's two maps, with no quantity parsed)."""
    found: set[str] = set()
    for key in ("containers", "initContainers"):
        for container in _container_list(spec, key):
            section = container.get("resources")
            if not _is_mapping(section):
                continue
            for part in ("limits", "requests"):
                amounts = section.get(part)
                if _is_mapping(amounts):
                    found.update(r for r in amounts if isinstance(r, str) and r.startswith(MIG_RESOURCE_PREFIX))
    return tuple(sorted(found))


def mig_request(spec: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """The pod's MIG slices, ``((profile, count), ...)``, by kube-scheduler's rule for extended resources.

    Raises
    ------
    InvalidPodError
        A ``nvidia.com/mig-*`` name that is not a MIG profile, or a bad quantity; the message names it.

    >>> mig_request({"containers": [{"resources": {"limits": {"nvidia.com/mig-1g.18gb": "2"}}}]})
    (('1g.18gb', 2),)
    """
    resources = _mig_resources(spec)
    if not resources:
        return ()
    profiles = []
    for resource in resources:
        profile = resource_profile(resource)
        if profile is None:
            raise InvalidPodError(
                f"resource {resource[:64]!r} is not a MIG profile (nvidia.com/mig-<g>g.<memory>gb, as 1g.18gb)"
            )
        profiles.append(profile.name)
    merged: dict[str, int] = {}  # two spellings of one profile ("+me", ".me") are one
    for name, count in zip(profiles, effective_requests(spec, resources), strict=True):
        if count > 0:
            merged[name] = merged.get(name, 0) + count
    return tuple(sorted(merged.items()))


def _gpu_request(spec: Mapping[str, Any]) -> dict[str, Any]:
    """``gpus``, ``share`` and ``milli_managed`` of a pod spec: whole GPUs or one share, never both.

    >>> _gpu_request({"containers": [{"resources": {"limits": {"gpu-scheduler.io/gpu-milli": "250"}}}]})
    {'gpus': 1, 'share': 250, 'milli_managed': True}
    """
    whole, milli = effective_requests(spec, (GPU_RESOURCE, MILLI_RESOURCE))
    if not milli:
        return {"gpus": whole, "share": 0, "milli_managed": False}
    if whole:
        raise InvalidPodError(
            f"requests both {GPU_RESOURCE}={whole} and {MILLI_RESOURCE}={milli}; ask for one or the other"
        )
    if milli >= 1000:  # no device plugin would give such a pod a device, and no reservation pod holds its GPUs
        raise InvalidPodError(
            f"{MILLI_RESOURCE}={milli}: a share is 1..999 milli of one GPU; ask for whole GPUs as {GPU_RESOURCE}"
            f" ({milli // 1000 if milli % 1000 == 0 else 'a whole number of'}), which the device plugin gives"
            " their devices"
        )
    return {"gpus": 1, "share": milli, "milli_managed": True}


def effective_gpu_request(spec: Mapping[str, Any]) -> int:
    """Effective whole-GPU request of a pod spec (see the module docstring).

    >>> effective_gpu_request({"containers": [{"resources": {"requests": {"nvidia.com/gpu": "1"}}}] * 2,
    ...                        "initContainers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]})
    4
    """
    return effective_request(spec, GPU_RESOURCE)


def effective_request(spec: Mapping[str, Any], resource: str) -> int:
    """Effective request of the whole-number extended ``resource`` (see the module docstring).

    Raises
    ------
    InvalidPodError
        A malformed container list or quantity, or a total past int32; the message names the field.
    """
    return effective_requests(spec, (resource,))[0]


def effective_requests(spec: Mapping[str, Any], resources: tuple[str, ...]) -> list[int]:
    """:func:`effective_request` of several resources in one pass over the containers."""
    totals = _combine(spec, resources, None)
    _check_range(resources, totals)
    return totals


def effective_cpu_milli(spec: Mapping[str, Any]) -> int:
    """The pod's CPU request in milli-cores, as kube-scheduler counts it: the containers by the rule in
    the module docstring, plus ``spec.overhead`` (RuntimeClass). A container's request is its
    ``requests.cpu``, else its ``limits.cpu`` (what the API server defaults it to); fractions of a
    milli-core round up.

    Raises
    ------
    InvalidPodError
        A malformed container list or CPU quantity; the message names the field.

    >>> effective_cpu_milli({"containers": [{"resources": {"requests": {"cpu": "1.5"}}},
    ...                                     {"resources": {"limits": {"cpu": "250m"}}}],
    ...                      "overhead": {"cpu": "100m"}})
    1850
    """
    _, cpu, problem = requests_with_cpu(spec, ())
    if problem:
        raise InvalidPodError(problem)
    return cpu


def assumed_cpu_milli(pod: Any) -> int:
    """:func:`effective_cpu_milli` of a Pod object, or 0 when it has no readable CPU request: for an
    assumption the extender makes about its own decision, where kube-scheduler has read the request
    already (prioritize reports a malformed one itself).

    >>> assumed_cpu_milli({"spec": {"containers": [{"resources": {"requests": {"cpu": "2"}}}]}})
    2000
    >>> assumed_cpu_milli({"spec": {"containers": [{"resources": {"requests": {"cpu": "half"}}}]}})
    0
    """
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        return 0
    try:
        return effective_cpu_milli(spec)
    except InvalidPodError:
        return 0


def requests_with_cpu(spec: Mapping[str, Any], resources: tuple[str, ...]) -> tuple[list[int], int, str]:
    """:func:`effective_requests` of ``resources`` and :func:`effective_cpu_milli`, in one pass over the
    containers (the refresher reads every pod). A bad CPU quantity does not void the others: the CPU
    then counts 0 and the third value says why ('' otherwise).

    Raises
    ------
    InvalidPodError
        As :func:`effective_requests` does.
    """
    problems: list[str] = []
    *totals, cpu = _combine(spec, resources, problems)
    _check_range(resources, totals)
    overhead = spec.get("overhead")
    if _is_mapping(overhead) and "cpu" in overhead:
        try:
            cpu += cpu_milli(overhead["cpu"], "spec.overhead.cpu")
        except InvalidPodError as exc:
            problems.append(str(exc))
    return totals, (0 if problems else cpu), "; ".join(problems)


def _check_range(resources: tuple[str, ...], totals: list[int]) -> None:
    for resource, total in zip(resources, totals, strict=True):
        if total > _INT32_MAX:
            raise InvalidPodError(f"{resource}: request of {total} is out of range")


def _combine(spec: Mapping[str, Any], resources: tuple[str, ...], cpu_problems: list[str] | None) -> list[int]:
    """kube-scheduler's ``PodRequests`` of ``resources``, and of CPU (last) when ``cpu_problems`` is a
    list, which collects bad CPU quantities (counted 0) instead of raising."""
    app = (
        _container_counts(container, ("containers", i), resources, cpu_problems)
        for i, container in enumerate(_container_list(spec, "containers"))
    )
    init = (
        (container.get("restartPolicy") == "Always",
         _container_counts(container, ("initContainers", i), resources, cpu_problems))
        for i, container in enumerate(_container_list(spec, "initContainers"))
    )  # fmt: skip
    return combine_requests(app, init, len(resources) + (cpu_problems is not None))


def combine_requests(app: Iterable[Sequence[int]], init: Iterable[tuple[bool, Sequence[int]]], n: int) -> list[int]:
    """A pod's request of ``n`` resources from its containers' (kube-scheduler's ``PodRequests``): the
    larger of the app containers' sum plus the restartable init containers' (sidecars, which run beside
    them), and the peak while the init containers run in order (each with the sidecars started before
    it). ``init`` gives each init container as (restartable, amounts).

    >>> combine_requests([[1, 0]], [(False, [4, 1]), (True, [2, 2])], 2)
    [4, 2]
    """
    app_total = [0] * n
    for amounts in app:
        for k, amount in enumerate(amounts):
            app_total[k] += amount
    sidecars = [0] * n
    init_peak = [0] * n
    for restartable, amounts in init:
        for k, amount in enumerate(amounts):
            if restartable:
                sidecars[k] += amount
                init_peak[k] = max(init_peak[k], sidecars[k])
            else:
                init_peak[k] = max(init_peak[k], sidecars[k] + amount)
    return [max(total + side, peak) for total, side, peak in zip(app_total, sidecars, init_peak, strict=True)]


def cpu_milli(value: object, what: str) -> int:
    """A non-negative CPU quantity in milli-cores, rounded up (``resource.Quantity.MilliValue``);
    :class:`InvalidPodError` naming ``what`` otherwise.

    >>> cpu_milli("250m", "cpu"), cpu_milli("2", "cpu"), cpu_milli("0.0005", "cpu")
    (250, 2000, 1)
    """
    fast = _plain_cpu_milli(value)
    if fast is not None:
        return fast
    quantity = non_negative_quantity(value, what)
    # At most 64 characters (parse_quantity's bound), so times 1000 stays far inside Decimal's range.
    milli = int((quantity * 1000).to_integral_value(rounding="ROUND_CEILING"))
    if milli > _INT32_MAX:
        raise InvalidPodError(f"{what}: {shown(value)} is out of range")
    return milli


def non_negative_quantity(value: object, what: str) -> Decimal:
    """A resource quantity (``parse_quantity``) that is not negative; :class:`InvalidPodError` naming
    ``what`` otherwise.

    >>> non_negative_quantity("1Gi", "memory")
    Decimal('1073741824')
    """
    try:
        quantity = parse_quantity(value)
    except ValueError as exc:
        raise InvalidPodError(f"{what}: {exc}") from exc
    if quantity < 0:
        raise InvalidPodError(f"{what}: must not be negative, got {shown(value)}")
    return quantity


def _plain_cpu_milli(value: object) -> int | None:
    """The common forms, "2" and "250m", without building a Decimal; None for anything else."""
    if type(value) is not str or not value.isascii():
        return None
    if value.isdigit() and len(value) < 7:
        return int(value) * 1000
    if value[-1:] == "m" and value[:-1].isdigit() and len(value) < 11:
        return int(value[:-1])
    return None


def _string_map(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def bound_row(pod: Mapping[str, Any], index: Mapping[str, int]) -> int | None:
    """Row of the node a non-terminal pod is bound to, or None (unbound, finished, or unknown node)."""
    spec, status = pod.get("spec"), pod.get("status")
    node = spec.get("nodeName") if _is_mapping(spec) else None
    phase = status.get("phase") if _is_mapping(status) else None
    if not isinstance(node, str) or phase in TERMINAL_PHASES:
        return None
    return index.get(node)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    # JSON gives plain dicts: check that first, before the (much slower) ABC check.
    return type(value) is dict or isinstance(value, Mapping)


def _container_list(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = spec.get(key)
    if items is None:
        return []
    if not isinstance(items, list) or not all(_is_mapping(item) for item in items):
        raise InvalidPodError(f"pod spec.{key}: expected a list of containers")
    return items


def _container_counts(
    container: Mapping[str, Any], at: tuple[str, int], resources: tuple[str, ...], cpu_problems: list[str] | None
) -> list[int]:
    section = container.get("resources")
    if not _is_mapping(section):
        return [0] * (len(resources) + (cpu_problems is not None))
    limits = section.get("limits")
    requests = section.get("requests")
    limits = limits if _is_mapping(limits) else {}
    requests = requests if _is_mapping(requests) else {}
    counts = []
    for resource in resources:
        # Extended resources cannot be overcommitted: the request defaults to the limit.
        source, value = ("limits", limits[resource]) if resource in limits else ("requests", requests.get(resource))
        if value is None:
            counts.append(0)
        elif (plain := plain_int(value)) is not None:
            counts.append(plain)  # the common case, without building the field name
        else:
            try:
                counts.append(parse_whole_count(value, what=f"{at[0]}[{at[1]}].resources.{source}.{resource}"))
            except ValueError as exc:
                raise InvalidPodError(str(exc)) from exc
    if cpu_problems is not None:
        # CPU can be overcommitted: the request, else the limit (the API server's default).
        source, value = ("requests", requests["cpu"]) if "cpu" in requests else ("limits", limits.get("cpu"))
        cpu = 0 if value is None else _plain_cpu_milli(value)
        if cpu is None:
            try:
                cpu = cpu_milli(value, f"{at[0]}[{at[1]}].resources.{source}.cpu")
            except InvalidPodError as exc:
                cpu_problems.append(str(exc))
                cpu = 0
        counts.append(cpu)
    return counts


def parse_models(value: object) -> frozenset[str] | None:
    """The allowed models of annotation ``gpu.nvidia.com/model``, a comma list of at most
    :data:`MAX_MODELS_CHARS` characters, normalised (:func:`~scheduler_core.k8s.gpu_models.normalize_model`);
    None when the annotation is absent.

    >>> sorted(parse_models("a100, NVIDIA-H100-80GB-HBM3"))
    ['A100', 'H100']
    >>> parse_models("A100," * 1000)
    Traceback (most recent call last):
    ...
    scheduler_core.errors.InvalidPodError: annotation gpu.nvidia.com/model: 5000 characters; at most 1024
    """
    if value is None:
        return None
    where = f"annotation {LABEL_MODEL}"
    if not isinstance(value, str) or not value.strip():
        raise InvalidPodError(f"{where}: expected a comma list of GPU models, got {shown(value)}")
    if len(value) > MAX_MODELS_CHARS:
        raise InvalidPodError(f"{where}: {len(value)} characters; at most {MAX_MODELS_CHARS}")
    models = set()
    for item in value.split(","):
        model = normalize_model(item)
        if model is None:
            raise InvalidPodError(f"{where}: {shown(item.strip())} is not a GPU model name (in {shown(value)})")
        models.add(model)
    return frozenset(models)


def _allowed_models(annotated: frozenset[str] | None, pod: Mapping[str, Any]) -> frozenset[str] | None:
    """The models both the annotation and the required node affinity allow: a pod may say its models
    either way, on the product's annotation or on the labels an autoscaler knows
    (:func:`~scheduler_core.k8s.node_affinity.affinity_models`), and both hold.

    Raises
    ------
    InvalidPodError
        When no model is left (none in both, or the affinity's terms contradict themselves).
    """
    affinity = affinity_models(required_affinity(pod))
    if affinity is None:
        return annotated
    allowed = affinity if annotated is None else annotated & affinity
    if not allowed:
        said = "" if annotated is None else f"annotation {LABEL_MODEL} allows {','.join(sorted(annotated))} and "
        raise InvalidPodError(
            f"{said}the required node affinity allows {','.join(sorted(affinity)) or 'no GPU model'}: "
            "no GPU model is left"
        )
    return allowed


def _parse_memory_mib(value: object) -> int:
    """MiB per GPU: a plain integer is MiB; a quantity with a unit is bytes (``40Gi``, ``48G``). A plain
    number that is not an integer (``40960.5``) is neither, and is refused; so is a value longer than
    :data:`MAX_MEMORY_CHARS`, a negative one, and one past int32 MiB.

    >>> _parse_memory_mib("40960"), _parse_memory_mib("40Gi")
    (40960, 40960)
    >>> _parse_memory_mib("9" * 19)
    Traceback (most recent call last):
    ...
    scheduler_core.errors.InvalidPodError: annotation gpu.nvidia.com/memory: '9999999999999999999' is out of range
    """
    if value is None:
        return 0
    where = f"annotation {LABEL_MEMORY}"
    expected = "expected MiB per GPU as an integer or a quantity such as 40Gi"
    if not isinstance(value, str):
        raise InvalidPodError(f"{where}: {expected}, got {shown(value)}")
    if len(value) > MAX_MEMORY_CHARS:
        raise InvalidPodError(f"{where}: {len(value)} characters; at most {MAX_MEMORY_CHARS}")
    text = value.strip()
    plain = plain_int(text)
    try:
        quantity = Decimal(plain) if plain is not None else parse_quantity(text)
    except ValueError as exc:
        raise InvalidPodError(f"{where}: {expected}, got {shown(value)}") from exc
    if unitless(text):
        # A bare number is MiB written in digits, as before: "40960.5", "40960.0" and "+40960" are refused.
        if not text.removeprefix("-").isdigit():
            raise InvalidPodError(f"{where}: a number without a unit is MiB and must be an integer, got {shown(value)}")
        quantity *= MIB
    if quantity < 0:
        raise InvalidPodError(f"{where}: must not be negative, got {shown(value)}")
    # A minimum: round up, so "40G" (38146.97 MiB) never admits a GPU with 38146 MiB. At most 64
    # characters, with an exponent of at most 30: the quotient stays far inside Decimal's range.
    mib = int((quantity / MIB).to_integral_value(rounding="ROUND_CEILING"))
    if mib > _INT32_MAX:
        raise InvalidPodError(f"{where}: {shown(value)} is out of range")
    return mib
