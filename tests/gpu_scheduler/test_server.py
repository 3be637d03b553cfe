import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from adapters.cluster_file import ClusterFile
from application.extender.service import ExtenderService
from gpu_scheduler.server import ExtenderHTTPServer
from scheduler_core.errors import InvalidArgsError
from scheduler_core.extender.facade import Extender, ExtenderConfig
from tests.captured_requests import each_captured_request
from tests.conftest import assert_protocol_correct_filter, load_fixture, make_nodes, make_pod, request_verb

pytestmark = pytest.mark.server  # serve's HTTP server

GO_HEADERS = {"User-Agent": "Go-http-client/1.1", "Content-Type": "application/json", "Accept-Encoding": "gzip"}


@pytest.fixture
def server_for():
    servers = []

    def start(extender):
        server = ExtenderHTTPServer(("127.0.0.1", 0), ExtenderService(extender))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def post(port, path, payload, headers=GO_HEADERS, conn=None):
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("POST", path, body=payload, headers=headers)
    response = conn.getresponse()
    return response.status, response.getheader("Content-Type"), json.loads(response.read())


@pytest.fixture(scope="module")
def serve_process(tmp_path_factory):
    """The real `gpu-scheduler serve` command, on a free port."""
    cluster = tmp_path_factory.mktemp("cluster") / "cluster.json"
    cluster.write_text(json.dumps({"nodes": make_nodes("A100", "T4"), "pods": []}))
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_scheduler", "serve", "--port", "0", "--cluster", str(cluster)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    port = int(json.loads(line)["serving"].rsplit(":", 1)[1])
    yield proc, port
    proc.terminate()
    proc.wait(timeout=10)


@each_captured_request
def test_captured_requests_get_protocol_correct_replies_through_serve(serve_process, path):
    _, port = serve_process
    request = load_fixture(path)
    status, content_type, reply = post(port, f"/{request_verb(path)}", path.read_bytes())
    assert content_type == "application/json"
    if request_verb(path) == "filter":
        assert status == 200
        assert_protocol_correct_filter(request, reply)
    elif request["Nodes"] is not None:
        assert status == 200
        assert len(reply) == len(request["Nodes"]["items"])
        assert all(0 <= p["Score"] <= 10 for p in reply)
    else:
        # Names the small cluster file does not know score 0, one entry per name sent.
        assert status == 200
        assert sorted(p["Host"] for p in reply) == sorted(request["NodeNames"])
        assert all(p["Score"] == 0 for p in reply)


def test_healthz_and_unknown_paths(server_for):
    port = server_for(Extender())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/healthz")
    response = conn.getresponse()
    health = {"status": "ok", "snapshot": False, "ledger": False, "verbs": ["filter", "prioritize"]}
    assert (response.status, json.loads(response.read())) == (200, health)
    conn.request("GET", "/nope")
    response = conn.getresponse()
    assert response.status == 404
    assert json.loads(response.read())["Error"] == "no route GET '/nope': POST /filter, POST /prioritize, GET /healthz"


def test_metrics_count_replies_by_verb_and_status_beside_the_catalogued_ones(server_for):
    port = server_for(Extender())
    payload = json.dumps({"Pod": make_pod("p", 1), "Nodes": {"items": make_nodes("A100")}, "NodeNames": None})
    for _ in range(2):
        post(port, "/filter", payload)
    post(port, "/filter", "{not json")
    post(port, "/../../etc/passwd", payload)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:  # refused before its body is read
        sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(1024).startswith(b"HTTP/1.1 400")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/metrics")
    response = conn.getresponse()
    assert response.status == 200
    lines = {line for line in response.read().decode().splitlines() if not line.startswith("#")}
    assert {line for line in lines if line.startswith("gpu_scheduler_extender_requests_total")} == {
        'gpu_scheduler_extender_requests_total{verb="filter",status="200"} 2',
        'gpu_scheduler_extender_requests_total{verb="filter",status="400"} 2',
        'gpu_scheduler_extender_requests_total{verb="other",status="404"} 1',
    }
    # The Lambda's EMF set, under Prometheus names (tests/contract holds the two transports to one set).
    assert {
        "gpu_scheduler_extender_nodes_in_total 2",
        "gpu_scheduler_extender_nodes_feasible_total 2",
        "gpu_scheduler_extender_bad_requests_total 3",  # bad JSON, the unknown path, no Content-Length
        "gpu_scheduler_extender_filter_latency_ms_count 3",  # the two decisions and the bad JSON
    } <= lines


def test_keep_alive_serves_several_requests_on_one_connection(server_for):
    port = server_for(Extender())
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    payload = json.dumps({"Pod": make_pod("p", 1), "Nodes": {"items": make_nodes("A100")}, "NodeNames": None})
    for _ in range(3):
        status, _, reply = post(port, "/filter", payload, conn=conn)
        assert status == 200 and reply["Error"] == ""
    conn.sock.getsockname()  # the same socket is still open


