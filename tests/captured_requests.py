"""The requests kube-scheduler sent in the captures (``../shared/fixtures/kube-scheduler``), replayed by
each of the extender's transports' tests: the facade, ``serve``'s HTTP server, the Lambda."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import fixture_id, requires_fixtures, scheduler_requests


def each_captured_request(test: Callable[..., Any]) -> Any:
    """``test`` once per captured filter and prioritize request, the request's file as its ``path``
    argument; skipped where the captures are absent."""
    every = scheduler_requests("filter") + scheduler_requests("prioritize")
    return requires_fixtures()(pytest.mark.parametrize("path", every, ids=fixture_id)(test))
