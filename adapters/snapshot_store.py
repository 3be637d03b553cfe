"""Where cluster snapshots live, and the in-memory copy the extender serves from.

``SNAPSHOT_URI`` (or ``--snapshot``) selects the store: ``s3://bucket/key``, ``file:///path`` or a
plain path. :class:`SnapshotSource` keeps the parsed snapshot in memory, re-checks the store at most
every ``refresh_s`` with a conditional read (``If-None-Match`` on the ETag for S3, mtime and size
for files), and refuses a snapshot older than ``max_age_s``. A failed refresh keeps the previous
snapshot while it is young enough: nothing already loaded is lost to a bad write or an S3 error.

Writes of a snapshot that carries a :class:`~scheduler_core.state.snapshot.Revision` are conditional:
the store keeps the one it holds when that one is newer, and checks and replaces in one
step (S3: ``If-Match`` on the ETag read, or ``If-None-Match: *``; files: under an ``flock``), so two
refreshers that overlap never put an older picture over a newer one.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse

from adapters.errors import AdapterError
from scheduler_core.errors import ClusterStateUnavailableError
from scheduler_core.state.cluster import ClusterState
from scheduler_core.state.snapshot import Revision, SnapshotFormatError, read_snapshot, snapshot_revision

DEFAULT_REFRESH_S = 1.0
"""How often the extender re-checks the store: a conditional read that costs a 304 when nothing changed."""
DEFAULT_MAX_AGE_S = 180.0
MAX_CLOCK_SKEW_S = 30.0
"""How far in the future a snapshot's date may be (clocks of two machines disagree a little; more is wrong)."""


class SnapshotStoreError(AdapterError):
    """The store could not be read (permissions, network, throttling...)."""


class SnapshotNotFoundError(SnapshotStoreError):
    """The store holds no snapshot at that location."""


REVISION_METADATA = "revision"
"""The S3 user metadata (``x-amz-meta-revision``) that mirrors the snapshot header's revision."""
CONDITIONAL_ATTEMPTS = 5
"""Conditional writes tried before a put gives up (each lost race means another writer just wrote)."""


@dataclass(frozen=True)
class Fetched:
    data: bytes
    etag: str


class SnapshotStore(Protocol):
    uri: str

    def fetch(self, etag: str | None) -> Fetched | None:
        """The snapshot bytes, or ``None`` when they are unchanged since ``etag``."""

    def put(self, data: bytes) -> str | None:
        """Write a snapshot atomically and return its ETag; None when the store holds a snapshot of a newer
        revision (see the module docstring), which it keeps."""


