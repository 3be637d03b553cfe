"""The extender Lambda, driven by API Gateway REST proxy events built from the real captures,
with the snapshot in moto S3."""

import base64
import json
import sys
import time

import boto3
import pytest
from moto import mock_aws

from adapters.metric_catalogue import CATALOGUE, EXTENDER
from scheduler_core.state.snapshot import build_snapshot, write_snapshot
from testing.kube_double import KubeApiDouble
from tests.captured_requests import each_captured_request
from tests.conftest import (
    REPO,
    SCHEDULER_FIXTURES,
    FakeLambdaContext,
    api_gateway_event,
    assert_catalogued,
    assert_protocol_correct_filter,
    captured_nodes,
    load_fixture,
    make_nodes,
    make_pod,
    request_verb,
    requires_fixtures,
)

pytestmark = pytest.mark.server  # the Lambda handler over moto

BUCKET, KEY = "gpu-scheduler-state", "prod/snapshot.npz"


@pytest.fixture
def aws(monkeypatch):
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "POWERTOOLS_METRICS_NAMESPACE": "GpuSchedulerTest",
        "POWERTOOLS_DEV": "false",
    }.items():
        monkeypatch.setenv(name, value)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        yield s3


def put_snapshot(s3, nodes, pods=(), generated_at=None, key=KEY):
    when = time.time() if generated_at is None else generated_at
    snap = build_snapshot(nodes, list(pods), cluster="test", generated_at=when)
    s3.put_object(Bucket=BUCKET, Key=key, Body=write_snapshot(snap))


@pytest.fixture
def load_handler(aws, fresh_handler):
    def load(**env):
        return fresh_handler("lambdas.extender.handler", **{"SNAPSHOT_URI": f"s3://{BUCKET}/{KEY}", **env})

    return load


class Invoker:
    def __init__(self, handler, capsys):
        self.handler, self.capsys = handler, capsys

    def __call__(self, method, path, body=None, **kwargs):
        response = self.handler.lambda_handler(api_gateway_event(method, path, body, **kwargs), FakeLambdaContext())
        lines = [json.loads(line) for line in self.capsys.readouterr().out.splitlines() if line.startswith("{")]
        self.emf = [line for line in lines if "_aws" in line]
        self.logs = [line for line in lines if "_aws" not in line]
        return response["statusCode"], json.loads(response["body"])

    def metric(self, name, **dimensions):
        """Values of metric ``name`` in this invocation's EMF output with the given dimensions."""
        values = []
        for doc in self.emf:
            declared = {m["Name"] for d in doc["_aws"]["CloudWatchMetrics"] for m in d["Metrics"]}
            if name in declared and all(doc.get(k) == v for k, v in dimensions.items()):
                value = doc[name]
                values += value if isinstance(value, list) else [value]
        return values


@pytest.fixture
def invoke(load_handler, capsys):
    def make(**env):
        return Invoker(load_handler(**env), capsys)

    return make


@each_captured_request
def test_every_captured_request_in_both_node_modes(aws, invoke, path):
    put_snapshot(aws, captured_nodes())
    call = invoke()
    request = load_fixture(path)
    verb = request_verb(path)
    status, reply = call("POST", f"/{verb}", path.read_bytes())
    assert status == 200
    if verb == "filter":
        assert reply["Error"] == ""
        assert_protocol_correct_filter(request, reply)
        assert call.metric("FilterLatencyMs")
        sent = request["NodeNames"] or [n["metadata"]["name"] for n in request["Nodes"]["items"]]
        assert call.metric("NodesIn") == [len(sent)]
    else:
        sent = request["NodeNames"] or [n["metadata"]["name"] for n in request["Nodes"]["items"]]
        assert sorted(p["Host"] for p in reply) == sorted(sent)
        assert all(isinstance(p["Score"], int) and 0 <= p["Score"] <= 10 for p in reply)
        assert call.metric("PrioritizeLatencyMs")


