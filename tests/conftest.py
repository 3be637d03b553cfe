"""Shared builders and the real kube-scheduler captures in ../shared/fixtures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scheduler_core.synthetic import CATALOGUE, ZONES, make_node, make_pod

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
