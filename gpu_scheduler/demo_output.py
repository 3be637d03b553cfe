"""The demo's output (:class:`Steps`): numbered step headers with the time since the start, progress
lines, and a line at least every :data:`TICK_S` while a step works."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

TICK_S = 5.0
"""The most time a step goes without printing a line."""


class Steps:
    """The demo's output: numbered step headers with the time since the start, and progress lines."""

    def __init__(self, total: int, *, quiet: bool = False) -> None:
        self.total, self.quiet, self.number = total, quiet, 0
        self.started = time.monotonic()
        self._last = self.started

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def say(self, text: str = "") -> None:
        if not self.quiet:
            print(text, flush=True)
        self._last = time.monotonic()

    def step(self, title: str) -> None:
        self.number += 1
        self.say(f"\n[{self.number}/{self.total} {self.elapsed():5.1f} s] {title}")

    def progress(self, what: str, done: int, total: int, *, final: bool = False) -> None:
        """``what: done/total`` when the last line is :data:`TICK_S` old, and at the end."""
        if final or time.monotonic() - self._last >= TICK_S:
            self.say(f"      {what}: {done}/{total}{' done' if final else ''} ({self.elapsed():.0f} s)")

    @contextmanager
    def working(self, what: str) -> Iterator[None]:
        """A line every :data:`TICK_S` while the block runs (a subprocess, a pool of simulations)."""
        stop = threading.Event()

        def tick() -> None:
            started = time.monotonic()
            while not stop.wait(TICK_S):
                self.say(f"      {what}: still working ({time.monotonic() - started:.0f} s)")

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()