@requires_fixtures()
def test_names_only_request_is_decided_from_the_snapshot(aws, invoke):
    put_snapshot(aws, captured_nodes())
    call = invoke()
    case = SCHEDULER_FIXTURES / "02-filter-prioritize-nodecache-true-60gpu-20cpu"
    path = case / "01-filter-gpu-a100-2-large.request.json"
    status, reply = call("POST", "/filter", path.read_bytes())
    assert status == 200
    # The pod wants A100 with 40960 MiB: the 20 A100 nodes (40 GB and 80 GB) of the 60 sent.
    assert sorted(reply["NodeNames"]) == [f"gpu-a100-{i:02d}" for i in range(1, 21)]
    assert reply["Nodes"] is None
    reasons = set(reply["FailedAndUnresolvableNodes"].values())
    assert reasons >= {"GPU model V100 not in A100", "GPU model T4 not in A100"}
    assert call.metric("NodesFeasible") == [20]
    log = next(line for line in call.logs if line.get("message") == "filter")
    assert (log["pod_namespace"], log["pod_name"]) == ("default", "gpu-a100-2-large")
    assert log["decision"]["reasons"]["model"] == 40


@requires_fixtures()
def test_names_the_snapshot_lacks_fail_with_a_reason(aws, invoke):
    put_snapshot(aws, captured_nodes())
    call = invoke()
    path = (
        SCHEDULER_FIXTURES
        / "02e-filter-nodecache-true-180nodes-pct100"
        / ("01-filter-gpu-2-180nodes-pct100.request.json")
    )
    _, reply = call("POST", "/filter", path.read_bytes())
    extra = {name for name in load_fixture(path)["NodeNames"] if name.startswith("gpu-extra-")}
    assert len(extra) == 100
    assert {n for n, r in reply["FailedNodes"].items() if r == "node is not in the cluster state"} == extra


def test_snapshot_usage_enriches_full_node_requests(aws, invoke):
    nodes = make_nodes("A100", "A100")
    put_snapshot(aws, nodes, [make_pod("r", 8, node_name="a100-0", phase="Running")])
    call = invoke()
    # A share: milli the extender counts (kube-scheduler counts nvidia.com/gpu itself).
    body = json.dumps({"Pod": make_pod("p", 0, milli=500), "Nodes": {"items": nodes}, "NodeNames": None})
    status, reply = call("POST", "/filter", body)
    assert status == 200
    assert reply["FailedNodes"] == {"a100-0": "none of 8 GPUs has 500 milli free (the pod's share)"}
    assert [n["metadata"]["name"] for n in reply["Nodes"]["items"]] == ["a100-1"]


def test_base64_encoded_bodies_are_decoded(aws, invoke):
    put_snapshot(aws, make_nodes("T4"))
    call = invoke()
    body = json.dumps({"Pod": make_pod("p", 1), "NodeNames": ["t4-0"]})
    assert call("POST", "/filter", body, base64=True)[1]["NodeNames"] == ["t4-0"]


def test_stale_snapshot_fails_the_filter_with_its_age_and_a_metric(aws, invoke):
    put_snapshot(aws, make_nodes("T4"), generated_at=time.time() - 600)
    call = invoke(MAX_SNAPSHOT_AGE_S="180")
    status, reply = call("POST", "/filter", json.dumps({"Pod": make_pod("p", 1), "NodeNames": ["t4-0"]}))
    assert status == 200
    assert reply["Error"].startswith("cluster snapshot is 60")
    assert reply["NodeNames"] == []
    assert call.metric("Unschedulable", reason="stale") == [1]
    assert call.metric("SnapshotAgeSeconds")[0] >= 600


