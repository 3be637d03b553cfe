"""Shared builders and the real kube-scheduler captures in ../shared/fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_scheduler.synthetic import CATALOGUE, ZONES, make_node, make_pod

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SCHEDULER_FIXTURES = SHARED / "fixtures" / "kube-scheduler"
SHAPES = {shape.model: shape for shape in CATALOGUE}


def scheduler_requests(verb: str | None = None) -> list[Path]:
    """Every request kube-scheduler sent in the captures (optionally one verb), sorted."""
    if not SCHEDULER_FIXTURES.is_dir():
        return []
    paths = sorted(p for p in SCHEDULER_FIXTURES.glob("*/*.request.json") if ".apiserver-binding." not in p.name)
    return [p for p in paths if verb is None or request_verb(p) == verb]


def request_verb(path: Path) -> str:
    return path.name.split("-", 2)[1]


def fixture_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name.removesuffix('.request.json')}"


def load_fixture(path: Path) -> Any:
    return json.loads(path.read_bytes())


def requires_fixtures() -> pytest.MarkDecorator:
    return pytest.mark.skipif(not SCHEDULER_FIXTURES.is_dir(), reason=f"{SCHEDULER_FIXTURES} is absent")


def make_nodes(*models: str, zones: tuple[str, ...] = ZONES, gfd: bool = True) -> list[dict[str, Any]]:
    """One v1 Node per model name ("A100", "H100", "L40S", "T4"), named ``<model>-<i>``."""
    return [
        make_node(f"{model.lower()}-{i}", SHAPES[model], zones[i % len(zones)], gfd=gfd)
        for i, model in enumerate(models)
    ]


__all__ = ["make_nodes", "make_pod"]


APISERVER_FIXTURES = SHARED / "fixtures" / "kube-apiserver"
NODE_PAGES = [
    APISERVER_FIXTURES / name
    for name in (
        "b1a-nodes-list-limit25-page1",
        "b1b-nodes-list-limit25-page2",
        "b1c-nodes-list-limit25-page3",
        "b1d-nodes-list-limit25-page4-last",
    )
]


def captured_nodes() -> list[dict[str, Any]]:
    """Every Node of the captures: the 80-node cluster (b1 pages) plus the 3-node small cluster."""
    nodes = [item for page in NODE_PAGES for item in load_fixture(page.with_suffix(".json"))["items"]]
    small = SCHEDULER_FIXTURES / "01-filter-prioritize-nodecache-false" / "01-filter-gpu-a100-2.request.json"
    return nodes + load_fixture(small)["Nodes"]["items"]


def api_gateway_event(
    method: str, path: str, body: bytes | str | None = None, *, base64: bool = False
) -> dict[str, Any]:
    """An API Gateway REST API proxy event (payload v1), as a private API with a VPC endpoint sends it."""
    import base64 as b64

    text = body.decode() if isinstance(body, bytes) else body
    if base64 and text is not None:
        text = b64.b64encode(text.encode()).decode()
    headers = {
        "Content-Type": "application/json",
        "Host": "abc123.execute-api.us-east-1.amazonaws.com",
        "User-Agent": "Go-http-client/1.1",
        "x-amzn-vpce-id": "vpce-0123456789abcdef0",
    }
    return {
        "resource": path,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": None,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": path,
            "httpMethod": method,
            "path": f"/prod{path}",
            "stage": "prod",
            "requestId": "c6af9ac6-7b61-11e6-9a41-93e8deadbeef",
            "accountId": "123456789012",
            "apiId": "abc123",
            "identity": {"sourceIp": "10.0.1.23", "vpceId": "vpce-0123456789abcdef0"},
        },
        "body": text,
        "isBase64Encoded": base64,
    }


@pytest.fixture
def aws_session(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Fake credentials and moto for every AWS call in the test: nothing reaches real AWS."""
    import boto3
    from moto import mock_aws

    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    with mock_aws():
        yield boto3.session.Session(region_name="us-east-1")


class FakeLambdaContext:
    function_name = "gpu-scheduler-extender"
    memory_limit_in_mb = 512
    invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:gpu-scheduler-extender"
    aws_request_id = "52fdfc07-2182-154f-163f-5f0f9a621d72"


def assert_catalogued(emf_documents: list[dict[str, Any]], service: str) -> set[str]:
    """Every metric in these EMF documents is catalogued for ``service`` with the same unit and dimensions;
    returns the names seen."""
    from adapters.metric_catalogue import emitted, spec

    names = set()
    for name, unit, dimensions in emitted(emf_documents):
        expected = spec(name, service)
        assert (unit, dimensions) == (expected.unit, tuple(sorted(expected.all_dimensions))), name
        names.add(name)
    return names
