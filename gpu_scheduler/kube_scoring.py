"""kube-scheduler's own node scores, as a model, for the demo's side-by-side of the stock kube-scheduler and
the product on the same pods.

The score plugins that rank the demo's nodes differently (kube-scheduler 1.33,
``pkg/scheduler/framework/plugins/noderesources``), each 0..100, weight 1 in the default profile:

- ``NodeResourcesFit``: the stock profile scores ``LeastAllocated`` on ``cpu`` and ``memory`` (free share,
  times 100, integer division, weighted mean), which sends each pod to the emptiest node. The product's
  profile (``manifests.scheduler_configuration.profile``) scores ``MostAllocated`` on ``cpu``, ``memory`` and
  ``nvidia.com/gpu``. An extended resource the pod does not request is left out of the mean. Requests
  are the pods' own (the demo's pods all set them, so kube-scheduler's non-zero defaults never apply).
- ``NodeResourcesBalancedAllocation``: ``(1 - std of the cpu and memory fractions) x 100``, the fractions
  with the pod added and capped at 1.

The other default score plugins score every node alike for these pods (no taints, no preferred affinity,
no owner to spread by, no image lists on the nodes). With an extender, kube-scheduler adds its score (0..10)
x its weight x 10. The highest total wins; ``selectHost`` picks among equal totals at random. On 100 nodes
or more the stock kube-scheduler scores only a sample of them (``percentageOfNodesToScore``, adaptive by
default), which this model does not do: the demo stays under 100 nodes. ``tests/e2e/test_kube_scoring.py``
checks the model's best nodes against the real kube-scheduler's choices, pod by pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler_core.k8s.names import GPU_RESOURCE
from scheduler_core.k8s.pod_requests import combine_requests, effective_cpu_milli, effective_gpu_request
from scheduler_core.k8s.quantity import parse_quantity

MAX_NODE_SCORE = 100
MAX_EXTENDER_SCORE = 10
STOCK = "LeastAllocated"
PRODUCT = "MostAllocated"


@dataclass
class NodeUse:
    """One node's allocatable and what its pods request: CPU in milli, memory in bytes, GPUs, pods."""

    name: str
    cpu: int
    memory: int
    gpus: int
    pods: int
    labels: Mapping[str, str]
    used: list[int] = field(default_factory=lambda: [0, 0, 0, 0])

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeUse:
        allocatable = node["status"]["allocatable"]
        return cls(
            name=node["metadata"]["name"],
            cpu=int(parse_quantity(allocatable.get("cpu", "0")) * 1000),
            memory=int(parse_quantity(allocatable.get("memory", "0"))),
            gpus=int(parse_quantity(allocatable.get(GPU_RESOURCE, "0"))),
            pods=int(parse_quantity(allocatable.get("pods", "110"))),
            labels=dict(node["metadata"].get("labels") or {}),
        )

    def fits(self, request: Sequence[int]) -> bool:
        """NodeResourcesFit's filter: CPU, memory, GPUs and one more pod."""
        cpu, memory, gpus = request
        used_cpu, used_memory, used_gpus, used_pods = self.used
        return (
            used_cpu + cpu <= self.cpu
            and used_memory + memory <= self.memory
            and used_gpus + gpus <= self.gpus
            and used_pods + 1 <= self.pods
        )

    def add(self, request: Sequence[int]) -> None:
        for i, amount in enumerate((*request, 1)):
            self.used[i] += amount


def request_of(pod: Mapping[str, Any]) -> tuple[int, int, int]:
    """The pod's CPU (milli), memory (bytes) and GPUs, as kube-scheduler sums its containers: the app
    containers' sum or the largest init container, whichever is more (a request, else its limit)."""
    spec = pod["spec"]
    return effective_cpu_milli(spec), _memory_bytes(spec), effective_gpu_request(spec)


def _memory_bytes(spec: Mapping[str, Any]) -> int:
    """Memory as kube-scheduler's ``PodRequests`` sums it (:func:`~scheduler_core.k8s.pod_requests.combine_requests`:
    sidecars beside the app containers, the init containers' peak), plus ``spec.overhead``; a container's
    request, else its limit."""

    def of(container: Mapping[str, Any]) -> list[int]:
        resources = container.get("resources") or {}
        value = (resources.get("requests") or {}).get("memory") or (resources.get("limits") or {}).get("memory")
        return [int(parse_quantity(value)) if value else 0]

    app = (of(c) for c in spec.get("containers") or [])
    init = ((c.get("restartPolicy") == "Always", of(c)) for c in spec.get("initContainers") or [])
    overhead = (spec.get("overhead") or {}).get("memory")
    return combine_requests(app, init, 1)[0] + (int(parse_quantity(overhead)) if overhead else 0)


def _least(requested: int, capacity: int) -> int:
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def _most(requested: int, capacity: int) -> int:
    if capacity == 0:
        return 0
    return min(requested, capacity) * MAX_NODE_SCORE // capacity


def fit_score(node: NodeUse, request: Sequence[int], strategy: str) -> int:
    """``NodeResourcesFit``'s score: ``LeastAllocated`` on cpu and memory (the stock profile), or
    ``MostAllocated`` on cpu, memory and GPUs (the product's), the GPUs only when the pod asks for some."""
    cpu, memory, gpus = request
    terms = [(node.used[0] + cpu, node.cpu), (node.used[1] + memory, node.memory)]
    if strategy == PRODUCT and gpus and node.gpus:
        terms.append((node.used[2] + gpus, node.gpus))
    scorer = _least if strategy == STOCK else _most
    scores = [scorer(requested, capacity) for requested, capacity in terms if capacity]
    return sum(scores) // len(scores) if scores else 0


def balanced_score(node: NodeUse, request: Sequence[int]) -> int:
    """``NodeResourcesBalancedAllocation``: one minus the spread of the cpu and memory fractions, x 100."""
    fractions = [
        min(1.0, (used + asked) / capacity)
        for used, asked, capacity in ((node.used[0], request[0], node.cpu), (node.used[1], request[1], node.memory))
        if capacity
    ]
    spread = abs(fractions[0] - fractions[1]) / 2 if len(fractions) == 2 else 0.0
    return int((1 - spread) * MAX_NODE_SCORE)


def total_scores(
    nodes: Sequence[NodeUse],
    request: Sequence[int],
    strategy: str,
    extender: Mapping[str, int] | None = None,
    weight: int = 0,
) -> dict[str, int]:
    """Each node's total: the two plugins' scores plus, with an extender, its score x weight x 10."""
    bonus = MAX_NODE_SCORE // MAX_EXTENDER_SCORE * weight
    return {
        node.name: fit_score(node, request, strategy)
        + balanced_score(node, request)
        + (bonus * (extender or {}).get(node.name, 0))
        for node in nodes
    }


def best(scores: Mapping[str, int]) -> list[str]:
    """The nodes ``selectHost`` picks among: those with the highest total."""
    top = max(scores.values())
    return [name for name, score in scores.items() if score == top]
