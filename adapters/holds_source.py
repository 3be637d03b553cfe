"""Where the consolidator's holds live (``HOLDS_URI``: ``s3://bucket/key``, ``file:///path`` or a path, the
snapshot's stores), and the copy the extender's filter reads.

:class:`HoldsSource` keeps the book in memory and re-checks the store at most every ``refresh_s`` with a
conditional read (a 304 when nothing changed). No document yet is an empty book. A document that cannot
be read, or one the format refuses, keeps the book it had, and says why once per new ETag
(:attr:`HoldsSource.problem`): holds only ever narrow where a pod may go, and each lapses on its own.
The consolidator reads and writes the whole book (:func:`read_book`, :func:`write_book`); it runs one at
a time (the Lambda's reserved concurrency is 1), so a plain write is enough.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from adapters.snapshot_store import SnapshotNotFoundError, SnapshotStore, SnapshotStoreError
from scheduler_core.consolidation.holds import HoldBook, HoldsFormatError

log = logging.getLogger(__name__)


class HoldsSource:
    """The book at ``store``, for :class:`~scheduler_core.extender.facade.Extender`'s ``holds``: calling it
    gives ``(book, now)``."""

    def __init__(
        self,
        store: SnapshotStore,
        *,
        refresh_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store, self.refresh_s = store, refresh_s
        self._clock, self._monotonic = clock, monotonic
        self._book = HoldBook()
        self._etag: str | None = None
        self._checked = -float("inf")
        self._lock = threading.Lock()
        self.problem = ""

    def __call__(self) -> tuple[HoldBook, float]:
        if self._monotonic() - self._checked >= self.refresh_s and self._lock.acquire(blocking=False):
            try:
                self._refresh()
            finally:
                self._checked = self._monotonic()
                self._lock.release()
        return self._book, self._clock()

    def _refresh(self) -> None:
        try:
            fetched = self.store.fetch(self._etag)
        except SnapshotNotFoundError:
            self._book, self._etag, self.problem = HoldBook(), None, ""
            return
        except SnapshotStoreError as exc:
            self._complain(f"holds at {self.store.uri} not read, the last ones kept: {exc}")
            return
        if fetched is None:
            return
        try:
            self._book, self.problem = HoldBook.from_json(fetched.data), ""
        except HoldsFormatError as exc:
            self._complain(f"holds at {self.store.uri} refused, the last ones kept: {exc}")
        self._etag = fetched.etag  # a refused document is not re-read until it changes

    def _complain(self, problem: str) -> None:
        if problem != self.problem:
            log.warning(problem)
        self.problem = problem


def read_book(store: SnapshotStore) -> HoldBook:
    """The book at ``store`` (empty when there is none yet). Raises :class:`SnapshotStoreError` when the
    store cannot be read and :class:`HoldsFormatError` when the document is refused: the consolidator
    then plans nothing rather than forget its holds and its hourly budget."""
    try:
        fetched = store.fetch(None)
    except SnapshotNotFoundError:
        return HoldBook()
    assert fetched is not None  # an unconditional read always returns the bytes
    return HoldBook.from_json(fetched.data)


def write_book(store: SnapshotStore, book: HoldBook) -> None:
    store.put(book.to_json())
