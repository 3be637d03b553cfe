import boto3
import pytest
from botocore.config import Config
from botocore.stub import Stubber
from moto import mock_aws

from adapters.snapshot_store import (
    FileSnapshotStore,
    S3SnapshotStore,
    SnapshotNotFoundError,
    SnapshotSource,
    SnapshotStoreError,
    open_store,
)
from scheduler_core.errors import ClusterStateUnavailableError
from scheduler_core.state.snapshot import Revision, build_snapshot, read_snapshot, snapshot_revision, write_snapshot
from tests.conftest import make_nodes, make_pod

NOW = 1_800_000_000.0


def snapshot_bytes(generated_at=NOW, used=0):
    pods = [make_pod("r", used, node_name="a100-0", phase="Running")] if used else []
    return write_snapshot(build_snapshot(make_nodes("A100", "T4"), pods, cluster="c", generated_at=generated_at))


class Clock:
    def __init__(self, wall=NOW, mono=0.0):
        self.wall, self.mono = wall, mono

    def advance(self, seconds):
        self.wall += seconds
        self.mono += seconds


class CountingStore:
    """A real store that counts how often the source looked at it."""

    def __init__(self, inner):
        self.inner, self.fetches, self.uri = inner, 0, inner.uri

    def fetch(self, etag):
        self.fetches += 1
        return self.inner.fetch(etag)

    def put(self, data):
        return self.inner.put(data)


@pytest.fixture
def s3():
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="snapshots")
        yield client


def test_file_store_round_trips_and_skips_unchanged_reads(tmp_path):
    store = FileSnapshotStore(tmp_path / "snap.npz")
    etag = store.put(b"PK\x03\x04one")
    first = store.fetch(None)
    assert first.data == b"PK\x03\x04one" and first.etag == etag
    assert store.fetch(etag) is None
    store.put(b"PK\x03\x04two!")
    assert store.fetch(etag).data == b"PK\x03\x04two!"


def test_file_store_missing_file_is_not_found(tmp_path):
    with pytest.raises(SnapshotNotFoundError, match="no snapshot file"):
        FileSnapshotStore(tmp_path / "none.npz").fetch(None)


def test_s3_store_uses_conditional_get(s3):
    store = open_store("s3://snapshots/prod/snapshot.npz", s3_client=s3)
    assert isinstance(store, S3SnapshotStore)
    etag = store.put(b"data-1")
    fetched = store.fetch(None)
    assert (fetched.data, fetched.etag) == (b"data-1", etag)
    assert store.fetch(etag) is None, "If-None-Match on an unchanged object answers 304"
    store.put(b"data-2")
    assert store.fetch(etag).data == b"data-2"


def test_s3_missing_object_and_bucket_are_errors_naming_the_uri(s3):
    with pytest.raises(SnapshotNotFoundError, match="s3://snapshots/absent: no such object"):
        open_store("s3://snapshots/absent", s3_client=s3).fetch(None)
    with pytest.raises(SnapshotStoreError, match="s3://no-bucket/k: NoSuchBucket"):
        open_store("s3://no-bucket/k", s3_client=s3).fetch(None)


