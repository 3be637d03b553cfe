"""A pod's requests as kube-scheduler's ``resource.PodRequests`` counts them, from its containers.

The effective request of a resource is the larger of the sum over app containers (plus restartable
"sidecar" init containers, which run alongside them) and the largest init container (plus the sidecars
started before it). For an extended resource the request defaults to the limit, so a limit with no
request counts; CPU can be overcommitted, so its request defaults to the limit only when there is no
request. :mod:`scheduler_core.k8s.pods` reads what a pod asks of GPUs from these;
:mod:`scheduler_core.k8s.resources` reads CPU, memory and pod slots.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeGuard

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.limits import MAX_INT32
from scheduler_core.k8s.names import GPU_RESOURCE
from scheduler_core.k8s.quantity import parse_quantity, parse_whole_count, plain_int, shown


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
    if is_mapping(overhead) and "cpu" in overhead:
        try:
            cpu += cpu_milli(overhead["cpu"], "spec.overhead.cpu")
        except InvalidPodError as exc:
            problems.append(str(exc))
    return totals, (0 if problems else cpu), "; ".join(problems)


def _check_range(resources: tuple[str, ...], totals: list[int]) -> None:
    for resource, total in zip(resources, totals, strict=True):
        if total > MAX_INT32:
            raise InvalidPodError(f"{resource}: request of {total} is out of range")


def _combine(spec: Mapping[str, Any], resources: tuple[str, ...], cpu_problems: list[str] | None) -> list[int]:
    """kube-scheduler's ``PodRequests`` of ``resources``, and of CPU (last) when ``cpu_problems`` is a
    list, which collects bad CPU quantities (counted 0) instead of raising."""
    app = (
        _container_counts(container, ("containers", i), resources, cpu_problems)
        for i, container in enumerate(container_list(spec, "containers"))
    )
    init = (
        (container.get("restartPolicy") == "Always",
         _container_counts(container, ("initContainers", i), resources, cpu_problems))
        for i, container in enumerate(container_list(spec, "initContainers"))
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
    if milli > MAX_INT32:
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


def is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    # JSON gives plain dicts: check that first, before the (much slower) ABC check.
    return type(value) is dict or isinstance(value, Mapping)


def container_list(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = spec.get(key)
    if items is None:
        return []
    if not isinstance(items, list) or not all(is_mapping(item) for item in items):
        raise InvalidPodError(f"pod spec.{key}: expected a list of containers")
    return items


def _container_counts(
    container: Mapping[str, Any], at: tuple[str, int], resources: tuple[str, ...], cpu_problems: list[str] | None
) -> list[int]:
    section = container.get("resources")
    if not is_mapping(section):
        return [0] * (len(resources) + (cpu_problems is not None))
    limits = section.get("limits")
    requests = section.get("requests")
    limits = limits if is_mapping(limits) else {}
    requests = requests if is_mapping(requests) else {}
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