def test_missing_snapshot_fails_the_filter_and_counts_the_refresh_failure(aws, invoke):
    call = invoke()
    status, reply = call("POST", "/filter", json.dumps({"Pod": make_pod("p", 1), "NodeNames": ["a"]}))
    assert status == 200
    assert "no cluster snapshot" in reply["Error"] and "no such object" in reply["Error"]
    assert call.metric("SnapshotRefreshFailures", reason="missing") == [1]
    assert call.metric("Unschedulable", reason="missing") == [1]
    status, _ = call("POST", "/prioritize", json.dumps({"Pod": make_pod("p", 1), "NodeNames": ["a"]}))
    assert status == 503


def test_corrupt_snapshot_fails_the_filter_with_a_metric(aws, invoke):
    aws.put_object(Bucket=BUCKET, Key=KEY, Body=b"PK\x03\x04 not really")
    call = invoke()
    _, reply = call("POST", "/filter", json.dumps({"Pod": make_pod("p", 1), "NodeNames": ["a"]}))
    assert "truncated or corrupt" in reply["Error"]
    assert call.metric("SnapshotRefreshFailures", reason="corrupt") == [1]


def test_s3_errors_fail_the_filter_with_a_metric(aws, invoke):
    call = invoke(SNAPSHOT_URI="s3://no-such-bucket/snapshot.npz")
    _, reply = call("POST", "/filter", json.dumps({"Pod": make_pod("p", 1), "NodeNames": ["a"]}))
    assert "NoSuchBucket" in reply["Error"]
    assert call.metric("SnapshotRefreshFailures", reason="store_error") == [1]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param("{not json", "not valid JSON", id="non-JSON"),
        pytest.param("[1, 2]", "expected a JSON object", id="wrong type"),
        pytest.param('{"NodeNames": []}', "Pod: required", id="missing Pod"),
        pytest.param(None, "not valid JSON", id="no body"),
        pytest.param(" " * 2000, "request body is 2000 bytes; the limit is 1000", id="huge body"),
    ],
)
def test_bad_client_input_is_a_400_with_a_metric_never_a_5xx(aws, invoke, body, message):
    put_snapshot(aws, make_nodes("T4"))
    call = invoke(MAX_BODY_BYTES="1000")
    status, reply = call("POST", "/filter", body)
    assert status == 400
    assert message in reply["Error"]
    assert call.metric("BadRequests") == [1]


def test_invalid_pod_annotation_is_a_200_with_error(aws, invoke):
    put_snapshot(aws, make_nodes("T4"))
    call = invoke()
    status, reply = call("POST", "/filter", json.dumps({"Pod": make_pod("p", 1, models="T4!"), "NodeNames": ["t4-0"]}))
    assert status == 200
    assert "gpu.nvidia.com/model" in reply["Error"]
    assert call.metric("Unschedulable", reason="invalid_pod") == [1]


def test_internal_fault_is_a_logged_500_without_details(aws, invoke, monkeypatch):
    put_snapshot(aws, make_nodes("T4"))
    call = invoke()

    def explode(*_args):
        raise ZeroDivisionError("secret detail")

    monkeypatch.setattr(call.handler.EXTENDER, "respond", explode)  # a fault injected below the handler
    status, reply = call("POST", "/filter", json.dumps({"Pod": make_pod("p", 1), "NodeNames": ["t4-0"]}))
    assert status == 500
    assert "secret detail" not in reply["Error"]
    assert call.metric("InternalErrors") == [1]
    error_log = next(line for line in call.logs if line.get("message") == "internal error")
    assert "ZeroDivisionError" in error_log["exception"] and error_log["path"] == "/filter"


def test_healthz_and_unknown_routes(aws, invoke):
    """``/healthz`` is a 503 while the extender has no usable snapshot (every filter would answer ``Error``),
    naming the failure's kind, never the bucket; a 200 once it has one."""
    call = invoke(SNAPSHOT_REFRESH_S="0")
    health = {"status": "ok", "snapshot": True, "ledger": False, "verbs": ["filter", "prioritize"]}
    status, reply = call("GET", "/healthz")
    assert (status, reply) == (503, {**health, "status": "unavailable", "reason": "missing"}), reply
    put_snapshot(aws, make_nodes("T4"))
    assert call("GET", "/healthz") == (200, health)
    assert BUCKET not in json.dumps(call("GET", "/healthz")[1])  # configured, never named
    status, reply = call("POST", "/bind", "{}")
    assert status == 404 and reply["Error"] == "unknown verb 'bind': this extender serves filter, prioritize"
    status, reply = call("POST", "/other", "{}")
    assert (status, reply["Error"]) == (404, "no route POST '/other': POST /filter, POST /prioritize, GET /healthz")


