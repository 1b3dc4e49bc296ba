"""``shardmgr verify --cluster`` against real etcd and SeaweedFS: shards
published directly (Election, ShardMap, ObjectStore, as the uploader does),
then damaged the ways an operator meets: an object deleted, overwritten with
other bytes, of another size; an entry that does not decode; orphans; the
objects a delete log's or an index's key names. Each finding names the key
or the object, and the exit status follows docs/verify.md."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from click.testing import CliRunner

from common.journal.check import Problem, Severity
from shardmgr.cli import main
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.catalog import Catalog, CollectionMeta
from shardmgr.cluster.state.election import Election, Writer
from shardmgr.cluster.state.extras import DeletesEntry, IndexEntry, ShardExtras
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.cluster.state.shard_map import ShardEntry, ShardMap, ShardObject
from shardmgr.store.rows import HEADER_SIZE
from shardmgr.verification.cluster_checks import verify_cluster
from shardmgr.verification.runner import Report
from tests.cluster_servers import S3_ACCESS_KEY, S3_SECRET_KEY, WeedServer

DIM = 4
CREDENTIALS = {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
               "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}


class Cluster:
    """One test's cluster: a collection ``docs`` of DIM dimensions, its writer, and helpers to publish."""

    def __init__(self, config: ClusterConfig, weed: WeedServer, tmp_path: Path) -> None:
        self.config = config
        self.raw = weed.s3_client()
        self.store = ObjectStore(config, session=boto3.session.Session(
            aws_access_key_id=S3_ACCESS_KEY, aws_secret_access_key=S3_SECRET_KEY))
        self.kv = Kv(config)
        self.lease = NodeLease(config, name="w").start()
        self.election = Election(config, "docs")
        self.shards = ShardMap(config, "docs")
        self.tmp = tmp_path
        Catalog(config).publish(CollectionMeta(name="docs", dim=DIM, metric="l2", index="flat"))
        self.token = self.campaign()

    def campaign(self) -> Writer:
        token = self.election.campaign("w", self.lease, timeout_s=2)
        assert token is not None
        return token

    def publish(self, shard_id: int, rows: int = 10, *, objects: dict[str, bytes] | None = None) -> ShardEntry:
        """Upload a shard's files (row files of ``rows`` rows) and publish its entry."""
        files = objects if objects is not None else {
            "vectors": os.urandom(HEADER_SIZE + rows * DIM * 4), "ids": os.urandom(HEADER_SIZE + rows * 8),
            "journal": os.urandom(5000)}
        named = []
        for name, data in files.items():
            path = self.tmp / f"{shard_id}-{name}"
            path.write_bytes(data)
            info = self.store.put_file(path, self.shards.object_key(shard_id, self.token, name))
            assert info.crc32c is not None
            named.append(ShardObject(name, info.key, info.size, info.crc32c))
        entry = ShardEntry("docs", shard_id, rows, tuple(named))
        self.shards.publish(self.token, entry)
        return entry

    def replace(self, key: str, data: bytes, metadata: dict[str, str] | None = None) -> None:
        """Put other bytes at ``key`` behind the service's back (no If-None-Match), keeping its metadata
        unless told otherwise."""
        kept = self.raw.head_object(Bucket=self.config.bucket, Key=key)["Metadata"]
        self.raw.delete_object(Bucket=self.config.bucket, Key=key)
        self.raw.put_object(Bucket=self.config.bucket, Key=key, Body=data,
                            Metadata=kept if metadata is None else metadata)

    def verify(self, *, deep: bool = False, orphan_grace_s: float = 3600.0) -> Report:
        return verify_cluster(self.config, deep=deep, orphan_grace_s=orphan_grace_s, store=self.store)

    def where(self, key: str) -> str:
        return f"etcd://{self.config.etcd_host}:{self.config.etcd_port}{key}"

    def close(self) -> None:
        self.lease.close()
        self.kv.close()
        self.store.close()