def test_s3_access_denied_is_a_store_error():
    client = boto3.client("s3", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y")
    with Stubber(client) as stub:
        stub.add_client_error(
            "get_object", service_error_code="AccessDenied", service_message="no", http_status_code=403
        )
        with pytest.raises(SnapshotStoreError, match="AccessDenied: no"):
            S3SnapshotStore("b", "k", client).fetch(None)


def test_s3_unreachable_endpoint_is_a_store_error():
    client = boto3.client(
        "s3",
        region_name="us-east-1",
        endpoint_url="http://127.0.0.1:9",
        aws_access_key_id="x",
        aws_secret_access_key="y",
        config=Config(retries={"max_attempts": 1}, connect_timeout=1),
    )
    with pytest.raises(SnapshotStoreError, match="s3://b/k: Could not connect"):
        S3SnapshotStore("b", "k", client).fetch(None)


@pytest.mark.parametrize("uri", ["s3://bucket-only", "s3:///key", "http://example/snap", ""])
def test_bad_uris_are_rejected(uri):
    with pytest.raises(ValueError, match="snapshot URI"):
        open_store(uri)


def test_source_rechecks_at_most_every_refresh_interval(s3):
    store = CountingStore(open_store("s3://snapshots/s.npz", s3_client=s3))
    store.put(snapshot_bytes())
    clock = Clock()
    source = SnapshotSource(store, refresh_s=10, wall_clock=lambda: clock.wall, monotonic=lambda: clock.mono)
    assert source().free_gpus.tolist() == [8, 4]
    clock.advance(5)
    source()
    assert store.fetches == 1
    store.put(snapshot_bytes(generated_at=NOW + 6, used=3))
    clock.advance(5)
    assert source().free_gpus.tolist() == [5, 4]
    assert store.fetches == 2


def test_stale_snapshot_is_refused_with_its_age(tmp_path):
    store = FileSnapshotStore(tmp_path / "s.npz")
    store.put(snapshot_bytes(generated_at=NOW - 200))
    source = SnapshotSource(store, max_age_s=180, wall_clock=lambda: NOW)
    with pytest.raises(ClusterStateUnavailableError, match=r"cluster snapshot is 200 s old \(limit 180 s\)") as info:
        source()
    assert info.value.kind == "stale"
    assert source.last_age_s == pytest.approx(200)


@pytest.mark.parametrize(
    ("content", "kind", "message"),
    [
        pytest.param(None, "missing", "no snapshot file", id="missing snapshot"),
        pytest.param(b"PK\x03\x04garbage", "corrupt", "truncated or corrupt", id="corrupt snapshot"),
    ],
)
def test_no_usable_snapshot_is_unavailable_with_a_kind(tmp_path, content, kind, message):
    path = tmp_path / "s.npz"
    if content is not None:
        path.write_bytes(content)
    events = []
    source = SnapshotSource(FileSnapshotStore(path), wall_clock=lambda: NOW, on_refresh=events.append)
    with pytest.raises(ClusterStateUnavailableError, match=message) as info:
        source()
    assert info.value.kind == kind
    assert [e.result for e in events] == [kind]


def test_a_bad_refresh_keeps_the_previous_snapshot(tmp_path):
    store = FileSnapshotStore(tmp_path / "s.npz")
    store.put(snapshot_bytes(used=2))
    clock = Clock()
    events = []
    source = SnapshotSource(
        store, refresh_s=1, wall_clock=lambda: clock.wall, monotonic=lambda: clock.mono, on_refresh=events.append
    )
    assert source().free_gpus.tolist() == [6, 4]
    store.put(b"PK\x03\x04 half-written")
    clock.advance(2)
    assert source().free_gpus.tolist() == [6, 4]
    (tmp_path / "s.npz").unlink()
    clock.advance(2)
    assert source().free_gpus.tolist() == [6, 4]
    assert [e.result for e in events] == ["loaded", "corrupt", "missing"]


def revised(low, high, generated_at=NOW):
    snapshot = build_snapshot(make_nodes("A100"), [], cluster="c", generated_at=generated_at)
    return write_snapshot(snapshot, revision=Revision(low, high))


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_an_older_revision_never_replaces_a_newer_one(kind, tmp_path, s3):
    store = FileSnapshotStore(tmp_path / "snap.npz") if kind == "file" else open_store("s3://snapshots/k", s3_client=s3)
    assert store.put(revised(10, 12)) is not None
    assert store.put(revised(9, 30)) is None, "its node list is older: kept the one there"
    assert snapshot_revision(store.fetch(None).data) == Revision(10, 12)
    assert store.put(revised(10, 12, generated_at=NOW + 60)) is not None, "the same cluster, dated later"
    assert read_snapshot(store.fetch(None).data).generated_at == NOW + 60
    assert store.put(revised(10, 13)) is not None
    assert snapshot_revision(store.fetch(None).data) == Revision(10, 13)
    assert store.put(snapshot_bytes()) is not None, "a snapshot without a revision (an operator's) is written"


def test_s3_conditional_write_compares_again_after_losing_a_race(s3):
    """Between this writer's HEAD and its PutObject another writer puts a newer snapshot: the If-Match
    fails, the writer reads the newer revision and keeps it."""
    store = S3SnapshotStore("snapshots", "k", s3)
    store.put(revised(5, 5))
    real_head = s3.head_object

    def head_then_race(**kwargs):
        answer = real_head(**kwargs)
        s3.head_object = real_head
        S3SnapshotStore("snapshots", "k", s3).put(revised(20, 20))  # the other writer, in between
        return answer

    s3.head_object = head_then_race
    assert store.put(revised(10, 10)) is None
    assert snapshot_revision(store.fetch(None).data) == Revision(20, 20)
    assert s3.head_object(Bucket="snapshots", Key="k")["Metadata"] == {"revision": "20-20"}


def test_s3_first_write_is_conditional_on_no_object(s3):
    """With no object there, the write is If-None-Match: * (a concurrent first write is not lost)."""
    store = S3SnapshotStore("snapshots", "k", s3)
    calls = []
    real_put = s3.put_object

    def spy(**kwargs):
        calls.append({k: v for k, v in kwargs.items() if k.startswith("If")})
        return real_put(**kwargs)

    s3.put_object = spy
    store.put(revised(1, 2))
    store.put(revised(3, 4))
    assert calls[0] == {"IfNoneMatch": "*"} and set(calls[1]) == {"IfMatch"}


def test_file_writers_in_threads_end_on_the_newest(tmp_path):
    import threading

    path = tmp_path / "snap.npz"
    payloads = [revised(n, n) for n in range(1, 41)]
    threads = [threading.Thread(target=FileSnapshotStore(path).put, args=(p,)) for p in reversed(payloads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert snapshot_revision(path.read_bytes()) == Revision(40, 40)
