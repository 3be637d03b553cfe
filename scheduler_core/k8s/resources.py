"""CPU, memory and pod slots: what a pod requests and what a node can hold, as NodeResourcesFit counts them.

A pod's request of a resource (kube-scheduler's ``resource.PodRequests``) is the larger of

- the sum over its app containers plus its restartable ("sidecar") init containers, which run beside them, and
- the peak while it starts: each init container plus the sidecars started before it,

then, when the pod sets pod-level requests (``spec.resources.requests``, the PodLevelResources feature),
those replace the containers' CPU and memory; then ``spec.overhead`` (RuntimeClass) is added. A
container's request is its ``requests`` entry, else its ``limits`` entry (what the API server defaults
the request to). CPU is in milli-cores and memory in bytes, both rounded up as ``resource.Quantity``
does; every pod takes one pod slot.

A node fits when, for each resource the pod requests more than 0 of, the request is at most what is free:
allocatable less the requests of the pods already there (``fitsRequest``). A zero request always fits,
even on an overcommitted node. A node that does not report an allocatable amount is not limited on it
(:data:`NO_LIMIT`), as :data:`~scheduler_core.state.allocation.UNKNOWN_CPU` does for the state.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler_core.errors import InvalidPodError
from scheduler_core.k8s.pod_requests import combine_requests, cpu_milli, non_negative_quantity
from scheduler_core.k8s.quantity import parse_whole_count

RESOURCES = ("cpu", "memory", "pods")
"""The resources axis (``n_resources``): milli-cores, bytes, pod slots."""
CPU, MEMORY, PODS = range(len(RESOURCES))
NO_LIMIT = int(np.iinfo(np.int64).max)
"""Free amount of a resource a node does not report: more than any pod asks."""
_POD_LEVEL = ("cpu", "memory")  # the resources pod-level requests may set (IsSupportedPodLevelResource)


def pod_requests(pod: Mapping[str, Any]) -> npt.NDArray[np.int64]:
    """The pod's request of each of :data:`RESOURCES` (see the module docstring for the rule).

    Parameters
    ----------
    pod : v1 Pod object (a mapping)

    Returns
    -------
    ndarray of shape (n_resources,), int64
        Milli-cores, bytes (capped at int64), and 1 pod slot.

    Raises
    ------
    InvalidPodError
        A malformed container list, or a CPU or memory quantity that is not one or is negative; the
        message names the field.

    Examples
    --------
    >>> sidecar = {"restartPolicy": "Always", "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}}
    >>> pod = {"spec": {"containers": [{"resources": {"requests": {"cpu": "2", "memory": "4Gi"}}}],
    ...                 "initContainers": [sidecar, {"resources": {"limits": {"cpu": "8"}}}],
    ...                 "overhead": {"cpu": "100m"}}}
    >>> pod_requests(pod).tolist()  # CPU: max(2 + 0.5, 0.5 + 8) + 0.1; memory: 4Gi + 1Gi
    [8600, 5368709120, 1]
    """
    spec = pod.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, Mapping):
        raise InvalidPodError(f"pod spec: expected an object, got {type(spec).__name__}")
    totals = _combine(spec)
    pod_level = _mapping(_mapping(spec.get("resources")).get("requests"))
    for k, resource in enumerate(_POD_LEVEL):
        if resource in pod_level:
            totals[k] = _amount(resource, pod_level[resource], f"spec.resources.requests.{resource}")
    overhead = _mapping(spec.get("overhead"))
    for k, resource in enumerate(_POD_LEVEL):
        if resource in overhead:
            totals[k] += _amount(resource, overhead[resource], f"spec.overhead.{resource}")
    # Past int64 only by summing absurd requests: capped, it still exceeds every node.
    return np.array([min(total, NO_LIMIT) for total in totals] + [1], dtype=np.int64)


def node_allocatable(nodes: Sequence[Mapping[str, Any]]) -> npt.NDArray[np.int64]:
    """Each node's ``status.allocatable`` of :data:`RESOURCES`; :data:`NO_LIMIT` where it is absent or
    not a quantity (the node is then not limited on it).

    Parameters
    ----------
    nodes : sequence of v1 Node objects, length n_nodes

    Returns
    -------
    ndarray of shape (n_nodes, n_resources), int64

    Examples
    --------
    >>> node_allocatable([{"status": {"allocatable": {"cpu": "47810m", "memory": "178Gi", "pods": "110"}}},
    ...                   {"status": {}}]).tolist() == [[47810, 178 * 2**30, 110], [NO_LIMIT] * 3]
    True
    """
    allocatable = np.full((len(nodes), len(RESOURCES)), NO_LIMIT, dtype=np.int64)
    for row, node in enumerate(nodes):
        status = _mapping(node.get("status")) if isinstance(node, Mapping) else {}
        values = _mapping(status.get("allocatable"))
        for k, resource in enumerate(RESOURCES):
            if resource not in values:
                continue
            try:
                if resource == "pods":
                    allocatable[row, k] = parse_whole_count(values[resource], what=resource)
                else:
                    allocatable[row, k] = min(_amount(resource, values[resource], resource), NO_LIMIT)
            except (InvalidPodError, ValueError):
                continue  # unreadable: not limited, as absent
    return allocatable


def insufficient(request: npt.NDArray[np.int64], free: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
    """Which resources each node lacks for the pod: the pod requests more than 0 and more than is free.

    Parameters
    ----------
    request : ndarray of shape (n_resources,), int64
        From :func:`pod_requests`.
    free : ndarray of shape (n_nodes, n_resources), int64
        Allocatable less the requests of the pods there (:data:`NO_LIMIT` where unknown); may be negative
        on an overcommitted node.

    Returns
    -------
    ndarray of shape (n_nodes, n_resources), bool

    Raises
    ------
    ValueError
        When the shapes do not fit together.

    Examples
    --------
    >>> free = np.array([[48000, 2**30, 110], [-5, 2**30, 0]])
    >>> insufficient(np.array([10_000_000, 0, 1]), free).tolist()
    [[True, False, False], [True, False, True]]
    >>> insufficient(np.array([0, 0, 0]), free).any()  # a zero request fits even an overcommitted node
    np.False_
    """
    request, free = np.asarray(request), np.asarray(free)
    if request.ndim != 1 or free.ndim != 2 or free.shape[1] != request.shape[0]:
        raise ValueError(
            f"request and free: expected shapes (n_resources,) and (n_nodes, n_resources), "
            f"got {request.shape} and {free.shape}"
        )
    lacking: npt.NDArray[np.bool_] = (request > 0)[None, :] & (request[None, :] > free)
    return lacking


def describe(request: npt.NDArray[np.int64], which: npt.NDArray[np.bool_]) -> str:
    """The requested amounts of the resources ``which`` marks, for a message: ``cpu 10000, memory 2Ti``.

    >>> describe(np.array([10_000_000, 3 * 2**40, 1]), np.array([True, True, False]))
    'cpu 10000, memory 3Ti'
    """
    parts = []
    for k in np.flatnonzero(which):
        amount = int(request[k])
        parts.append(f"{RESOURCES[k]} {_FORMATS[k](amount)}")
    return ", ".join(parts)


def _cores(milli: int) -> str:
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _bytes(amount: int) -> str:
    for suffix, size in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if amount >= size and amount % size == 0:
            return f"{amount // size}{suffix}"
    return str(amount)


_FORMATS: tuple[Callable[[int], str], ...] = (_cores, _bytes, str)


def _combine(spec: Mapping[str, Any]) -> list[int]:
    """CPU and memory of the containers (:func:`~scheduler_core.k8s.pod_requests.combine_requests`)."""
    app = (_container_amounts(c, f"containers[{i}]") for i, c in enumerate(_containers(spec, "containers")))
    init = (
        (c.get("restartPolicy") == "Always", _container_amounts(c, f"initContainers[{i}]"))
        for i, c in enumerate(_containers(spec, "initContainers"))
    )
    return combine_requests(app, init, 2)


def _containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    items = spec.get(key)
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(item, Mapping) for item in items):
        raise InvalidPodError(f"pod spec.{key}: expected a list of containers")
    return items


def _container_amounts(container: Mapping[str, Any], at: str) -> list[int]:
    section = _mapping(container.get("resources"))
    requests, limits = _mapping(section.get("requests")), _mapping(section.get("limits"))
    amounts = []
    for resource in _POD_LEVEL:
        source, value = ("requests", requests[resource]) if resource in requests else ("limits", limits.get(resource))
        amounts.append(0 if value is None else _amount(resource, value, f"{at}.resources.{source}.{resource}"))
    return amounts


def _amount(resource: str, value: object, what: str) -> int:
    """A CPU quantity in milli-cores or a memory quantity in bytes, rounded up; :class:`InvalidPodError`
    naming ``what`` for one that is not a non-negative quantity."""
    if resource == "cpu":
        return cpu_milli(value, what)
    return int(non_negative_quantity(value, what).to_integral_value(rounding="ROUND_CEILING"))


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
