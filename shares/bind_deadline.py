"""The deadline of the bind running on each thread, which the bind's Kubernetes client asks before each call.

A bind has its budget for its calls, retries and waits (:data:`shares.binder.BIND_BUDGET_S`). Two waits
are set apart from it: a share's wait for its GPU's UUID neither counts against the budget nor adds to it
(:meth:`BindDeadline.set_apart`), and reading a failed Binding back gets a time of its own, whatever is left
(:meth:`BindDeadline.replaced`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class BindDeadline:
    """Per thread, when the bind running there must be done (``time.monotonic``); none outside a bind."""

    def __init__(self) -> None:
        self._until = threading.local()

    def left(self) -> float:
        """Seconds left to the bind running on this thread; infinite outside a bind."""
        until = getattr(self._until, "at", None)
        return math.inf if until is None else until - time.monotonic()

    @contextmanager
    def running(self, budget_s: float) -> Iterator[None]:
        """A bind on this thread, with ``budget_s`` from now."""
        self._until.at = time.monotonic() + budget_s
        try:
            yield
        finally:
            self._until.at = None

    @contextmanager
    def set_apart(self, until: float) -> Iterator[None]:
        """A wait up to ``until`` outside the bind's budget: calls meanwhile may run to ``until`` (or to the
        bind's deadline, if later), and the bind's deadline moves on by the time the wait took."""
        started = time.monotonic()
        budget = getattr(self._until, "at", None)
        self._until.at = until if budget is None else max(budget, until)
        try:
            yield
        finally:
            self._until.at = None if budget is None else budget + (time.monotonic() - started)

    @contextmanager
    def replaced(self, seconds: float) -> Iterator[None]:
        """``seconds`` from now for what runs inside, whatever the bind has left; the bind's deadline after."""
        budget, self._until.at = getattr(self._until, "at", None), time.monotonic() + seconds
        try:
            yield
        finally:
            self._until.at = budget
