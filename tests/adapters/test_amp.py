"""The AMP query client against a real Prometheus, and its SigV4 signing checked independently."""

from __future__ import annotations

import datetime
import hashlib
import hmac
import math
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from botocore.credentials import Credentials

from adapters.amp import PrometheusClient, PrometheusQueryError, Sample, utilization_by_node, utilization_query
from tests.conftest import prometheus_with, requires_prometheus

pytestmark = pytest.mark.server  # a real Prometheus

SERIES = {
    (("Hostname", "gpu-a"), ("gpu", "0"), ("modelName", "NVIDIA H100 80GB HBM3")): 40.0,
    (("Hostname", "gpu-a"), ("gpu", "1"), ("modelName", "NVIDIA H100 80GB HBM3")): 75.0,
    (("Hostname", "gpu-b"), ("gpu", "3"), ("modelName", "Tesla T4")): 100.0,
}


@requires_prometheus
def test_utilisation_read_back_from_a_real_prometheus(tmp_path: Path) -> None:
    with prometheus_with({"DCGM_FI_DEV_GPU_UTIL": SERIES}, tmp_path) as url:
        samples = PrometheusClient(url).query(utilization_query())
    by_node, problems = utilization_by_node(samples)
    assert problems == []
    assert by_node["gpu-a"] == [0.40, 0.75]
    assert by_node["gpu-b"][3] == 1.0 and all(math.isnan(v) for v in by_node["gpu-b"][:3])


@requires_prometheus
def test_prometheus_errors_name_the_problem(tmp_path: Path) -> None:
    with prometheus_with({"DCGM_FI_DEV_GPU_UTIL": SERIES}, tmp_path) as url:
        client = PrometheusClient(url)
        with pytest.raises(PrometheusQueryError, match="HTTP 400"):
            client.query("avg by (")  # a PromQL syntax error
        with pytest.raises(PrometheusQueryError, match="expected a vector"):
            client.query('"a string"')


def test_an_unreachable_endpoint_is_a_query_error() -> None:
    with pytest.raises(PrometheusQueryError, match=r"127\.0\.0\.1:9"):
        PrometheusClient("http://127.0.0.1:9", timeout_s=2).query("up")


def test_samples_without_node_or_gpu_are_reported_and_values_clamped() -> None:
    by_node, problems = utilization_by_node(
        [Sample({"Hostname": "n", "gpu": "0"}, 130.0), Sample({"gpu": "1"}, 5.0), Sample({"Hostname": "n"}, 5.0)]
    )
    assert by_node == {"n": [1.0]}
    assert len(problems) == 2


class _Capture(BaseHTTPRequestHandler):
    seen: ClassVar[dict[str, Any]] = {}

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Capture.seen = {"headers": {k.lower(): v for k, v in self.headers.items()}, "body": body, "path": self.path}
        payload = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def test_sigv4_headers_for_service_aps() -> None:
    """Recompute the signature from the AWS SigV4 specification, independently of botocore."""
    server = HTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host = f"127.0.0.1:{server.server_address[1]}"
        credentials = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "session-token")
        client = PrometheusClient(f"http://{host}/workspaces/ws-123", region="eu-west-1", credentials=credentials)
        client.query("up")
    finally:
        server.shutdown()
    headers, body = _Capture.seen["headers"], _Capture.seen["body"]
    assert _Capture.seen["path"] == "/workspaces/ws-123/api/v1/query"
    assert urllib.parse.parse_qs(body.decode()) == {"query": ["up"]}
    assert headers["x-amz-security-token"] == "session-token"
    amz_date = headers["x-amz-date"]
    day = amz_date[:8]
    assert abs(datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.UTC).timestamp()
               - datetime.datetime.now(datetime.UTC).timestamp()) < 300  # fmt: skip

    algorithm, _, rest = headers["authorization"].partition(" ")
    fields = dict(part.strip().split("=", 1) for part in rest.split(","))
    assert algorithm == "AWS4-HMAC-SHA256"
    assert fields["Credential"] == f"AKIDEXAMPLE/{day}/eu-west-1/aps/aws4_request"
    signed = fields["SignedHeaders"].split(";")
    assert {"host", "x-amz-date", "x-amz-security-token"} <= set(signed)

    canonical_headers = "".join(f"{name}:{headers[name].strip()}\n" for name in signed)
    canonical = "\n".join(
        ["POST", "/workspaces/ws-123/api/v1/query", "", canonical_headers, ";".join(signed),
         hashlib.sha256(body).hexdigest()]
    )  # fmt: skip
    scope = f"{day}/eu-west-1/aps/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(f"AWS4{credentials.secret_key}".encode(), day)
    for part in ("eu-west-1", "aps", "aws4_request"):
        key = _hmac(key, part)
    assert fields["Signature"] == hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def test_without_credentials_nothing_is_signed() -> None:
    headers = PrometheusClient("http://127.0.0.1:1").signed_headers(b"query=up")
    assert "Authorization" not in headers and headers["Content-Type"] == "application/x-www-form-urlencoded"
