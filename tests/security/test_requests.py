"""Hostile requests to the extender's verbs and to ``serve``'s sockets: refused with a 4xx and a message,
or absorbed; never a 500, a dropped connection or a traceback (issue: "Safe to deploy")."""

from __future__ import annotations

import json
import logging
import socket
import struct
import threading
import time
from typing import Any

import pytest

from application.extender.service import ExtenderService
from gpu_scheduler.server import ExtenderHTTPServer, ExtenderRequestHandler
from scheduler_core.extender.facade import MAX_PREEMPT_NODES, Extender
from tests.conftest import make_pod
from tests.security.conftest import World

pytestmark = pytest.mark.server  # serve and the Lambda handler


def filter_body(pod: dict[str, Any], names: list[str]) -> bytes:
    return json.dumps({"Pod": pod, "NodeNames": names}).encode()


def test_a_preempt_naming_5000_unknown_nodes_reads_nothing_from_the_ledger(world: World) -> None:
    victims = {f"ghost-{i}": {"Pods": [{"UID": f"u{i}"}], "NumPDBViolations": 0} for i in range(5000)}
    body = json.dumps({"Pod": make_pod("p", 0, milli=500), "NodeNameToMetaVictims": victims}).encode()
    assert world.call("preempt", body) == (200, {"NodeNameToMetaVictims": {}})
    if world.transport == "serve":
        assert world.dynamodb_calls == []  # no node of the request is in the state: nothing to read


def test_a_preempt_past_the_limit_is_a_400(world: World) -> None:
    victims = {f"n{i}": {"Pods": [], "NumPDBViolations": 0} for i in range(MAX_PREEMPT_NODES + 1)}
    body = json.dumps({"Pod": make_pod("p", 1), "NodeNameToMetaVictims": victims}).encode()
    status, reply = world.call("preempt", body)
    assert status == 400 and f"the limit is {MAX_PREEMPT_NODES}" in reply["Error"]


def test_a_5000_digit_quantity_is_refused_naming_the_field(world: World) -> None:
    pod = make_pod("huge", 1)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "9" * 5000
    status, reply = world.call("filter", filter_body(pod, ["t4-0"]))
    assert status == 200 and "limits.nvidia.com/gpu" in reply["Error"] and "out of range" in reply["Error"]
    assert len(reply["Error"]) < 400  # the value is cut, not echoed whole
    status, reply = world.call("prioritize", filter_body(pod, ["t4-0"]))
    assert status == 400 and "limits.nvidia.com/gpu" in reply["Error"]


def test_memory_with_a_fraction_and_no_unit_is_refused_not_read_as_bytes(world: World) -> None:
    pod = make_pod("fraction", 1, memory="40960.5")
    status, reply = world.call("filter", filter_body(pod, ["a100-1"]))
    assert status == 200 and reply["NodeNames"] == []
    assert (
        "gpu.nvidia.com/memory: a number without a unit is MiB and must be an integer, got '40960.5'" in reply["Error"]
    )


def test_a_filter_reply_over_the_lambda_limit_drops_its_reasons_first(world: World) -> None:
    names = [f"unknown-node-{i:06d}" for i in range(200_000)]
    status, reply = world.call("filter", filter_body(make_pod("p", 1), names))
    assert status == 200 and reply["NodeNames"] == [] and reply["Error"] == ""
    if world.transport == "lambda":  # 12.8 MB with every reason; Lambda refuses a reply over 6 MB
        assert reply["FailedNodes"] == {}
    else:  # serve has no such limit and keeps them
        assert len(reply["FailedNodes"]) == 200_000


def raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def response_of(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def test_a_content_length_that_is_not_ascii_digits_is_a_400(serve_world: World) -> None:
    with raw(serve_world.port) as sock:
        sock.sendall("POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: ²\r\n\r\n{}".encode())
        reply = response_of(sock)
    assert reply.startswith(b"HTTP/1.1 400") and b"Content-Length header" in reply


def test_a_slow_client_is_cut_off_while_others_are_served(serve_world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ExtenderRequestHandler, "request_timeout_s", 1.0)
    with raw(serve_world.port) as slow:
        slow.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n")
        slow.settimeout(0.2)
        started = time.monotonic()
        assert serve_world.call("filter", filter_body(make_pod("p", 1), ["t4-0"]))[0] == 200  # others still served
        while time.monotonic() - started < 10:
            try:
                slow.sendall(b"X")  # a header byte at a time: every read is quick, the request never ends
                if slow.recv(1024) == b"":
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        closed_after = time.monotonic() - started
    assert closed_after < 3.0  # the request's 1 s, not a per-read timeout that each byte resets


def test_connections_past_the_limit_get_a_503() -> None:
    server = ExtenderHTTPServer(("127.0.0.1", 0), ExtenderService(Extender()), max_connections=2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        held = [raw(port), raw(port)]
        time.sleep(0.2)  # both accepted and each holding its thread
        with raw(port) as third:
            assert response_of(third).startswith(b"HTTP/1.1 503")
        for sock in held:
            sock.close()
        time.sleep(0.2)
        with raw(port) as again:
            body = b'{"Pod": {}, "Nodes": {"items": []}}'
            again.sendall(
                b"POST /filter HTTP/1.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            assert response_of(again).startswith(b"HTTP/1.1 200")
    finally:
        server.shutdown()
        server.server_close()


def test_a_reset_connection_is_one_debug_line_not_a_traceback(
    serve_world: World, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpu_scheduler.server")
    for _ in range(5):
        sock = raw(serve_world.port)
        sock.sendall(b"POST /filter HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with RST
        sock.close()
    time.sleep(0.3)
    assert serve_world.call("filter", filter_body(make_pod("p", 1), ["t4-0"]))[0] == 200
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert "Traceback" not in capfd.readouterr().err


def test_a_dead_ledger_is_a_503_for_preempt_and_an_error_for_bind_never_a_500(serve_world: World) -> None:
    """EndpointConnectionError used to escape as a 500 and skip the rollback."""
    import boto3
    from botocore.config import Config

    from adapters.gpu_ledger import LedgerStore
    from testing.processes import free_port

    dead = boto3.client(
        "dynamodb", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{free_port()}",
        aws_access_key_id="testing", aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1),
    )  # fmt: skip
    serve_world.ledger_binder.ledger = LedgerStore(serve_world.ledger.table, dead)
    victims = {"t4-0": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 0}}
    body = json.dumps({"Pod": make_pod("p", 0, milli=500), "NodeNameToMetaVictims": victims}).encode()
    status, reply = serve_world.call("preempt", body)
    # The step that failed, in fixed words: the table's name and botocore's text are for the log only.
    assert status == 503 and "reading the GPU ledger failed: DynamoDB did not answer" in reply["Error"]
    assert serve_world.ledger.table not in reply["Error"] and "EndpointConnectionError" not in reply["Error"]
    pod = make_pod("share", 0, milli=500)
    serve_world.api.load("pods", [pod])
    status, reply = serve_world.bind(pod, "t4-0")
    assert status == 200 and "the GPU ledger write failed: DynamoDB did not answer" in reply["Error"], reply
    assert serve_world.ledger.table not in reply["Error"]
    assert serve_world.api.get("pods", "share", "default")["spec"].get("nodeName") is None
    assert serve_world.api_writes() == []


def test_a_mig_resource_that_is_no_profile_is_refused_naming_it(world: World) -> None:
    """A tenant's ``nvidia.com/mig-<anything>`` is named back, cut; the filter answers, prioritize is a 400."""
    pod = make_pod("not-a-profile", 0)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/mig-" + "x" * 300] = "1"
    status, reply = world.call("filter", filter_body(pod, ["a100-1"]))
    assert status == 200 and reply["NodeNames"] == [] and "is not a MIG profile" in reply["Error"]
    assert len(reply["Error"]) < 300
    status, reply = world.call("prioritize", filter_body(pod, ["a100-1"]))
    assert status == 400 and "is not a MIG profile" in reply["Error"]


POD = json.dumps(make_pod("cpu-only", 0))


@pytest.mark.parametrize(
    ("raw", "status", "expected"),
    [
        ('{"Pod":' + "[" * 100_000 + "]" * 100_000 + ',"NodeNames":[]}', 400, "nested too deeply"),
        ('{"Pod":' + POD + ',"NodeNames":["t4-0"]} trailing', 400, "request body is not valid JSON"),
        ('{"Pod":' + POD + ',"NodeNames":["t4-0", 7]}', 400, "NodeNames: expected a list of strings"),
        ('{"Pod":' + POD + ',"NodeNames":["nowhere"],"NodeNames":["t4-0"]}', 200, ["t4-0"]),  # the last, as Go
        ('{"Pod":' + POD + ',"nodenames":["t4-0"],"Nodes":null}', 200, ["t4-0"]),  # any case, as Go's decoder
    ],
    ids=["deep nesting", "trailing bytes", "a name not a string", "NodeNames twice", "another case"],
)
def test_bodies_off_the_one_pass_decoders_form_get_the_general_paths_answer(
    world: World, raw: str, status: int, expected: Any
) -> None:
    """The names form is decoded in one pass only as kube-scheduler writes it; anything else, hostile or
    merely unusual, is read by the general path, with its messages."""
    got, reply = world.call("filter", raw.encode())
    assert got == status
    if status == 400:
        assert expected in reply["Error"]
    else:
        assert reply["NodeNames"] == expected and reply["Error"] == ""


@pytest.mark.parametrize(
    "first_line",
    [b"GET /healthz\r\n", b"junk\r\n", b"POST /filter HTTP/2.0\r\n", b"GET / HTTP/1.1 extra\r\n"],
    ids=["HTTP/0.9", "junk", "HTTP/2.0 in text", "four words"],
)
def test_a_malformed_request_line_gets_a_status_line(serve_world: World, first_line: bytes) -> None:
    """A first line that is no HTTP/1.x request line was answered with a bare body (``http.server``'s
    HTTP/0.9 default writes no status line): now a 400 with one and a JSON error, and the connection closes."""
    with raw(serve_world.port) as sock:
        sock.sendall(first_line + b"\r\n")
        reply = response_of(sock)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 Bad Request\r\n") and b"Connection: close" in head, reply[:120]
    assert json.loads(body)["Error"].startswith("Bad request line")


NOT_API_GATEWAY: dict[str, Any] = {
    "an HTTP API (v2) event": {"version": "2.0", "routeKey": "POST /filter", "rawPath": "/filter", "body": "{}"},
    "an empty object": {},
    "a list": [1, 2],
    "a string": "POST /filter",
    "null": None,
    "a method that is not a string": {"httpMethod": 7, "path": "/filter", "requestContext": {}},
    "no requestContext": {"httpMethod": "POST", "path": "/filter", "body": "{}"},
    "a body that is an object": {"httpMethod": "POST", "path": "/filter", "requestContext": {}, "body": {"Pod": 1}},
    "headers that are a list": {"httpMethod": "GET", "path": "/healthz", "requestContext": {}, "headers": ["x"]},
}


@pytest.mark.parametrize("event", sorted(NOT_API_GATEWAY))
def test_an_event_that_is_not_api_gateways_gets_a_clean_400(event: str, aws_session: Any, fresh_handler: Any) -> None:
    """The function's resource policy lets API Gateway invoke it, but whoever may invoke it can send any
    event: it raised ``KeyError: 'httpMethod'`` on one that is not API Gateway's. Now a 400 naming what is
    wrong, as a proxy response."""
    from tests.conftest import FakeLambdaContext

    handler = fresh_handler("lambdas.extender.handler", POWERTOOLS_METRICS_NAMESPACE="GpuSchedulerSecurity")
    response = handler.lambda_handler(NOT_API_GATEWAY[event], FakeLambdaContext())
    assert response["statusCode"] == 400 and response["headers"] == {"Content-Type": "application/json"}
    assert json.loads(response["body"])["Error"].startswith("not an API Gateway REST proxy event: ")


def test_a_thousand_milli_is_refused_by_every_verb_and_writes_nothing(world: World) -> None:
    """1000 milli or more wrote whole GPUs to the ledger with no reservation pod and no device (the device
    plugin gives a pod none for gpu-milli): refused now, with what to ask instead, and nothing written."""
    pod = make_pod("big", 0, milli=2000)
    world.api.load("pods", [pod])
    status, reply = world.call("filter", filter_body(pod, ["t4-0"]))
    assert status == 200 and "ask for whole GPUs as nvidia.com/gpu (2)" in reply["Error"]
    status, reply = world.bind(pod, "t4-0")
    assert status == 200 and "a share is 1..999 milli of one GPU" in reply["Error"]
    assert sum(world.ledger_used().values()) == 0 and world.api_writes() == []
