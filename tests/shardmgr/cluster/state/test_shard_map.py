"""The shard map against real etcd and SeaweedFS: a shard's files uploaded,
checked and then published under the writer's token; write-once entries;
fetching a published shard by its entry."""

from __future__ import annotations

import os
from pathlib import Path

import boto3
import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import NotWriter, ShardConflict
from shardmgr.cluster.state.election import Election
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.cluster.state.shard_map import ShardEntry, ShardMap, ShardObject
from tests.cluster_servers import S3_ACCESS_KEY, S3_SECRET_KEY


def test_upload_check_publish_then_fetch_by_the_entry(cluster_config: ClusterConfig, tmp_path: Path) -> None:
    store = ObjectStore(cluster_config, session=boto3.session.Session(
        aws_access_key_id=S3_ACCESS_KEY, aws_secret_access_key=S3_SECRET_KEY))
    lease = NodeLease(cluster_config, name="w").start()
    try:
        token = Election(cluster_config, "docs").campaign("writer", lease, timeout_s=2)
        assert token is not None
        shards = ShardMap(cluster_config, "docs")
        files = {"payload": os.urandom(64 * 1024), "ids": os.urandom(8 * 1024)}
        objects = []
        for name, data in files.items():
            (tmp_path / name).write_bytes(data)
            key = shards.object_key(7, token, name)
            assert f"/{token.revision}/" in key  # the tenure is in the path: no clash with a predecessor's orphans
            info = store.put_file(tmp_path / name, key)
            assert info.crc32c is not None
            objects.append(ShardObject(name=name, key=key, size=info.size, crc32c=info.crc32c))
        published = ShardEntry(collection="docs", shard_id=7, rows=1024, objects=tuple(objects))
        revision = shards.publish(token, published)
        assert shards.publish(token, published) == revision  # a retried publish is a no-op, not an error
        with pytest.raises(ShardConflict):
            shards.publish(token, ShardEntry(collection="docs", shard_id=7, rows=1, objects=()))
        # A reader (another node) finds the shard and fetches it, verified against the map.
        found, _ = ShardMap(cluster_config, "docs").read()
        assert list(found) == [7] and found[7].rows == 1024 and found[7].writer == "writer"
        assert found[7] == shards.get(7) and shards.get(8) is None
        for obj in found[7].objects:
            store.fetch(obj.key, tmp_path / f"cached-{obj.name}", size=obj.size, crc=obj.crc32c)
            assert (tmp_path / f"cached-{obj.name}").read_bytes() == files[obj.name]
    finally:
        lease.close()


def test_entries_survive_their_encoding() -> None:
    e = ShardEntry(collection="c", shard_id=3, rows=5, writer="n", writer_revision=9,
                   objects=(ShardObject("payload", "p/k", 80, 0xFFFFFFFF), ShardObject("ids", "p/i", 40, 0)))
    assert ShardEntry.decode(e.encode()) == e


def test_shard_ids_are_reserved_in_disjoint_blocks_by_the_current_writer_only(etcd_config: ClusterConfig) -> None:
    first_lease, second_lease = NodeLease(etcd_config, name="a").start(), NodeLease(etcd_config, name="b").start()
    try:
        election, shards = Election(etcd_config, "docs"), ShardMap(etcd_config, "docs")
        a = election.campaign("a", first_lease, timeout_s=2)
        assert a is not None
        assert shards.reserve_ids(a, 1, 4) == (1, 5)
        assert shards.reserve_ids(a, 1, 4) == (5, 9)  # the next block follows on
        assert shards.reserve_ids(a, 20, 4) == (20, 24)  # local shards already up to 19: start above them
        assert election.resign(a)
        with pytest.raises(NotWriter):  # an ended tenure reserves nothing
            shards.reserve_ids(a, 1, 4)
        b = election.campaign("b", second_lease, timeout_s=2)
        assert b is not None
        assert shards.reserve_ids(b, 1, 4) == (24, 28)  # never an id a reserved: its unpublished shards keep theirs
    finally:
        first_lease.close()
        second_lease.close()
