"""ObjectStore against a real SeaweedFS S3 gateway on loopback: write-once
puts (single and multipart), checksummed fetches, and errors that name the
object."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path
from typing import Any

import boto3
import crc32c
import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import (
    ChecksumMismatch,
    ClusterError,
    ObjectExists,
    ObjectMissing,
    ObjectStoreDenied,
    ObjectStoreUnavailable,
)
from shardmgr.cluster.state.objects import ObjectStore
from tests.cluster_servers import S3_ACCESS_KEY, S3_SECRET_KEY, WeedServer, free_ports


def credentials(access: str = S3_ACCESS_KEY, secret: str = S3_SECRET_KEY) -> boto3.session.Session:
    return boto3.session.Session(aws_access_key_id=access, aws_secret_access_key=secret)


@pytest.fixture
def store(s3_config: ClusterConfig) -> ObjectStore:
    return ObjectStore(s3_config, session=credentials())


def a_file(path: Path, size: int, seed: int = 0) -> Path:
    path.write_bytes(os.urandom(size) if seed == 0 else bytes([seed]) * size)
    return path


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def test_a_file_goes_up_and_comes_back_verified(store: ObjectStore, s3_config: ClusterConfig, tmp_path: Path) -> None:
    src = a_file(tmp_path / "payload", 100_003)
    key = s3_config.object_key("docs", "payload")
    info = store.put_file(src, key)
    assert (info.key, info.size, info.crc32c) == (key, 100_003, crc32c.crc32c(src.read_bytes()))
    assert store.head(key) == info and store.exists(key)
    dest = tmp_path / "cache" / "payload"
    dest.parent.mkdir()
    assert store.fetch(key, dest, size=info.size, crc=info.crc32c) == info
    assert dest.read_bytes() == src.read_bytes()
    assert leftovers(dest.parent) == []


def test_a_put_onto_an_existing_key_is_refused_and_changes_nothing(store: ObjectStore, s3_config: ClusterConfig,
                                                                   tmp_path: Path) -> None:
    key = s3_config.object_key("docs", "ids")
    first = store.put_file(a_file(tmp_path / "a", 4096, seed=1), key)
    with pytest.raises(ObjectExists, match=key):
        store.put_file(a_file(tmp_path / "b", 8192, seed=2), key)
    with pytest.raises(ObjectExists):
        store.put_bytes(key, b"other")
    assert store.head(key) == first
    store.fetch(key, tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == bytes([1]) * 4096


def test_large_files_move_in_parts_and_a_multipart_put_is_write_once_too(s3_config: ClusterConfig,
                                                                         tmp_path: Path) -> None:
    config = dataclasses.replace(s3_config, multipart_threshold_bytes=5 << 20, multipart_chunk_bytes=5 << 20)
    store = ObjectStore(config, session=credentials())
    src = a_file(tmp_path / "big", (11 << 20) + 17)
    key = config.object_key("docs", "big")
    info = store.put_file(src, key)
    assert info.etag.strip('"').endswith("-3"), info.etag  # three parts: it really was a multipart upload
    with pytest.raises(ObjectExists):
        store.put_file(a_file(tmp_path / "big2", 11 << 20, seed=3), key)  # refused at CompleteMultipartUpload
    assert store.head(key) == info
    store.fetch(key, tmp_path / "back")
    assert crc32c.crc32c((tmp_path / "back").read_bytes()) == info.crc32c


def test_racing_puts_of_one_key_have_exactly_one_winner(store: ObjectStore, s3_config: ClusterConfig) -> None:
    key = s3_config.object_key("race")
    outcomes: dict[int, str] = {}
    start = threading.Barrier(6)

    def put(i: int) -> None:
        start.wait(timeout=10)
        try:
            store.put_bytes(key, f"writer {i}".encode())
            outcomes[i] = "won"
        except ObjectExists:
            outcomes[i] = "refused"

    threads = [threading.Thread(target=put, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    winners = [i for i, o in outcomes.items() if o == "won"]
    assert len(outcomes) == 6 and len(winners) == 1, outcomes
    assert store._s3.get_object(Bucket=store.bucket, Key=key)["Body"].read() == f"writer {winners[0]}".encode()


def overwrite(weed: WeedServer, store: ObjectStore, key: str, body: bytes, metadata: dict[str, str]) -> None:
    """Replace an object behind the store's back (plain boto3, no If-None-Match): damage."""
    client: Any = weed.s3_client()
    client.put_object(Bucket=store.bucket, Key=key, Body=body, Metadata=metadata)


