"""``gpu-scheduler bench path``: the modules one request passes through, from the extender service to its
reply, counted by a profile hook.

Three requests, each traced once after a warm-up on another pod (so that lazy imports and first-use caches
are not counted): a whole-GPU ``filter`` and its ``prioritize`` on a 16-node snapshot, and a share's
``bind`` with its reservation pod (moto's DynamoDB in process, the in-repo API server double, which plays
the kubelet that reports the reservation pod's GPU). Each enters at
:meth:`application.extender.service.ExtenderService.answer`, the layer both transports hand a body to;
filter and prioritize carry node names only, as the generated configuration (``nodeCacheCapable: true``)
makes kube-scheduler send them.

The hook follows the calling thread: on each call and each return, the product module now running (in
``scheduler_core``, ``adapters``, ``application``, ``manifests``, ``lambdas``, ``gpu_scheduler``; the
standard library, numpy, boto3 and moto are not product modules, and calls into them do not move the path).
A *stop* is a run of execution in one module; a *return* is a stop in a module the path had already left.
Reported per request: the modules in order of first entry, the packages (folders) they are in, how many
times each was entered, the stops and the returns.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

PRODUCT_ROOTS = frozenset(
    {"scheduler_core", "adapters", "application", "shares", "manifests", "lambdas", "gpu_scheduler"}
)
TOKEN = "bench-path"


def _module(frame: FrameType | None) -> str:
    """The product module now running at ``frame``: its own, or its nearest product caller's (for the
    standard library and the packages it calls); "" once the climb reaches this harness, which is the
    transport here and not part of the path."""
    while frame is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name == __name__:
            return ""
        if name.split(".")[0] in PRODUCT_ROOTS:
            return name
        frame = frame.f_back
    return ""


def trace(call: Callable[[], Any]) -> dict[str, Any]:
    """Run ``call`` under the hook; the path it took through the product's modules."""
    stops: list[str] = []

    def hook(frame: FrameType, event: str, _arg: Any) -> None:
        if event not in ("call", "return"):
            return
        here = _module(frame if event == "call" else frame.f_back)
        if here and (not stops or stops[-1] != here):
            stops.append(here)

    sys.setprofile(hook)
    try:
        call()
    finally:
        sys.setprofile(None)
    entered = Counter(stops)
    return {
        "modules": len(entered),
        "packages": sorted({module.rsplit(".", 1)[0] for module in entered}),
        "stops": len(stops),
        "returns": len(stops) - len(entered),
        "most_entered": dict(entered.most_common(5)),
        "path": list(entered),
    }


def summarise(path: dict[str, Any]) -> str:
    """One line: ``modules / stops / returns``."""
    return f"{path['modules']} modules, {path['stops']} stops, {path['returns']} returns"


@contextmanager
def _world() -> Iterator[tuple[Any, Callable[..., dict[str, Any]], list[dict[str, Any]]]]:
    """A sharing extender service on a 16-node snapshot, the ledger in moto (in process), the API double;
    yields the service, a function that loads a pending share pod by name, and the node objects."""
    import boto3
    from moto import mock_aws

    from adapters.gpu_ledger import LedgerStore
    from adapters.kube import connect_url
    from adapters.kube_transport import RetryPolicy
    from adapters.ledger_readings import LedgerReadings
    from application.extender.service import ExtenderService
    from bench.ledger import TABLE, create_table
    from scheduler_core.extender.facade import Extender
    from scheduler_core.simulator.synthetic import CATALOGUE, make_node, make_pod
    from scheduler_core.state.cluster import ClusterState
    from shares.binder import LedgerBinder
    from shares.reservations import Reservations
    from testing.kube_double import KubeApiDouble

    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        os.environ.setdefault(name, value)
    shape = next(shape for shape in CATALOGUE if shape.gpus == 8)
    nodes = [make_node(f"gpu-{i:02d}", shape, "us-east-1a") for i in range(16)]
    state = ClusterState.from_objects(nodes)
    with mock_aws(), KubeApiDouble(tokens=[TOKEN]) as api:
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        create_table(dynamodb)
        api.load("nodes", nodes)

        def kube() -> Any:
            client = connect_url(api.url, TOKEN)
            client.retry = RetryPolicy(attempts=2, base_s=0.01, max_s=0.02, request_timeout_s=5.0)
            return client

        readings = LedgerReadings()
        binder = LedgerBinder(LedgerStore(TABLE, dynamodb), kube, lambda: state, readings)
        binder.reservations = Reservations(lambda: binder.kube, "registry.example/python:3.12")
        service = ExtenderService(Extender(None, lambda: state, readings, binder))

        def pending(name: str, gpus: int = 0, milli: int = 0) -> dict[str, Any]:
            pod = make_pod(name, gpus, milli=milli)
            api.load("pods", [pod])
            return pod

        yield service, pending, nodes


def run(*, filter_only: bool = False) -> dict[str, Any]:
    """Trace filter, prioritize and bind (see the module docstring); JSON-ready."""
    from scheduler_core.simulator.synthetic import make_pod

    out: dict[str, Any] = {"suite": "path", "at": time.strftime("%Y-%m-%d")}
    with _world() as (service, pending, nodes):
        names = [node["metadata"]["name"] for node in nodes]

        def scheduling(verb: str, pod: dict[str, Any]) -> Callable[[], Any]:
            body = json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()
            return lambda: service.answer(verb, body)

        for verb in ("filter", "prioritize"):
            scheduling(verb, make_pod("warm", 1))()
            out[verb] = trace(scheduling(verb, make_pod(f"traced-{verb}", 1)))
        if not filter_only:

            def binding(name: str, node: str) -> Callable[[], Any]:
                meta = pending(name, milli=250)["metadata"]
                body = {"PodName": name, "PodNamespace": "default", "PodUID": meta["uid"], "Node": node}
                return lambda: service.answer("bind", json.dumps(body).encode())

            binding("warm-share", "gpu-00")()
            out["bind"] = trace(binding("traced-share", "gpu-01"))  # a new GPU: its reservation pod is made
    out["summary"] = {verb: summarise(path) for verb, path in out.items() if isinstance(path, dict) and "stops" in path}
    return out