class FileSnapshotStore:
    """A snapshot file; its ETag is its mtime and size. Writes are atomic (rename)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.uri = f"file://{self.path.resolve()}"

    def _etag(self) -> str:
        stat = self.path.stat()
        return f"{stat.st_mtime_ns:x}-{stat.st_size:x}"

    def fetch(self, etag: str | None) -> Fetched | None:
        try:
            current = self._etag()  # before reading: a write during the read shows up next time
            if current == etag:
                return None
            return Fetched(self.path.read_bytes(), current)
        except FileNotFoundError as exc:
            raise SnapshotNotFoundError(f"{self.path}: no snapshot file") from exc
        except OSError as exc:
            raise SnapshotStoreError(f"{self.path}: {exc.strerror}") from exc

    def put(self, data: bytes) -> str | None:
        revision = snapshot_revision(data)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(self.path.with_name(f".{self.path.name}.lock"), "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                if revision is not None and not _newer(revision, self._stored_revision()):
                    return None
                tmp.write_bytes(data)
                os.replace(tmp, self.path)
                return self._etag()
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise SnapshotStoreError(f"{self.path}: {exc.strerror or exc}") from exc

    def _stored_revision(self) -> Revision | None:
        try:
            return snapshot_revision(self.path.read_bytes())
        except FileNotFoundError:
            return None


class S3SnapshotStore:
    """A snapshot object in S3, read with ``If-None-Match`` so an unchanged object costs a 304."""

    def __init__(self, bucket: str, key: str, client: Any) -> None:
        self.bucket, self.key, self.client = bucket, key, client
        self.uri = f"s3://{bucket}/{key}"

    def reconnect(self) -> None:
        """A fresh client, as this one was made (region, endpoint, settings): its connections and
        credentials are not carried over a SnapStart restore."""
        import boto3

        meta = self.client.meta
        self.client = boto3.client(
            "s3", region_name=meta.region_name, endpoint_url=meta.endpoint_url, config=meta.config
        )

    def fetch(self, etag: str | None) -> Fetched | None:
        from botocore.exceptions import BotoCoreError, ClientError

        kwargs = {"Bucket": self.bucket, "Key": self.key} | ({"IfNoneMatch": etag} if etag else {})
        try:
            response = self.client.get_object(**kwargs)
            return Fetched(response["Body"].read(), response["ETag"])
        except ClientError as exc:
            error = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status == 304 or error.get("Code") in ("304", "NotModified"):
                return None
            if error.get("Code") in ("NoSuchKey", "404", "NotFound"):
                raise SnapshotNotFoundError(f"{self.uri}: no such object") from exc
            raise SnapshotStoreError(f"{self.uri}: {error.get('Code')}: {error.get('Message')}") from exc
        except BotoCoreError as exc:
            raise SnapshotStoreError(f"{self.uri}: {exc}") from exc

    def put(self, data: bytes) -> str | None:
        """One PutObject: S3 replaces the object atomically, so readers see the old or the new one. With a
        revision, the PutObject is conditional on the ETag of the object whose revision was compared."""
        from botocore.exceptions import BotoCoreError, ClientError

        revision = snapshot_revision(data)
        metadata = {REVISION_METADATA: str(revision)} if revision is not None else {}
        try:
            for _attempt in range(CONDITIONAL_ATTEMPTS if revision is not None else 1):
                condition: dict[str, str] = {}
                if revision is not None:
                    stored, etag = self._stored()
                    if not _newer(revision, stored):
                        return None
                    condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}
                try:
                    response = self.client.put_object(
                        Bucket=self.bucket, Key=self.key, Body=data, Metadata=metadata, **condition
                    )
                    return str(response["ETag"])
                except ClientError as exc:
                    if not condition or _error_code(exc) not in _LOST_RACE:
                        raise
                    # another writer got there between the comparison and the write: compare again
        except ClientError as exc:
            error = exc.response.get("Error", {})
            raise SnapshotStoreError(f"{self.uri}: {error.get('Code')}: {error.get('Message')}") from exc
        except BotoCoreError as exc:
            raise SnapshotStoreError(f"{self.uri}: {exc}") from exc
        raise SnapshotStoreError(
            f"{self.uri}: other writers replaced the snapshot {CONDITIONAL_ATTEMPTS} times while this one "
            "compared revisions; not written"
        )

    def _stored(self) -> tuple[Revision | None, str | None]:
        """The revision and ETag of the object there now; (None, None) when there is none."""
        from botocore.exceptions import ClientError

        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.key)
        except ClientError as exc:
            if _error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                return None, None
            raise
        return Revision.parse((head.get("Metadata") or {}).get(REVISION_METADATA)), str(head["ETag"])


_LOST_RACE = ("PreconditionFailed", "412", "ConditionalRequestConflict", "409")
"""S3's answers to a conditional write that another writer got to first."""


