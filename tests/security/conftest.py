"""The attack suite's world: the extender with GPU sharing on, reached the two ways it is deployed.

- ``serve``: ``ExtenderHTTPServer`` over loopback, its extender wired as ``gpu-scheduler serve
  --ledger-table`` wires it (``shares.binder.ledger_binder`` on a ``ClusterAccess``);
- ``lambda``: the extender Lambda's handler on API Gateway events, from its environment.

Both bind through the in-repo API double and record shares in moto's DynamoDB; the Lambda reads its
snapshot from moto's S3. Every test gets :class:`World`: ``call(verb, body)`` and what to check after.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from adapters.gpu_ledger import LedgerStore
from adapters.ledger_readings import LedgerReadings
from adapters.settings import ClusterAccess
from application.extender.service import ExtenderService
from bench.ledger import TABLE, create_table
from gpu_scheduler.server import ExtenderHTTPServer
from scheduler_core.extender.facade import Extender
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.snapshot import build_snapshot, write_snapshot
from shares.binder import ledger_binder
from testing.kube_double import KubeApiDouble
from tests.conftest import FakeLambdaContext, api_gateway_event, make_nodes

TOKEN = "security-token"
BUCKET, KEY = "gpu-scheduler-state", "prod/snapshot.npz"
TAINT = {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}
GPU_COUNTS = {"t4-0": 4, "a100-1": 8, "l40s-2": 4}


def cluster_nodes() -> list[dict[str, Any]]:
    """t4-0 (4 GPUs), a100-1 (8) and l40s-2 (4), the last tainted ``dedicated=inference:NoSchedule``."""
    nodes = make_nodes("T4", "A100", "L40S")
    nodes[2].setdefault("spec", {})["taints"] = [TAINT]
    return nodes


@dataclass
class World:
    transport: str
    api: KubeApiDouble
    ledger: LedgerStore
    call: Callable[[str, bytes], tuple[int, Any]] = field(repr=False)
    port: int = 0  # serve only
    dynamodb_calls: list[str] = field(default_factory=list)  # serve only: every DynamoDB call the binder made
    ledger_binder: Any = None  # serve only

    def bind(self, pod: dict[str, Any], node: str, uid: str | None = None) -> tuple[int, Any]:
        meta = pod["metadata"]
        body = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": uid or meta["uid"], "Node": node}
        return self.call("bind", json.dumps(body).encode())

    def ledger_used(self) -> dict[str, int]:
        """Milli used on every node, by the ledger."""
        return {name: sum(self.ledger.read(name, count).used) for name, count in GPU_COUNTS.items()}

    def api_writes(self) -> list[str]:
        return [f"{r.method} {r.path}" for r in self.api.writes()]


@pytest.fixture(params=["serve", "lambda"])
def world(request: pytest.FixtureRequest, aws_session: Any, fresh_handler: Any, capsys: Any) -> Iterator[World]:
    dynamodb = aws_session.client("dynamodb")
    create_table(dynamodb)
    ledger = LedgerStore(TABLE, dynamodb)
    nodes = cluster_nodes()
    with KubeApiDouble(tokens=[TOKEN]) as api:
        api.load("nodes", nodes)
        if request.param == "serve":
            yield from _serve(api, ledger, aws_session, nodes)
        else:
            yield from _lambda(api, ledger, aws_session, nodes, fresh_handler, capsys)


@pytest.fixture
def serve_world(aws_session: Any) -> Iterator[World]:
    """:func:`world` through ``serve`` only, for what needs concurrent requests or raw sockets."""
    dynamodb = aws_session.client("dynamodb")
    create_table(dynamodb)
    nodes = cluster_nodes()
    with KubeApiDouble(tokens=[TOKEN]) as api:
        api.load("nodes", nodes)
        yield from _serve(api, LedgerStore(TABLE, dynamodb), aws_session, nodes)


def _serve(api: KubeApiDouble, ledger: LedgerStore, session: Any, nodes: list[dict[str, Any]]) -> Iterator[World]:
    calls: list[str] = []
    session.events.register("before-call.dynamodb", lambda model, **_: calls.append(model.name))
    state = ClusterState.from_objects(nodes)
    readings = LedgerReadings()
    access = ClusterAccess(kube_api_url=api.url, kube_token=TOKEN)
    binder = ledger_binder(TABLE, access, session=session, cluster=lambda: state, readings=readings)
    server = ExtenderHTTPServer(("127.0.0.1", 0), ExtenderService(Extender(None, lambda: state, readings, binder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    def call(verb: str, body: bytes) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", f"/{verb}", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, json.loads(response.read())

    try:
        yield World("serve", api, ledger, call, port, calls, binder)
    finally:
        server.shutdown()
        server.server_close()


def _lambda(
    api: KubeApiDouble, ledger: LedgerStore, session: Any, nodes: list[dict[str, Any]], fresh: Any, capsys: Any
) -> Iterator[World]:
    s3 = session.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    snapshot = build_snapshot(nodes, [], cluster="prod", generated_at=time.time())
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=write_snapshot(snapshot))
    handler = fresh(
        "lambdas.extender.handler",
        SNAPSHOT_URI=f"s3://{BUCKET}/{KEY}",
        LEDGER_TABLE=TABLE,
        KUBE_API_URL=api.url,
        KUBE_TOKEN=TOKEN,
        POWERTOOLS_METRICS_NAMESPACE="GpuSchedulerSecurity",
    )

    def call(verb: str, body: bytes) -> tuple[int, Any]:
        event = api_gateway_event("POST", f"/{verb}", body.decode())
        response = handler.lambda_handler(event, FakeLambdaContext())
        capsys.readouterr()  # the handler's logs and metrics: not what these tests look at
        return response["statusCode"], json.loads(response["body"])

    yield World("lambda", api, ledger, call)
