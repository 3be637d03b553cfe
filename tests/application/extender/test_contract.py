"""One contract for the extender's two transports, held by one script of requests.

- ``serve``: ``gpu_scheduler.server.ExtenderHTTPServer`` on loopback, in a thread, its metrics read from
  ``GET /metrics`` after each request (Prometheus names, mapped back through the catalogue);
- ``lambda``: the Lambda handler fed API Gateway REST proxy events, its metrics read from the EMF lines it
  prints.

Both are built by ``application.extender.service.build`` from the same settings (the snapshot in moto's S3,
the GPU ledger in moto's DynamoDB, binds through the API double). Each step sends the same bytes to both
and expects the same status, the same reply body and the same catalogued metrics: each count by its
``reason`` with the same total, and each latency observed once. A gauge (``SnapshotAgeSeconds``) is set
rather than added to, so Prometheus shows no change when it is set again: the gauges are compared over
the whole script instead. A count of zero shows no change either: where EMF says 0, Prometheus says
nothing new, so zeros are left out on both sides.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest

from adapters.metric_catalogue import CATALOGUE, EXTENDER, prometheus_name, prometheus_type, spec
from bench.ledger import TABLE, create_table
from scheduler_core.state.snapshot import build_snapshot, write_snapshot
from testing.kube_double import KubeApiDouble
from tests.conftest import FakeLambdaContext, api_gateway_event, make_nodes, make_pod

pytestmark = pytest.mark.server  # serve and the Lambda handler, over moto

BUCKET, KEY, TOKEN = "gpu-scheduler-state", "prod/snapshot.npz", "contract-token"
MAX_BODY_BYTES = 4000
GAUGES = {m.name for m in CATALOGUE if m.service == EXTENDER and prometheus_type(m) == "gauge"}
"""Set, not added to: a gauge shows no change when it is set to the value it had, so gauges are compared
over the whole script, and everything else request by request."""

Metric = tuple[str, str]  # (catalogued name, the value of its ``reason`` dimension or "")


class Recorded(NamedTuple):
    """What one request recorded: each count's total and each latency's number of observations, by
    metric (zeros left out), and the gauges set."""

    values: dict[Metric, float]
    gauges: set[str]


class Transport:
    """``call`` sends one request and returns the status, the decoded body and what it recorded."""

    service: Any  # the ExtenderService behind the transport
    api: KubeApiDouble

    def call(self, method: str, path: str, body: bytes | None) -> tuple[int, Any, Recorded]:
        raise NotImplementedError


class Serve(Transport):
    def __init__(self, settings: Any) -> None:
        from application.extender.service import build
        from gpu_scheduler.server import ExtenderHTTPServer

        self.service = build(settings)
        self.server = ExtenderHTTPServer(("127.0.0.1", 0), self.service)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]
        self.by_name = {prometheus_name(m): m.name for m in CATALOGUE if m.service == EXTENDER}
        self.seen: dict[tuple[str, str], float] = {}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _request(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        result = response.status, response.read()
        conn.close()
        return result

    def call(self, method: str, path: str, body: bytes | None) -> tuple[int, Any, Recorded]:
        status, payload = self._request(method, path, body)
        return status, json.loads(payload), self._recorded()

    def _recorded(self) -> Recorded:
        """How far each catalogued series moved since the last read (a histogram by its ``_count``), and
        the gauges present."""
        _, text = self._request("GET", "/metrics", None)
        recorded = Recorded({}, set())
        for line in text.decode().splitlines():
            match = re.fullmatch(r'(\w+?)(_count|_sum|_bucket)?(?:\{(\w+)="([^"]*)"\})? (\S+)', line)
            if match is None or match[2] in ("_sum", "_bucket"):
                continue
            name = self.by_name.get(match[1])
            if name is None:  # the server's own count by verb and status, the live state's
                continue
            if name in GAUGES:
                recorded.gauges.add(name)
                continue
            key, value = (name, match[4] or ""), float(match[5])
            if value != self.seen.get(key, 0.0):
                recorded.values[key] = value - self.seen.get(key, 0.0)
            self.seen[key] = value
        return recorded


class Lambda(Transport):
    def __init__(self, handler: Any, capsys: Any) -> None:
        self.handler, self.capsys, self.service = handler, capsys, handler.SERVICE

    def call(self, method: str, path: str, body: bytes | None) -> tuple[int, Any, Recorded]:
        event = api_gateway_event(method, path, body)
        response = self.handler.lambda_handler(event, FakeLambdaContext())
        lines = [json.loads(line) for line in self.capsys.readouterr().out.splitlines() if line.startswith("{")]
        recorded = Recorded({}, set())
        for doc in (line for line in lines if "_aws" in line):
            for directive in doc["_aws"]["CloudWatchMetrics"]:
                for metric in directive["Metrics"]:
                    name = metric["Name"]
                    if name in GAUGES:
                        recorded.gauges.add(name)
                        continue
                    dimensions = spec(name, EXTENDER).dimensions
                    key = (name, doc[dimensions[0]] if dimensions else "")
                    values = doc[name] if isinstance(doc[name], list) else [doc[name]]
                    added = len(values) if metric["Unit"] == "Milliseconds" else sum(values)
                    if added:
                        recorded.values[key] = recorded.values.get(key, 0.0) + added
        return response["statusCode"], json.loads(response["body"]), recorded


NODES = make_nodes("T4", "A100", "L40S")
SHARES = [make_pod(f"share-{i}", 0, milli=600) for i in range(3)]
VICTIMS = {"l40s-2": {"Pods": [{"UID": "cpu-only"}], "NumPDBViolations": 0}}
REPLY_INVALID_POD = {
    "Nodes": None,
    "NodeNames": [],
    "FailedNodes": {},
    "FailedAndUnresolvableNodes": {},
    "Error": "annotation gpu.nvidia.com/model: 'T4!' is not a GPU model name (in 'T4!')",
}
DROPPED = {"t4-0": {"Pods": [{"UID": SHARES[0]["metadata"]["uid"]}], "NumPDBViolations": 0}}
REPLY_SCORES = [{"Host": "t4-0", "Score": 0}, {"Host": "a100-1", "Score": 3}, {"Host": "l40s-2", "Score": 10}]
NOT_JSON = "Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
REPLY_GHOST = {"Error": "bind default/ghost to t4-0: no pod with that namespace, name and UID"}
ENV = {
    "SNAPSHOT_URI": f"s3://{BUCKET}/{KEY}",
    "LEDGER_TABLE": TABLE,
    "MAX_BODY_BYTES": str(MAX_BODY_BYTES),
    "POWERTOOLS_METRICS_NAMESPACE": "GpuSchedulerContract",
}


@pytest.fixture(params=["serve", "lambda"])
def transport(request: pytest.FixtureRequest, aws_session: Any, fresh_handler: Any, capsys: Any) -> Iterator[Transport]:
    from application.extender.settings import ExtenderSettings

    create_table(aws_session.client("dynamodb"))
    s3 = aws_session.client("s3")
    s3.create_bucket(Bucket=BUCKET)
    running = make_pod("running", 2, node_name="a100-1", phase="Running")
    snapshot = build_snapshot(NODES, [running], cluster="prod", generated_at=time.time())
    s3.put_object(Bucket=BUCKET, Key=KEY, Body=write_snapshot(snapshot))
    with KubeApiDouble(tokens=[TOKEN]) as api:
        api.load("nodes", NODES)
        api.load("pods", SHARES)
        env = {**ENV, "KUBE_API_URL": api.url, "KUBE_TOKEN": TOKEN}
        if request.param == "serve":
            served = Serve(ExtenderSettings.from_env(env))
            served.api = api
            try:
                yield served
            finally:
                served.close()
        else:
            invoked = Lambda(fresh_handler("lambdas.extender.handler", **env), capsys)
            invoked.api = api
            yield invoked


def body(pod: dict[str, Any], names: list[str] | None = None, nodes: list[dict[str, Any]] | None = None) -> bytes:
    form = {"Nodes": {"items": nodes}, "NodeNames": None} if nodes is not None else {"Nodes": None, "NodeNames": names}
    return json.dumps({"Pod": pod, **form}).encode()


def bind_body(pod: dict[str, Any], node: str) -> bytes:
    meta = pod["metadata"]
    args = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
    return json.dumps(args).encode()


ALL = ["t4-0", "a100-1", "l40s-2"]
ROUTES = "POST /filter, POST /prioritize, POST /bind, POST /preempt, GET /healthz"


def filtered(nodes_in: int, feasible: int, **more: float) -> dict[Metric, float]:
    """What a filter decision records: its latency once, the nodes in and kept, and ``more`` by reason."""
    counts = {("FilterLatencyMs", ""): 1, ("NodesIn", ""): nodes_in, ("NodesFeasible", ""): feasible}
    return {key: n for key, n in counts.items() if n} | {("Unschedulable", r): n for r, n in more.items()}


class Step(NamedTuple):
    what: str
    method: str
    path: str
    body: bytes | None
    status: int
    reply: Any
    metrics: dict[Metric, float]


def posted(what: str, verb: str, pod: dict[str, Any], *, metrics: dict[Metric, float], reply: Any) -> Step:
    """A step that POSTs ``pod`` with every node's name to ``/VERB`` and expects a 200 with ``reply``, having
    recorded ``metrics``."""
    return Step(what, "POST", f"/{verb}", body(pod, ALL), 200, reply, metrics)


STEPS = [
    Step(
        "health says what is configured",
        "GET",
        "/healthz",
        None,
        200,
        {"status": "ok", "snapshot": True, "ledger": True, "verbs": ["filter", "prioritize", "bind", "preempt"]},
        {},
    ),
    posted(
        "filter by names keeps the nodes with room and says why of the others",
        "filter",
        make_pod("two", 2, models="A100,L40S"),
        metrics=filtered(3, 2),
        reply={
            "Nodes": None,
            "NodeNames": ["a100-1", "l40s-2"],
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {"t4-0": "GPU model T4 not in A100,L40S"},
            "Error": "",
        },
    ),
    Step(
        "filter with full Node objects returns the objects sent",
        "POST",
        "/filter",
        body(make_pod("one", 1, models="T4"), nodes=NODES[:2]),
        200,
        {
            "Nodes": {"metadata": {}, "items": NODES[:1]},
            "NodeNames": None,
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {"a100-1": "GPU model A100 not in T4"},
            "Error": "",
        },
        filtered(2, 1),
    ),
    posted(
        "a pod no node can host is counted Unschedulable by its main reason",
        "filter",
        make_pod("huge", 64),
        metrics=filtered(3, 0, too_few_gpus=1),
        reply={
            "Nodes": None,
            "NodeNames": [],
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {
                "t4-0": "4 GPUs allocatable, pod needs 64",
                "a100-1": "8 GPUs allocatable, pod needs 64",
                "l40s-2": "4 GPUs allocatable, pod needs 64",
            },
            "Error": "",
        },
    ),
    posted(
        "an invalid annotation is an Error in a 200, counted by its kind",
        "filter",
        make_pod("bad", 1, models="T4!"),
        metrics=filtered(0, 0, invalid_pod=1),
        reply=REPLY_INVALID_POD,
    ),
    posted(
        "prioritize scores every node sent",
        "prioritize",
        make_pod("two", 2, models="A100,L40S"),
        metrics={("PrioritizeLatencyMs", ""): 1},
        reply=REPLY_SCORES,
    ),
    Step(
        "a body that is not JSON is a 400",
        "POST",
        "/filter",
        b"{not json",
        400,
        {
            "Error": "request body is not valid JSON: Expecting property name enclosed in double quotes: line 1 "
            "column 2 (char 1)"
        },
        {("FilterLatencyMs", ""): 1, ("BadRequests", ""): 1},
    ),
    Step(
        "a body over the limit is a 400 with the one message",
        "POST",
        "/filter",
        b" " * (MAX_BODY_BYTES + 1),
        400,
        {"Error": f"request body is {MAX_BODY_BYTES + 1} bytes; the limit is {MAX_BODY_BYTES}"},
        {("FilterLatencyMs", ""): 1, ("BadRequests", ""): 1},
    ),
    Step(
        "a POST to no route is a 404 naming the routes",
        "POST",
        "/nope",
        b"{}",
        404,
        {"Error": f"no route POST '/nope': {ROUTES}"},
        {("BadRequests", ""): 1},
    ),
    Step(
        "a GET to no route is a 404 naming the routes",
        "GET",
        "/metricz",
        None,
        404,
        {"Error": f"no route GET '/metricz': {ROUTES}"},
        {("BadRequests", ""): 1},
    ),
    *[
        Step(
            f"bind {i} records the share and binds",
            "POST",
            "/bind",
            bind_body(pod, "t4-0"),
            200,
            {"Error": ""},
            {("BindLatencyMs", ""): 1, ("Binds", ""): 1},
        )
        for i, pod in enumerate(SHARES[:2])
    ],
    Step(
        "a bind of a pod the API does not have fails, counted by its kind",
        "POST",
        "/bind",
        bind_body(make_pod("ghost", 0, milli=100), "t4-0"),
        200,
        REPLY_GHOST,
        {("BindLatencyMs", ""): 1, ("BindFailures", "pod_gone"): 1},
    ),
    Step(
        "preempt keeps the nodes where the victims free enough, and drops the others",
        "POST",
        "/preempt",
        json.dumps({"Pod": make_pod("p", 4), "NodeNameToMetaVictims": {**VICTIMS, **DROPPED}}).encode(),
        200,
        {"NodeNameToMetaVictims": VICTIMS},
        {("PreemptLatencyMs", ""): 1, ("PreemptNodesDropped", ""): 1},
    ),
]


def test_the_same_requests_get_the_same_answers_and_metrics_on_both_transports(transport: Any) -> None:
    gauges: set[str] = set()
    for step in STEPS:
        status, reply, recorded = transport.call(step.method, step.path, step.body)
        assert (status, reply) == (step.status, step.reply), step.what
        assert recorded.values == step.metrics, step.what
        gauges |= recorded.gauges
    assert gauges == {"SnapshotAgeSeconds"}  # set by every decision made from the snapshot


def test_a_filter_reply_over_the_reply_limit_is_cut_the_same_way(transport: Any) -> None:
    transport.service.max_reply_bytes = 150
    status, reply, recorded = transport.call("POST", "/filter", body(make_pod("two", 2, models="A100"), ALL))
    # Cut to fit: the reasons go first; the kept nodes stay.
    assert (status, reply) == (200, {"Nodes": None, "NodeNames": ["a100-1"], "FailedNodes": {},
                                     "FailedAndUnresolvableNodes": {}, "Error": ""})  # fmt: skip
    assert recorded.values == filtered(3, 1) | {("RepliesCut", "filter"): 1}


def test_an_internal_fault_is_a_500_without_its_details_and_a_metric(transport: Any, monkeypatch: Any) -> None:
    def explode(*_args: Any) -> None:
        raise ZeroDivisionError("secret detail")

    monkeypatch.setattr(transport.service.extender, "respond", explode)
    status, reply, recorded = transport.call("POST", "/filter", body(make_pod("p", 1), ALL))
    assert (status, reply) == (500, {"Error": "internal error in the extender; see its log"})
    assert recorded == Recorded({("InternalErrors", ""): 1}, set())


def test_binds_that_race_or_are_refused_count_conflicts_and_rollbacks(transport: Any) -> None:
    from adapters.gpu_ledger import LedgerStore
    from tests.conftest import RacingClient

    ledger = transport.service.extender.accounting.ledger
    ledger.client = RacingClient(ledger.client, LedgerStore(ledger.table, ledger.client), 1, "t4-0", 4)
    status, reply, recorded = transport.call("POST", "/bind", bind_body(SHARES[0], "t4-0"))
    assert (status, reply) == (200, {"Error": ""})
    assert recorded.values == {("BindLatencyMs", ""): 1, ("Binds", ""): 1, ("LedgerConflicts", ""): 1}
    transport.api.fail_next("POST", f"/pods/{SHARES[1]['metadata']['name']}/binding", 403)
    status, reply, recorded = transport.call("POST", "/bind", bind_body(SHARES[1], "t4-0"))
    assert status == 200 and reply["Error"]
    assert recorded.values == {("BindLatencyMs", ""): 1, ("BindRollbacks", ""): 1, ("BindFailures", "kube_error"): 1}


def test_a_missing_snapshot_is_an_error_and_a_refresh_failure_on_both(transport: Any, aws_session: Any) -> None:
    aws_session.client("s3").delete_object(Bucket=BUCKET, Key=KEY)
    status, reply, recorded = transport.call("POST", "/filter", body(make_pod("p", 1), ALL))
    assert status == 200 and reply["Error"].startswith("no cluster snapshot") and reply["NodeNames"] == []
    assert recorded == Recorded(filtered(0, 0, missing=1) | {("SnapshotRefreshFailures", "missing"): 1}, set())


def test_the_contract_exercises_every_catalogued_extender_metric() -> None:
    """A metric the steps never record could differ between the transports unseen."""
    recorded = {name for step in STEPS for name, _ in step.metrics} | {"SnapshotAgeSeconds"}
    recorded |= {"RepliesCut", "InternalErrors", "LedgerConflicts", "BindRollbacks", "SnapshotRefreshFailures"}
    assert recorded == {m.name for m in CATALOGUE if m.service == EXTENDER and not m.planned}