def test_url_prefix_path_is_accepted(server_for):
    port = server_for(Extender())
    payload = json.dumps({"Pod": make_pod("p", 1), "Nodes": {"items": make_nodes("T4")}})
    status, _, reply = post(port, "/scheduler/prioritize", payload)
    assert status == 200 and reply == [{"Host": "t4-0", "Score": 10}]


def test_oversized_body_is_refused_from_content_length_without_reading_it(server_for):
    port = server_for(Extender(ExtenderConfig(max_body_bytes=1024)))
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(
        b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 999999999\r\n\r\n"
    )
    reply = sock.recv(65536).decode()
    assert reply.startswith("HTTP/1.1 400 Bad Request\r\n")
    assert "request body is 999999999 bytes; the limit is 1024" in reply
    assert "Connection: close" in reply
    sock.close()


def test_a_verb_not_served_is_a_404_whatever_the_size_of_its_body(server_for):
    """As on Lambda, where the facade names the verb before it weighs the body."""
    port = server_for(Extender(ExtenderConfig(max_body_bytes=1024)))  # no ledger: no bind
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"POST /bind HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999\r\n\r\n")
    reply = sock.recv(65536).decode()
    assert reply.startswith("HTTP/1.1 404 ") and "unknown verb 'bind'" in reply
    sock.close()


def test_missing_content_length_is_a_400(server_for):
    port = server_for(Extender())
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"POST /filter HTTP/1.1\r\nHost: x\r\n\r\n")
    reply = sock.recv(65536).decode()
    assert reply.startswith("HTTP/1.1 400 ")
    assert "Content-Length" in reply
    sock.close()


def test_internal_fault_is_a_500_without_a_traceback(server_for, caplog):
    def broken_cluster():
        raise RuntimeError("disk on fire")

    port = server_for(Extender(cluster=broken_cluster))
    payload = json.dumps({"Pod": make_pod("p", 1), "Nodes": {"items": make_nodes("A100")}})
    status, _, reply = post(port, "/filter", payload)
    assert status == 500
    assert "internal error" in reply["Error"]
    assert "disk on fire" not in reply["Error"] and "Traceback" not in reply["Error"]
    (record,) = [r for r in caplog.records if r.getMessage() == "internal error"]
    assert record.path == "/filter" and "disk on fire" in caplog.text  # the traceback is logged


def test_cluster_file_is_reread_when_it_changes_and_a_bad_rewrite_keeps_the_old_state(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"nodes": make_nodes("A100"), "pods": []}))
    now = [0.0]
    source = ClusterFile(path, refresh_s=5.0, clock=lambda: now[0])
    assert source().free_gpus.tolist() == [8]
    path.write_text(
        json.dumps({"nodes": make_nodes("A100"), "pods": [make_pod("r", 3, node_name="a100-0", phase="Running")]})
    )
    assert source().free_gpus.tolist() == [8], "not re-checked before refresh_s"
    now[0] = 5.0
    assert source().free_gpus.tolist() == [5]
    path.write_text('{"nodes": [')
    now[0] = 10.0
    assert source().free_gpus.tolist() == [5]


def test_unreadable_cluster_file_names_the_file(tmp_path):
    with pytest.raises(InvalidArgsError, match="cannot read cluster file"):
        ClusterFile(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"nodes": 3}')
    with pytest.raises(InvalidArgsError, match=r"bad\.json: cluster document: 'nodes' must be a list"):
        ClusterFile(bad)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_shuts_down_cleanly_on_signal(sig):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_scheduler", "serve", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    port = int(json.loads(proc.stdout.readline())["serving"].rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200  # an idle keep-alive connection stays open
    os.kill(proc.pid, sig)
    # The idle keep-alive connection above must not hold up the exit.
    assert proc.wait(timeout=10) == 0
    assert "shutting down" in proc.stderr.read()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1)


