"""Shared builders and the real kube-scheduler captures in ../shared/fixtures."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from adapters.gpu_ledger import LedgerStore
from scheduler_core.placement.model import Cluster, Workload
from scheduler_core.placement.policies.base import Context
from scheduler_core.simulator.synthetic import CATALOGUE, ZONES, make_node, make_pod
from scheduler_core.state.ledger import Demand
from testing.prometheus import MISSING, PROMETHEUS, PROMTOOL, prometheus_with

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
SCHEDULER_FIXTURES = SHARED / "fixtures" / "kube-scheduler"
SHAPES = {shape.model: shape for shape in CATALOGUE}

SERVER_FIXTURES = frozenset({"aws_session", "fresh_handler", "world", "serve_world", "synth", "package_dir",
                             "control_plane", "prometheus"})  # fmt: skip
"""Fixtures that start a server or a stand-in for one: moto's AWS services, a Lambda handler's import (its
clients), ``serve``'s HTTP server, a CDK synth (jsii's Node.js process), Prometheus, the control plane."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The test tiers (docs/testing.md): a test that uses a server fixture, at any depth, is ``server``;
    ``make test-fast`` runs what is neither ``server``, ``slow`` nor ``e2e``."""
    for item in items:
        if SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)


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


__all__ = ["make_nodes", "make_pod", "prometheus_with"]


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


@pytest.fixture
def fresh_handler(monkeypatch: pytest.MonkeyPatch) -> Callable[..., ModuleType]:
    """``fresh_handler("lambdas.x.handler", VAR="value", ...)``: set the variables, then import the handler
    anew, so that its settings, Powertools objects and clients are built from them at import, as in Lambda."""

    def load(module: str, **env: Any) -> ModuleType:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        handler = (
            importlib.reload(importlib.import_module(module))
            if module in sys.modules
            else importlib.import_module(module)
        )
        # Powertools keeps the first load's log handler; point it at this test's captured stdout.
        handler.logger.logger_handler.stream = sys.stdout
        return handler

    return load


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


# ---- extender replies -------------------------------------------------------------------------
def assert_protocol_correct_filter(request, reply):
    """kube-scheduler's rules: a subset of what was sent, in the same form, every rejection with a reason."""
    if request["Nodes"] is not None:
        sent = [n["metadata"]["name"] for n in request["Nodes"]["items"]]
        assert reply["NodeNames"] is None
        kept_objects = reply["Nodes"]["items"]
        assert all(obj in request["Nodes"]["items"] for obj in kept_objects), "kept nodes are the objects sent"
        kept = [n["metadata"]["name"] for n in kept_objects]
    else:
        sent = request["NodeNames"]
        assert reply["Nodes"] is None
        kept = reply["NodeNames"]
    failed, unresolvable = reply["FailedNodes"], reply["FailedAndUnresolvableNodes"]
    assert isinstance(reply["Error"], str)
    assert set(kept) <= set(sent)
    assert set(failed) <= set(sent) and set(unresolvable) <= set(sent)
    assert not set(failed) & set(unresolvable)
    if not reply["Error"]:
        assert set(kept) | set(failed) | set(unresolvable) == set(sent)
    assert all(isinstance(r, str) and r for r in [*failed.values(), *unresolvable.values()])


# ---- the GPU ledger ---------------------------------------------------------------------------
class RacingClient:
    """A client whose first ``races`` puts lose to another writer that takes 300 milli on ``node`` in between."""

    def __init__(self, client: Any, other: LedgerStore, races: int, node: str = "gpu-a", gpu_count: int = 2) -> None:
        self.client, self.other, self.races = client, other, races
        self.node, self.gpu_count = node, gpu_count

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)

    def put_item(self, **kwargs: Any) -> Any:
        if self.races:
            self.races -= 1
            self.other.assign(self.node, self.gpu_count, f"rival-{self.races}", Demand(1, 300))
        return self.client.put_item(**kwargs)


# ---- sharing: hand-built clusters and workloads -----------------------------------------------
def two_nodes() -> Cluster:
    """Node 0: 8 free GPUs. Node 1: 8 GPUs, GPU 0 has 500 left, GPU 1 has 200 left."""
    cluster = Cluster.build([96_000, 96_000], [786_432, 786_432], [8, 8], ["G2", "G2"])
    cluster.gpu_left[1, :2] = [500, 200]
    return cluster


def workload(*shapes: tuple[int, int, int, float]) -> Workload:
    """Shapes (cpu, gpu_milli, num_gpu, popularity), any model."""
    return Workload(
        cpu=np.array([s[0] for s in shapes]),
        gpu_milli=np.array([s[1] for s in shapes]),
        num_gpu=np.array([s[2] for s in shapes]),
        popularity=np.array([s[3] for s in shapes]),
        allowed=np.ones((1, len(shapes)), dtype=bool),
    )


def context(cluster: Cluster, work: Workload, seed: int = 0) -> Context:
    frag = work.fragmentation(cluster.gpu_left, cluster.cpu_left, cluster.model_id)
    return Context(cluster, work, frag, np.random.default_rng(seed), [set() for _ in range(cluster.n_nodes)])


# ---- the real Prometheus: skip (with the reason) where the binaries are absent -----------------
requires_prometheus = pytest.mark.skipif(not (PROMETHEUS and PROMTOOL), reason=MISSING)
