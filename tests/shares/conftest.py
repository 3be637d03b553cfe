"""What the tests of a share's bind build on: moto's DynamoDB ledger, the in-repo API double over HTTP, and a
binder on both (with reservation pods or without)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from adapters.gpu_ledger import LedgerStore
from adapters.kube import connect_url
from adapters.kube_transport import RetryPolicy
from adapters.ledger_readings import LedgerReadings
from bench.ledger import TABLE, create_table
from scheduler_core.extender.wire import ExtenderBindingArgs
from scheduler_core.k8s.names import ASSIGNED_GPUS_ANNOTATION
from scheduler_core.state.cluster import ClusterState
from shares.binder import LedgerBinder
from shares.reservations import Reservations
from testing.kube_double import KubeApiDouble
from tests.conftest import make_nodes, make_pod

TOKEN = "bind-token"
NODES = make_nodes("T4", "A100")  # t4-0: 4 GPUs, a100-1: 8


@pytest.fixture
def api() -> Iterator[KubeApiDouble]:
    with KubeApiDouble(tokens=[TOKEN]) as double:
        double.load("nodes", NODES)
        yield double


@pytest.fixture
def ledger(aws_session: Any) -> LedgerStore:
    client = aws_session.client("dynamodb")
    create_table(client)
    return LedgerStore(TABLE, client)


def make_binder(api: KubeApiDouble, ledger: LedgerStore, state: ClusterState | None = None) -> LedgerBinder:
    def kube() -> Any:
        client = connect_url(api.url, TOKEN)
        client.retry = RetryPolicy(attempts=2, base_s=0.01, max_s=0.02, request_timeout_s=5.0)
        return client

    binder = LedgerBinder(ledger, kube, lambda: state, LedgerReadings())
    assert binder.kube is not None  # made now: a bind's 2.5 s are for the bind, not for importing the client
    return binder


def pending(api: KubeApiDouble, name: str, gpus: int = 0, milli: int = 0) -> ExtenderBindingArgs:
    pod = make_pod(name, gpus, milli=milli)
    api.load("pods", [pod])
    return ExtenderBindingArgs(name, "default", pod["metadata"]["uid"], "t4-0")


def pod_on(api: KubeApiDouble, name: str) -> tuple[str | None, str | None]:
    pod = api.get("pods", name, "default")
    return pod["spec"].get("nodeName"), pod["metadata"].get("annotations", {}).get(ASSIGNED_GPUS_ANNOTATION)


RESERVED = "gpu-scheduler-reservations"


def reserving_binder(api: KubeApiDouble, ledger: LedgerStore) -> LedgerBinder:
    binder = make_binder(api, ledger)
    binder.reservations = Reservations(lambda: binder.kube, "registry.example/python:3.12")
    return binder


def reservation_names(api: KubeApiDouble) -> set[str]:
    return {p["metadata"]["name"] for p in api.objects("pods") if p["metadata"].get("namespace") == RESERVED}