def _error_code(exc: Any) -> str:
    response = exc.response
    return str(response.get("Error", {}).get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


def _newer(revision: Revision, stored: Revision | None) -> bool:
    """True when a snapshot of ``revision`` may replace one of ``stored`` (None: none, or unknown). The
    same revision may: it is the same cluster, and its later ``generated_at`` keeps it from going stale."""
    return stored is None or revision >= stored


def open_store(uri: str, *, s3_client: Any = None) -> SnapshotStore:
    """Open the store named by ``uri``; ``s3_client`` is a boto3 S3 client (made if not given).

    >>> open_store("/tmp/snapshot.npz").uri
    'file:///tmp/snapshot.npz'
    """
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        key = parsed.path.lstrip("/")
        if not parsed.netloc or not key:
            raise ValueError(f"snapshot URI {uri!r}: expected s3://bucket/key")
        if s3_client is None:
            import boto3

            s3_client = boto3.client("s3")
        return S3SnapshotStore(parsed.netloc, key, s3_client)
    if parsed.scheme == "file":
        return FileSnapshotStore(unquote(parsed.path))
    if parsed.scheme == "" and uri:
        return FileSnapshotStore(uri)
    raise ValueError(f"snapshot URI {uri!r}: expected s3://bucket/key, file:///path or a path")


@dataclass(frozen=True)
class RefreshEvent:
    """One look at the store: ``result`` is ``loaded``, ``unchanged``, or an error kind."""

    result: str
    duration_ms: float
    detail: str = ""


class SnapshotSource:
    """The extender's cluster source: a snapshot kept in memory and refreshed from a store.

    Call it to get the current :class:`ClusterState`. It raises
    :class:`ClusterStateUnavailableError` with ``kind`` ``missing``, ``corrupt`` or ``store_error``
    when no snapshot could ever be loaded, and ``stale`` when the one it has is older than
    ``max_age_s``.
    """

    def __init__(
        self,
        store: SnapshotStore,
        *,
        refresh_s: float = DEFAULT_REFRESH_S,
        max_age_s: float = DEFAULT_MAX_AGE_S,
        wall_clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        trace: Callable[[str], AbstractContextManager[Any]] | None = None,
        on_refresh: Callable[[RefreshEvent], None] | None = None,
    ) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self.max_age_s = max_age_s
        self._wall = wall_clock
        self._monotonic = monotonic
        self._trace = trace or (lambda _name: nullcontext())
        self._on_refresh = on_refresh
        self._lock = threading.Lock()
        self._snapshot: ClusterState | None = None
        self._etag: str | None = None
        self._checked_at = float("-inf")
        self._last_error: tuple[str, str] = ("missing", f"{store.uri}: not read yet")
        self.last_age_s: float | None = None

    def __call__(self) -> ClusterState:
        return self.current()

    def expire(self) -> None:
        """Look at the store again on the next call (a conditional read: the snapshot held is kept if
        the store still has it), whatever the refresh interval says."""
        with self._lock:
            self._checked_at = float("-inf")

    def current(self) -> ClusterState:
        if self._monotonic() - self._checked_at >= self.refresh_s:
            with self._lock:
                if self._monotonic() - self._checked_at >= self.refresh_s:
                    self._refresh()
        snapshot = self._snapshot
        if snapshot is None:
            kind, detail = self._last_error
            raise ClusterStateUnavailableError(f"no cluster snapshot: {detail}", kind=kind)
        age = snapshot.age_s(self._wall())
        self.last_age_s = age
        if age < -MAX_CLOCK_SKEW_S:
            # Not from a clock this close to ours: trusting it would make it fresh until that date.
            raise ClusterStateUnavailableError(
                f"cluster snapshot is dated {-age:.0f} s in the future (more than {MAX_CLOCK_SKEW_S:.0f} s of "
                "clock skew); refusing it until a refresher writes one with a true time",
                kind="corrupt",
            )
        if age > self.max_age_s:
            raise ClusterStateUnavailableError(
                f"cluster snapshot is {age:.0f} s old (limit {self.max_age_s:.0f} s); "
                "is the node-state refresher running?",
                kind="stale",
            )
        return snapshot

    def _refresh(self) -> None:
        started = time.perf_counter()
        self._checked_at = self._monotonic()
        with self._trace("## snapshot refresh"):
            try:
                fetched = self.store.fetch(self._etag)
                if fetched is None:
                    event = RefreshEvent("unchanged", 0.0)
                else:
                    self._snapshot, self._etag = read_snapshot(fetched.data), fetched.etag
                    event = RefreshEvent("loaded", 0.0, f"{self._snapshot.table.n_nodes} nodes")
            except SnapshotNotFoundError as exc:
                event = RefreshEvent("missing", 0.0, str(exc))
            except SnapshotStoreError as exc:
                event = RefreshEvent("store_error", 0.0, str(exc))
            except SnapshotFormatError as exc:
                event = RefreshEvent("corrupt", 0.0, f"{self.store.uri}: {exc}")
        event = RefreshEvent(event.result, 1000 * (time.perf_counter() - started), event.detail)
        if event.result not in ("loaded", "unchanged"):
            self._last_error = (event.result, event.detail)
        if self._on_refresh is not None:
            self._on_refresh(event)