def test_a_corrupt_object_is_detected_on_fetch_and_nothing_is_left_behind(
        store: ObjectStore, s3_config: ClusterConfig, weed: WeedServer, tmp_path: Path) -> None:
    key = s3_config.object_key("docs", "payload")
    info = store.put_file(a_file(tmp_path / "payload", 70_000), key)
    assert info.crc32c is not None
    # Same size and the same recorded checksum, different bytes: bit rot the metadata cannot see.
    overwrite(weed, store, key, b"\0" * 70_000, {"crc32c": f"{info.crc32c:08x}", "size": "70000"})
    dest = tmp_path / "cache" / "payload"
    dest.parent.mkdir()
    with pytest.raises(ChecksumMismatch, match=key):
        store.fetch(key, dest)
    assert not dest.exists() and leftovers(dest.parent) == []
    # A destination that already held verified bytes keeps them.
    dest.write_bytes(b"old verified copy")
    with pytest.raises(ChecksumMismatch):
        store.fetch(key, dest, size=info.size, crc=info.crc32c)
    assert dest.read_bytes() == b"old verified copy" and leftovers(dest.parent) == []


def test_an_object_that_differs_from_the_shard_map_is_refused_before_download(
        store: ObjectStore, s3_config: ClusterConfig, weed: WeedServer, tmp_path: Path) -> None:
    key = s3_config.object_key("docs", "ids")
    info = store.put_file(a_file(tmp_path / "ids", 5000), key)
    assert info.crc32c is not None
    with pytest.raises(ChecksumMismatch, match="expected"):
        store.fetch(key, tmp_path / "a", crc=info.crc32c ^ 1)
    with pytest.raises(ChecksumMismatch):
        store.fetch(key, tmp_path / "b", size=info.size + 1)
    # Replaced without metadata: only the caller's expectation can judge it, and does.
    other = s3_config.object_key("docs", "replaced")
    overwrite(weed, store, other, b"x" * 5000, {})
    with pytest.raises(ChecksumMismatch, match="none"):
        store.fetch(other, tmp_path / "c")  # no checksum anywhere: refused, never trusted blindly
    with pytest.raises(ChecksumMismatch):
        store.fetch(other, tmp_path / "d", size=5000, crc=info.crc32c)
    assert leftovers(tmp_path) == [] and not any((tmp_path / n).exists() for n in "abcd")


def test_missing_objects_listing_and_deleting(store: ObjectStore, s3_config: ClusterConfig, tmp_path: Path) -> None:
    missing = s3_config.object_key("nope")
    assert store.head(missing) is None and not store.exists(missing)
    with pytest.raises(ObjectMissing, match=missing):
        store.fetch(missing, tmp_path / "x")
    keys = [s3_config.object_key("list", f"{i:03d}") for i in range(5)]
    for i, key in enumerate(keys):
        store.put_bytes(key, bytes(i + 1))
    listed = store.list(s3_config.object_key("list", ""))
    assert [o.key for o in listed] == keys and [o.size for o in listed] == [1, 2, 3, 4, 5]
    store.delete(keys[0])
    store.delete(keys[0])  # deleting what is gone is fine
    assert [o.key for o in store.list(s3_config.object_key("list", ""))] == keys[1:]


def test_credentials_come_from_the_standard_chain(s3_config: ClusterConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.setenv(name, "/nonexistent")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", S3_ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", S3_SECRET_KEY)
    key = s3_config.object_key("from-env")
    assert ObjectStore(s3_config).put_bytes(key, b"ok").size == 2
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    with pytest.raises(ObjectStoreDenied, match=key) as e:
        ObjectStore(s3_config).head(key)
    assert e.value.__cause__ is not None
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ObjectStoreDenied, match="credentials"):
        ObjectStore(s3_config).head(key)


def test_an_unreachable_endpoint_is_a_clear_retryable_error(s3_config: ClusterConfig) -> None:
    (port,) = free_ports(1)
    config = dataclasses.replace(s3_config, s3_endpoint=f"http://127.0.0.1:{port}", s3_max_attempts=1,
                                 s3_connect_timeout_s=1)
    key = config.object_key("k")
    with pytest.raises(ObjectStoreUnavailable, match=f"s3://{config.bucket}/{key}") as e:
        ObjectStore(config, session=credentials()).put_bytes(key, b"x")
    assert isinstance(e.value, ClusterError) and e.value.__cause__ is not None