@pytest.fixture
def cluster(cluster_config: ClusterConfig, weed: WeedServer, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(cluster_config, weed, tmp_path)
    try:
        yield c
    finally:
        c.close()


def found(report: Report) -> list[tuple[str, str, Severity]]:
    return sorted((p.what, p.path, p.severity) for p in report.problems)


def only(report: Report, what: str) -> Problem:
    [problem] = [p for p in report.problems if p.what == what]
    return problem


def test_a_clean_cluster_passes_both_runs(cluster: Cluster) -> None:
    entries = [cluster.publish(1), cluster.publish(2, rows=3)]
    report = cluster.verify()
    assert (report.problems, report.exit_code, report.files) == ([], 0, 6)
    deep = cluster.verify(deep=True)
    assert (deep.problems, deep.exit_code) == ([], 0)
    assert deep.bytes_read == sum(o.size for e in entries for o in e.objects)


def test_a_deleted_object_is_missing_and_named(cluster: Cluster) -> None:
    entry = cluster.publish(1)
    gone = entry.objects[1].key
    cluster.raw.delete_object(Bucket=cluster.config.bucket, Key=gone)
    report = cluster.verify()
    problem = only(report, "missing_object")
    assert problem.path == f"s3://{cluster.config.bucket}/{gone}" and problem.severity == Severity.CORRUPT
    assert cluster.shards.key(1) in problem.expected  # the entry that names it
    assert report.exit_code == 2


def test_bytes_overwritten_under_the_same_metadata_are_caught_by_deep_only(cluster: Cluster) -> None:
    entry = cluster.publish(1)
    vectors = entry.objects[0]
    cluster.replace(vectors.key, os.urandom(vectors.size))  # same size, same metadata, other bytes
    assert cluster.verify().exit_code == 0  # HEAD cannot tell
    deep = cluster.verify(deep=True)
    problem = only(deep, "object_checksum")
    assert problem.path == cluster.store.url(vectors.key) and f"{vectors.crc32c:08x}" in problem.expected
    assert deep.exit_code == 2


def test_bytes_overwritten_with_their_own_metadata_are_caught_by_head(cluster: Cluster) -> None:
    entry = cluster.publish(1)
    ids = entry.objects[1]
    cluster.replace(ids.key, os.urandom(ids.size), {"crc32c": "0badf00d", "size": str(ids.size)})
    problem = only(cluster.verify(), "object_checksum")
    assert problem.path == cluster.store.url(ids.key) and "0badf00d" in problem.found


def test_an_object_of_another_size(cluster: Cluster) -> None:
    entry = cluster.publish(1)
    journal = entry.objects[2]
    cluster.replace(journal.key, os.urandom(journal.size - 100))
    report = cluster.verify()
    problem = only(report, "object_size")
    assert problem.path == cluster.store.url(journal.key)
    assert (problem.expected.split()[0], problem.found) == (str(journal.size), f"{journal.size - 100} bytes")
    assert report.exit_code == 2


def test_an_undecodable_entry_and_a_malformed_key_are_named(cluster: Cluster) -> None:
    cluster.publish(1)
    cluster.kv.put(cluster.shards.key(2), b'{"collection": "docs", "shard_id": 2')
    stray = cluster.config.key("shards", "docs", "7")
    cluster.kv.put(stray, cluster.shards.get(1).encode())  # type: ignore[union-attr]
    report = cluster.verify()
    assert [(p.what, p.path, p.severity) for p in report.problems] == [  # in key order
        ("entry", cluster.where(cluster.shards.key(2)), Severity.CORRUPT),
        ("entry", cluster.where(stray), Severity.CORRUPT)]
    assert "undecodable" in report.problems[0].found and report.exit_code == 2


def test_an_entry_must_agree_with_its_rows_and_the_catalog(cluster: Cluster) -> None:
    cluster.publish(1, rows=10, objects={"vectors": os.urandom(HEADER_SIZE + 11 * DIM * 4),
                                         "ids": os.urandom(HEADER_SIZE + 10 * 8), "journal": b"j"})
    report = cluster.verify()
    problem = only(report, "rows_size")
    assert problem.path == cluster.where(cluster.shards.key(1)) and problem.expected.startswith("vectors:")
    stranger = ShardMap(cluster.config, "ghost")
    token = Election(cluster.config, "ghost").campaign("w", cluster.lease, timeout_s=2)
    assert token is not None
    stranger.publish(token, ShardEntry("ghost", 1, 0, ()))
    report = cluster.verify()
    assert {(p.what, p.path) for p in report.problems} >= {
        ("unknown_collection", cluster.where(stranger.key(1))), ("entry", cluster.where(stranger.key(1)))}


def test_orphans_are_reported_with_their_age(cluster: Cluster) -> None:
    cluster.publish(1)
    old = cluster.store.put_bytes(cluster.shards.object_key(2, cluster.token, "vectors"), b"never published").key
    assert cluster.election.resign(cluster.token)
    cluster.token = cluster.campaign()
    mine = cluster.store.put_bytes(cluster.shards.object_key(3, cluster.token, "vectors"), b"not yet published").key
    young = cluster.verify()  # within the grace period: notes only
    assert found(young) == sorted([("orphan", cluster.store.url(old), Severity.NOTE),
                                   ("orphan", cluster.store.url(mine), Severity.NOTE)])
    assert young.exit_code == 0 and all(" s old" in p.found for p in young.problems)
    late = cluster.verify(orphan_grace_s=0.0)  # the sweep should have removed the old tenure's
    assert found(late) == sorted([("orphan", cluster.store.url(old), Severity.REPAIRABLE),
                                  ("orphan", cluster.store.url(mine), Severity.NOTE)])
    assert late.exit_code == 1


def test_objects_named_by_deletes_and_indexes_keys_are_checked_not_orphans(cluster: Cluster) -> None:
    cluster.publish(1)
    extras = ShardExtras(cluster.config, cluster.kv)
    deletes = cluster.store.put_bytes(cluster.shards.object_key(1, cluster.token, "deletes.3"), b"deleted rows")
    index = cluster.store.put_bytes(cluster.shards.object_key(1, cluster.token, "index.faiss"), b"an index")
    assert deletes.crc32c is not None and index.crc32c is not None
    extras.publish_deletes(cluster.token, DeletesEntry("docs", 1, ShardObject("deletes", deletes.key, deletes.size,
                                                                              deletes.crc32c), 3))
    extras.publish_index(cluster.token, IndexEntry("docs", 1, (ShardObject("index.faiss", index.key, index.size,
                                                                           index.crc32c),)))
    report = cluster.verify(orphan_grace_s=0.0)
    assert (report.problems, report.files) == ([], 5)
    cluster.raw.delete_object(Bucket=cluster.config.bucket, Key=deletes.key)
    unpublished = extras.key("indexes", "docs", 2)  # an index of a shard the map does not hold
    cluster.kv.put(unpublished, cluster.kv.get(extras.key("indexes", "docs", 1)).value)  # type: ignore[union-attr]
    garbled = extras.key("deletes", "docs", 3)
    cluster.kv.put(garbled, b"[1, 2]")
    report = cluster.verify()
    assert found(report) == sorted([
        ("missing_object", cluster.store.url(deletes.key), Severity.CORRUPT),
        ("entry", cluster.where(unpublished), Severity.CORRUPT), ("entry", cluster.where(garbled), Severity.CORRUPT)])
    assert extras.key("deletes", "docs", 1) in only(report, "missing_object").expected


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["verify", *args], env=CREDENTIALS)
    return result.exit_code, result.output