def test_serve_with_a_snapshot_answers_names_only_requests(tmp_path):
    from scheduler_core.state.snapshot import build_snapshot, write_snapshot

    path = tmp_path / "snapshot.npz"
    pods = [make_pod("r", 6, node_name="a100-0", phase="Running")]
    path.write_bytes(
        write_snapshot(build_snapshot(make_nodes("A100", "T4"), pods, cluster="c", generated_at=time.time()))
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_scheduler", "serve", "--port", "0", "--snapshot", f"file://{path}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(json.loads(proc.stdout.readline())["serving"].rsplit(":", 1)[1])
        # Three A100s for a whole-GPU pod: the model and the count are the node's own facts.
        payload = json.dumps({"Pod": make_pod("p", 3, models="A100"), "NodeNames": ["a100-0", "t4-1", "gone"]})
        status, _, reply = post(port, "/filter", payload)
        assert status == 200
        assert reply["NodeNames"] == ["a100-0"]
        assert reply["FailedNodes"] == {"gone": "node is not in the cluster state"}
        assert reply["FailedAndUnresolvableNodes"] == {"t4-1": "GPU model T4 not in A100"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_serve_rejects_a_bad_snapshot_uri():
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_scheduler", "serve", "--port", "0", "--snapshot", "s3://bucket-only"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "expected s3://bucket/key" in proc.stderr


def test_peers_annotation_pulls_a_pod_next_to_its_peers_through_serve(tmp_path):
    """End to end: a snapshot with a feature store on one node, a GPU pod that names it as a peer."""
    from scheduler_core.state.snapshot import build_snapshot, write_snapshot

    store = make_pod("fs", 0, node_name="a100-2", phase="Running")
    store["metadata"]["labels"] = {"app": "feature-store"}
    path = tmp_path / "snapshot.npz"
    path.write_bytes(
        write_snapshot(
            build_snapshot(make_nodes("A100", "A100", "A100"), [store], cluster="c", generated_at=time.time())
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_scheduler", "serve", "--port", "0", "--snapshot", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(json.loads(proc.stdout.readline())["serving"].rsplit(":", 1)[1])
        pod = make_pod("infer", 8)
        pod["metadata"]["annotations"]["gpu-scheduler.io/peers"] = "app=feature-store:3"
        names = ["a100-0", "a100-1", "a100-2"]
        status, _, scores = post(port, "/prioritize", json.dumps({"Pod": pod, "NodeNames": names}))
        assert status == 200
        best = max(scores, key=lambda p: p["Score"])
        assert best == {"Host": "a100-2", "Score": 10}
        assert all(p["Score"] < 10 for p in scores if p["Host"] != "a100-2")
        pod["metadata"]["annotations"]["gpu-scheduler.io/peers"] = "app=feature-store:lots"
        status, _, reply = post(port, "/filter", json.dumps({"Pod": pod, "NodeNames": names}))
        assert status == 200
        assert "weight 'lots' of 'app=feature-store'" in reply["Error"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_serve_with_a_ledger_binds_shares_and_preempts_end_to_end(tmp_path, monkeypatch):
    """The sidecar mode with sharing: `serve` as its own process, the ledger in moto's DynamoDB server,
    the pods in the API double. A T4 node is filled by binds (two shares on GPU 0, three whole GPUs asked
    as milli); a 900 share then fits nowhere until preemption frees GPU 0."""
    import boto3

    from bench.ledger import TABLE, create_table
    from scheduler_core.state.snapshot import build_snapshot, write_snapshot
    from testing.kube_double import KubeApiDouble
    from testing.moto import moto_server

    credentials = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
    nodes = make_nodes("T4")
    path = tmp_path / "snapshot.npz"
    path.write_bytes(write_snapshot(build_snapshot(nodes, [], cluster="c", generated_at=time.time())))
    bound = [make_pod("a", 0, milli=600), make_pod("b", 0, milli=300)]
    bound += [make_pod(f"w{k}", 0, milli=600) for k in (1, 2, 3)]
    late = make_pod("c", 0, milli=900)
    with moto_server() as endpoint, KubeApiDouble(tokens=["tok"]) as api:
        create_table(boto3.client("dynamodb", endpoint_url=endpoint))
        api.load("nodes", nodes)
        api.load("pods", [*bound, late])
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpu_scheduler", "serve", "--port", "0", "--snapshot", str(path),
             "--ledger-table", TABLE, "--kube-url", api.url, "--kube-token", "tok"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "AWS_ENDPOINT_URL_DYNAMODB": endpoint},
        )  # fmt: skip
        try:
            port = int(json.loads(proc.stdout.readline())["serving"].rsplit(":", 1)[1])
            for pod in bound:
                meta = pod["metadata"]
                bind = {"PodName": meta["name"], "PodNamespace": "default", "PodUID": meta["uid"], "Node": "t4-0"}
                assert post(port, "/bind", json.dumps(bind)) == (200, "application/json", {"Error": ""})
            names = ("a", "b", "w1", "w2", "w3")
            assigned = [api.get("pods", name, "default")["metadata"]["annotations"] for name in names]
            expected = ["0:600", "0:300", "1:600", "2:600", "3:600"]
            assert [a["gpu-scheduler.io/assigned-gpus"] for a in assigned] == expected
            # The snapshot still shows an empty node; the binds' ledger readings tell the filter otherwise.
            status, _, reply = post(port, "/filter", json.dumps({"Pod": late, "NodeNames": ["t4-0"]}))
            assert reply["NodeNames"] == [] and "none of 4 GPUs has 900 milli free" in reply["FailedNodes"]["t4-0"]
            uid = {pod["metadata"]["name"]: {"UID": pod["metadata"]["uid"]} for pod in bound}
            one = {"t4-0": {"Pods": [uid["a"]], "NumPDBViolations": 0}}
            status, _, reply = post(port, "/preempt", json.dumps({"Pod": late, "NodeNameToMetaVictims": one}))
            assert (status, reply) == (200, {"NodeNameToMetaVictims": {}})  # GPU 0 would have 700 free: too little
            both = {"t4-0": {"Pods": [uid["a"], uid["b"]], "NumPDBViolations": 0}}
            status, _, reply = post(port, "/preempt", json.dumps({"Pod": late, "NodeNameToMetaVictims": both}))
            assert (status, reply) == (200, {"NodeNameToMetaVictims": both})
        finally:
            proc.terminate()
            proc.wait(timeout=10)
