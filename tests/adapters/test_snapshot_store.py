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
from scheduler_core.state.snapshot import build_snapshot, write_snapshot
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