def test_the_command_line(cluster: Cluster, tmp_path: Path) -> None:
    urls = ["--cluster", cluster.config.etcd_url, "--object-store", cluster.config.s3_url,
            "--s3-endpoint", str(cluster.config.s3_endpoint)]
    entry = cluster.publish(1)
    code, output = run(*urls, "--json")
    report = json.loads(output)
    assert (code, report["exit_code"], report["problems"], report["files"]) == (0, 0, [], 3)
    assert report["cluster"] == f"{cluster.config.etcd_url} {cluster.config.s3_url}"
    cluster.raw.delete_object(Bucket=cluster.config.bucket, Key=entry.objects[0].key)
    code, output = run(*urls, "--deep", "--json")
    report = json.loads(output)
    assert code == 2 and [(p["what"], p["path"], p["severity"]) for p in report["problems"]] == [
        ("missing_object", cluster.store.url(entry.objects[0].key), "corrupt")]
    code, output = run(*urls)  # piped: one tab-separated line per finding, then the verdict
    assert code == 2 and output.splitlines()[0].split("\t")[:4] == [
        "corrupt", cluster.store.url(entry.objects[0].key), "-", "missing_object"]
    empty = tmp_path / "data"
    empty.mkdir()
    code, output = run(str(empty), *urls, "--json")  # a clean data directory and a damaged cluster: the worse
    assert code == 2 and json.loads(output)["data_dir"] == str(empty)


@pytest.mark.parametrize("args, says", [
    ([], "give a DATA_DIR"),
    (["--cluster", "etcd://127.0.0.1:1/p"], "--object-store"),
    (["--cluster", "etcd://127.0.0.1:1/p", "--object-store", "s3://b/p"], "bucket"),
    (["--cluster", "etcd://127.0.0.1:1/p", "--object-store", "s3://bucket/p", "--repair"], "write-once"),
])
def test_the_command_line_refuses_what_it_cannot_run(args: list[str], says: str) -> None:
    code, output = run(*args)
    assert code == 3 and says in output


def test_an_unreachable_cluster_cannot_be_verified(cluster_config: ClusterConfig) -> None:
    code, output = run("--cluster", "etcd://127.0.0.1:1/p", "--object-store", cluster_config.s3_url,
                       "--s3-endpoint", str(cluster_config.s3_endpoint))
    assert code == 3 and "cannot read the cluster" in output


def test_the_command_lines_orphan_grace(cluster: Cluster) -> None:
    urls = ["--cluster", cluster.config.etcd_url, "--object-store", cluster.config.s3_url,
            "--s3-endpoint", str(cluster.config.s3_endpoint)]
    cluster.publish(1)
    stray = cluster.store.put_bytes(cluster.config.object_key("docs", "shards", "stray"), b"?").key
    code, output = run(*urls, "--json")
    assert code == 0 and [p["severity"] for p in json.loads(output)["problems"]] == ["note"]
    code, output = run(*urls, "--orphan-grace", "0")
    assert code == 1 and output.splitlines()[0].split("\t")[:4] == [
        "repairable", cluster.store.url(stray), "-", "orphan"]
