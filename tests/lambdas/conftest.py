"""Loading a Lambda handler as a new sandbox does: its environment set, then a fresh import."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest


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
