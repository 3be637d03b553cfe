"""What a pod asks of GPUs (:class:`PodDemand`): whole GPUs, a share, MIG slices, models, memory, peers;
and where a bound pod is.

Each count is the effective request that kube-scheduler's ``resource.PodRequests`` gives
(:mod:`scheduler_core.k8s.pod_requests`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.annotations import Peer, parse_peers
from scheduler_core.k8s.gpu_models import normalize_model
from scheduler_core.k8s.limits import MAX_INT32
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
from scheduler_core.k8s.pod_requests import container_list, effective_requests, is_mapping
from scheduler_core.k8s.quantity import MIB, parse_quantity, plain_int, shown, unitless

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
        for container in container_list(spec, key):
            section = container.get("resources")
            if not is_mapping(section):
                continue
            for part in ("limits", "requests"):
                amounts = section.get(part)
                if is_mapping(amounts):
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


def _string_map(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def bound_row(pod: Mapping[str, Any], index: Mapping[str, int]) -> int | None:
    """Row of the node a non-terminal pod is bound to, or None (unbound, finished, or unknown node)."""
    spec, status = pod.get("spec"), pod.get("status")
    node = spec.get("nodeName") if is_mapping(spec) else None
    phase = status.get("phase") if is_mapping(status) else None
    if not isinstance(node, str) or phase in TERMINAL_PHASES:
        return None
    return index.get(node)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


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
    if mib > MAX_INT32:
        raise InvalidPodError(f"{where}: {shown(value)} is out of range")
    return mib