@pytest.fixture
def sharing(aws, invoke):
    """The extender with a ledger table in moto and the API double for its binds."""
    from bench.ledger import TABLE, create_table

    create_table(boto3.client("dynamodb", region_name="us-east-1"))
    with KubeApiDouble(tokens=["t0ken"]) as api:
        api.load("nodes", make_nodes("T4", "A100"))
        put_snapshot(aws, make_nodes("T4", "A100"))
        call = invoke(LEDGER_TABLE=TABLE, KUBE_API_URL=api.url, KUBE_TOKEN="t0ken")
        yield call, api


def bind_body(pod, node):
    meta = pod["metadata"]
    return json.dumps({"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node})


def test_bind_records_annotates_and_binds_and_filter_sees_it_at_once(sharing):
    call, api = sharing
    assert call("GET", "/healthz")[1]["verbs"] == ["filter", "prioritize", "bind", "preempt"]
    pods = [make_pod(f"s{i}", 0, milli=600) for i in range(4)]
    api.load("pods", pods)
    for pod in pods:
        assert call("POST", "/bind", bind_body(pod, "t4-0")) == (200, {"Error": ""})
        assert call.metric("Binds") == [1] and call.metric("BindLatencyMs")
    annotations = [api.get("pods", p["metadata"]["name"], "default")["metadata"]["annotations"] for p in pods]
    assert sorted(a["gpu-scheduler.io/assigned-gpus"] for a in annotations) == ["0:600", "1:600", "2:600", "3:600"]
    # The snapshot still shows t4-0 empty; this instance knows better until the refresher catches up.
    _, reply = call("POST", "/filter", json.dumps({"Pod": make_pod("p", 0, milli=500), "NodeNames": ["t4-0"]}))
    assert reply["NodeNames"] == [] and "none of 4 GPUs has 500 milli free" in reply["FailedNodes"]["t4-0"]
    full = make_pod("late", 0, milli=500)
    api.load("pods", [full])
    _, reply = call("POST", "/bind", bind_body(full, "t4-0"))
    assert "no room" in reply["Error"] and call.metric("BindFailures", reason="no_room") == [1]


def test_preempt_through_the_lambda_keeps_nodes_where_victims_free_enough(aws, sharing):
    call, api = sharing
    put_snapshot(aws, make_nodes("T4", "A100"), [make_pod("big", 8, node_name="a100-1", phase="Running")])
    whole, victim = make_pod("w3", 3), make_pod("victim", 0, milli=700)
    api.load("pods", [whole, victim])
    for pod in (whole, victim):  # GPUs 0-2, then 700 of GPU 3: 300 milli left on t4-0
        assert call("POST", "/bind", bind_body(pod, "t4-0"))[1] == {"Error": ""}
    request = {
        "Pod": make_pod("p", 0, milli=800),
        "NodeNameToMetaVictims": {
            "t4-0": {"Pods": [{"UID": victim["metadata"]["uid"]}, {"UID": "cpu-only"}], "NumPDBViolations": 0},
            "a100-1": {"Pods": [{"UID": "unknown"}], "NumPDBViolations": 0},
        },
    }
    status, reply = call("POST", "/preempt", json.dumps(request))
    assert status == 200
    # t4-0: evicting the share frees GPU 3; "cpu-only" is no pod the ledger knows, so it is kept as
    # kube-scheduler proposed it. a100-1 is full and its victim unknown: kube-scheduler does not account
    # shares, so its word does not stand for them, and the node is dropped.
    kept = [{"UID": victim["metadata"]["uid"]}, {"UID": "cpu-only"}]
    assert reply == {"NodeNameToMetaVictims": {"t4-0": {"Pods": kept, "NumPDBViolations": 0}}}
    assert call.metric("PreemptNodesDropped") == [1] and call.metric("PreemptLatencyMs")


def test_invalid_settings_fail_at_import_listing_every_problem(aws, load_handler):
    from scheduler_core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"MAX_SNAPSHOT_AGE_S: expected float, got 'soon'; SCORE_WEIGHT_FIT: must be"):
        load_handler(MAX_SNAPSHOT_AGE_S="soon", SCORE_WEIGHT_FIT="7")


def test_handler_imports_neither_kubernetes_nor_xray_when_tracing_is_off():
    import subprocess

    code = (
        "import sys, lambdas.extender.handler\n"
        "print(any(m in sys.modules for m in ('kubernetes', 'aws_xray_sdk.core')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "SNAPSHOT_URI": "/nonexistent.npz"},
    )
    assert out.stdout.strip() == "False"


def test_base64_bodies_that_are_not_base64_or_not_utf8_are_400s(aws, invoke):
    put_snapshot(aws, make_nodes("T4"))
    call = invoke()
    event = api_gateway_event("POST", "/filter", "%%%not-base64%%%")
    event["isBase64Encoded"] = True
    response = call.handler.lambda_handler(event, FakeLambdaContext())
    assert response["statusCode"] == 400
    assert "not valid base64" in json.loads(response["body"])["Error"]
    event["body"] = base64.b64encode(b'{"Pod": {"x": "\xff"}}').decode()
    response = call.handler.lambda_handler(event, FakeLambdaContext())
    assert response["statusCode"] == 400
    assert "not valid JSON" in json.loads(response["body"])["Error"]


def test_locality_settings_come_from_the_environment_and_are_validated():
    from application.extender.settings import ExtenderSettings
    from scheduler_core.errors import ConfigError

    settings = ExtenderSettings.from_env(
        {"LOCALITY_LABEL_KEYS": "app, tier", "LOCALITY_ZONE_ALPHA": "0.3", "LOCALITY_ZONE_VALUES": '{"a": {"b": 0.2}}'}
    )
    locality = settings.extender_config().locality
    assert (locality.label_keys, locality.zone_alpha, locality.zone_values) == (("app", "tier"), 0.3, {"a": {"b": 0.2}})
    with pytest.raises(
        ConfigError, match=r"SCORE_WEIGHT_LOCALITY: must .*; LOCALITY_ZONE_ALPHA: must be in \[0, 1\], got 2.0"
    ):
        ExtenderSettings.from_env({"LOCALITY_ZONE_ALPHA": "2", "SCORE_WEIGHT_LOCALITY": "-1"})
    with pytest.raises(ConfigError, match="LOCALITY_ZONE_VALUES: expected a JSON object"):
        ExtenderSettings.from_env({"LOCALITY_ZONE_VALUES": "[1]"})


@pytest.mark.parametrize(
    ("environ", "problems"),
    [
        ({"LOCALITY_ZONE_VALUES": '{"a": {"b": 2}}'}, ["LOCALITY_ZONE_VALUES['a']['b']: must be in [0, 1], got 2"]),
        (
            {"SCORE_WEIGHT_FIT": "0", "SCORE_WEIGHT_UTILIZATION": "0"},
            ["SCORE_WEIGHT_FIT + SCORE_WEIGHT_UTILIZATION: fit + utilization must be > 0, got 0.0 + 0.0"],
        ),
        (  # JSON that cannot be read does not hide the other problems
            {"LOCALITY_ZONE_VALUES": "[1]", "SCORE_WEIGHT_FIT": "3"},
            ["LOCALITY_ZONE_VALUES: expected a JSON object", "SCORE_WEIGHT_FIT: must be in [0, 1], got 3.0"],
        ),
    ],
)
def test_every_problem_the_core_finds_is_named_by_its_variable(environ, problems):
    from application.extender.settings import ExtenderSettings
    from scheduler_core.errors import ConfigError

    with pytest.raises(ConfigError) as raised:
        ExtenderSettings.from_env(environ)
    found = str(raised.value).split("; ")
    assert len(found) == len(problems) and all(got.startswith(want) for got, want in zip(found, problems, strict=True))


def test_every_metric_emitted_is_catalogued_and_every_catalogued_one_is_emitted(aws, sharing, invoke, monkeypatch):
    """The CDK dashboards and alarms name metrics through the catalogue: drift would leave them empty."""
    from adapters.gpu_ledger import LedgerStore
    from tests.conftest import RacingClient

    _, api = sharing
    call = invoke(MAX_BODY_BYTES="1000")  # with the ledger and the API of ``sharing``
    ledger = call.handler.EXTENDER.accounting.ledger
    ledger.client = RacingClient(ledger.client, LedgerStore(ledger.table, ledger.client), 1, "t4-0", 4)
    shares = [make_pod(f"s{i}", 0, milli=100) for i in range(3)]
    api.load("pods", shares)
    api.fail_next("POST", "/pods/s1/binding", 403)  # refused: nothing landed, so rolled back
    monkeypatch.setattr(call.handler.SERVICE, "max_reply_bytes", 60)  # the filter replies are cut
    documents = []
    for method, path, body in [
        ("POST", "/filter", json.dumps({"Pod": make_pod("fits", 1), "NodeNames": ["t4-0", "a100-1"]})),
        ("POST", "/filter", json.dumps({"Pod": make_pod("too-big", 64), "NodeNames": ["t4-0"]})),
        ("POST", "/prioritize", json.dumps({"Pod": make_pod("fits", 1), "NodeNames": ["t4-0", "a100-1"]})),
        ("POST", "/filter", "{not json"),
        ("POST", "/bind", bind_body(shares[0], "t4-0")),  # after one conflict
        ("POST", "/bind", bind_body(shares[1], "t4-0")),  # the Binding fails: rolled back
        ("POST", "/preempt", json.dumps({"Pod": make_pod("p", 0, milli=100), "NodeNameToMetaVictims": {}})),
    ]:
        call(method, path, body)
        documents += call.emf
    assert [d["LedgerConflicts"] for d in documents if "LedgerConflicts" in d] == [[1.0]]
    assert [d["BindRollbacks"] for d in documents if "BindRollbacks" in d] == [[1.0]]
    monkeypatch.setattr(call.handler.EXTENDER, "respond", lambda *_: 1 / 0)
    call("POST", "/filter", json.dumps({"Pod": make_pod("p", 1), "NodeNames": ["t4-0"]}))
    documents += call.emf
    missing = invoke(SNAPSHOT_URI="s3://gpu-scheduler-state/absent.npz")
    missing("POST", "/filter", json.dumps({"Pod": make_pod("p", 1), "NodeNames": ["t4-0"]}))
    documents += missing.emf
    seen = assert_catalogued(documents, EXTENDER)
    assert seen == {m.name for m in CATALOGUE if m.service == EXTENDER and not m.planned}


def test_the_handlers_doctests_pass_under_a_fresh_import(load_handler) -> None:
    """``lambdas/conftest.py`` keeps pytest's doctest collection off the handlers (they build their service
    at import); their doctests run here instead, and only the extender's handler has any."""
    import doctest

    handler = load_handler()
    failed, attempted = doctest.testmod(handler, optionflags=doctest.ELLIPSIS)
    assert (failed, attempted) == (0, 2)
    others = [p for p in (REPO / "lambdas").glob("*/handler.py") if p.parent.name != "extender"]
    assert others and not [p for p in others if ">>>" in p.read_text()]
