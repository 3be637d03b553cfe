"""The real Prometheus for tests: skip (with the reason) where the binaries are absent."""

from __future__ import annotations

import pytest

from testing.prometheus import MISSING, PROMETHEUS, PROMTOOL, prometheus_with

requires_prometheus = pytest.mark.skipif(not (PROMETHEUS and PROMTOOL), reason=MISSING)

__all__ = ["prometheus_with", "requires_prometheus"]
