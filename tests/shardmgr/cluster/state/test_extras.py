"""Deletes and indexes of published shards against real etcd and SeaweedFS
(extras.py, sweep.py): fenced, forward-only deletes keys and write-once
index keys, read at one revision and watched; the sweep keeps what they
name and removes replaced delete log copies once their successor is past
the grace period; the status counts what they name as live."""

from __future__ import annotations

import json
import time

import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import CoordinationError, NotWriter
from shardmgr.cluster.operations.status import read_status
from shardmgr.cluster.state.election import Election, Writer
from shardmgr.cluster.state.extras import (
    DeletesEntry,
    ExtrasChange,
    ExtrasWatch,
    IndexEntry,
    ShardExtras,
    deletes_object,
)
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.cluster.state.shard_map import ShardEntry, ShardMap, ShardObject
from shardmgr.cluster.writer.sweep import sweep_orphans
from tests.shardmgr.cluster.nodes import bucket, objects_under, wait_for


def put(objects: ObjectStore, shards: ShardMap, shard_id: int, token: Writer, name: str,
        file: str | None = None) -> ShardObject:
    """A small object at ``token``'s path of the shard, as a ShardObject named ``file`` (default ``name``)."""
    info = objects.put_bytes(shards.object_key(shard_id, token, name), f"{name} of {token.revision}".encode())
    assert info.crc32c is not None
    return ShardObject(file or name, info.key, info.size, info.crc32c)


def deletes(objects: ObjectStore, shards: ShardMap, shard_id: int, token: Writer, rows: int) -> DeletesEntry:
    return DeletesEntry("c", shard_id, put(objects, shards, shard_id, token, f"deletes.{rows}", "deletes"), rows)


def test_deletes_move_forward_indexes_are_written_once_and_both_are_fenced_and_watched(
        cluster_config: ClusterConfig) -> None:
    objects, lease = bucket(cluster_config), NodeLease(cluster_config, name="w").start()
    changes: list[ExtrasChange] = []
    watch: ExtrasWatch | None = None
    try:
        election, shards, extras = Election(cluster_config, "c"), ShardMap(cluster_config, "c"), \
            ShardExtras(cluster_config)
        old = election.campaign("old", lease, timeout_s=2)
        assert old is not None
        first = put(objects, shards, 1, old, "deletes")  # shard 1 had one delete when it was first published
        shards.publish(old, ShardEntry("c", 1, 100, (put(objects, shards, 1, old, "vectors"), first)))
        with pytest.raises(CoordinationError, match="shard 2 of 'c' is not published"):
            extras.publish_deletes(old, deletes(objects, shards, 2, old, 1))
        start = extras.read("c")
        assert (start.deletes, start.indexes) == ({}, {})
        watch = extras.watch(changes.append, start.revision + 1)
        entry = shards.get(1)
        assert entry is not None and deletes_object(entry, None) == first  # no key: the entry's own log

        three = extras.publish_deletes(old, deletes(objects, shards, 1, old, 3))
        assert (three.deleted, three.node, three.writer_revision) == (3, "old", old.revision)
        assert extras.publish_deletes(old, deletes(objects, shards, 1, old, 2)) == three  # never backwards
        assert extras.deletes("c") == {1: three} and deletes_object(entry, three) == three.object
        index = IndexEntry("c", 1, (put(objects, shards, 1, old, "index.faiss"), put(objects, shards, 1, old,
                                                                                       "index.meta")))
        published_index = extras.publish_index(old, index)
        assert published_index.files == index.files and extras.indexes("c") == {1: published_index}
        assert extras.publish_index(old, IndexEntry("c", 1, ())) == published_index  # write-once

        assert election.resign(old)
        new = election.campaign("new", lease, timeout_s=2)
        assert new is not None
        before = extras.read("c")
        with pytest.raises(NotWriter):  # a stale token publishes nothing, however many rows it has
            extras.publish_deletes(old, deletes(objects, shards, 1, old, 9))
        with pytest.raises(NotWriter):
            extras.publish_index(old, IndexEntry("c", 2, ()))
        assert (extras.read("c").deletes, extras.read("c").indexes) == (before.deletes, before.indexes)
        five = extras.publish_deletes(new, deletes(objects, shards, 1, new, 5))  # the new tenure's copy replaces it
        assert extras.read("c").deletes == {1: five} and five.object.key.endswith(f"/{new.revision}/deletes.5")

        wait_for("three changes watched", lambda: len(changes) >= 3)
        in_order = sorted(changes, key=lambda c: c.revision)  # two streams: in order per kind, and by revision
        assert [(c.kind, c.collection, c.shard_id, c.entry) for c in in_order] == [
            ("deletes", "c", 1, three), ("indexes", "c", 1, published_index), ("deletes", "c", 1, five)]
        assert len(changes) == 3 and in_order[0].revision > start.revision
    finally:
        if watch is not None:
            watch.stop()
        lease.close()


def test_entries_survive_their_encoding() -> None:
    d = DeletesEntry("c", 7, ShardObject("deletes", "p/c/shards/7/9/deletes.4", 4200, 0xFFFFFFFF), 4, "n", 9)
    assert DeletesEntry.decode("c", 7, d.encode()) == d
    assert set(json.loads(d.encode())) == {"object", "deleted", "node", "writer_revision"}
    files = (ShardObject("index.faiss", "k/f", 10, 1), ShardObject("index.meta", "k/m", 4096, 0))
    i = IndexEntry("c", 7, files, "n", 9)
    assert IndexEntry.decode("c", 7, i.encode()) == i


def test_the_sweep_keeps_what_the_keys_name_and_removes_replaced_delete_copies_past_the_grace(
        cluster_config: ClusterConfig) -> None:
    objects, kv, lease = bucket(cluster_config), Kv(cluster_config), NodeLease(cluster_config, name="w").start()
    try:
        election, shards, extras = Election(cluster_config, "c"), ShardMap(cluster_config, "c"), \
            ShardExtras(cluster_config)
        old = election.campaign("old", lease, timeout_s=2)
        assert old is not None
        vectors = put(objects, shards, 1, old, "vectors")
        shards.publish(old, ShardEntry("c", 1, 100, (vectors,)))
        replaced = extras.publish_deletes(old, deletes(objects, shards, 1, old, 2)).object.key
        assert election.resign(old)
        new = election.campaign("new", lease, timeout_s=2)
        assert new is not None
        current = extras.publish_deletes(new, deletes(objects, shards, 1, new, 4)).object.key
        index = extras.publish_index(new, IndexEntry("c", 1, (put(objects, shards, 1, new, "index.faiss"),)))
        below = put(objects, shards, 1, new, "deletes.3").key  # this tenure's, never published, 3 <= 4: never will be
        above = put(objects, shards, 1, new, "deletes.6").key  # this tenure's, 6 > 4: it may still publish it
        own_index = put(objects, shards, 2, new, "index.faiss").key  # shard 2: no index published yet
        stray = objects.put_bytes(cluster_config.object_key("c", "shards", "junk"), b"?").key
        everything = {vectors.key, replaced, current, index.files[0].key, below, above, own_index, stray}
        assert objects_under(objects, cluster_config, "c") == everything

        assert sweep_orphans(objects, shards, new, 3600.0, kv) == 0  # all younger than the grace period
        time.sleep(2.1)  # S3 times have whole seconds
        newest = extras.publish_deletes(new, deletes(objects, shards, 1, new, 7)).object.key
        # the copy named now (deletes.7) is younger than the grace: no copy goes yet; the stray does
        assert sweep_orphans(objects, shards, new, 2.0, kv) == 1
        assert objects_under(objects, cluster_config, "c") == everything - {stray} | {newest}
        time.sleep(2.1)
        assert sweep_orphans(objects, shards, old, 0.0, kv) == 0  # not the writer: sweeps nothing
        assert sweep_orphans(objects, shards, new, 2.0, kv) == 4  # the copies of 2, 3, 4 and 6 rows (6 <= 7)
        assert objects_under(objects, cluster_config, "c") == {vectors.key, newest, index.files[0].key, own_index}
    finally:
        lease.close()
        kv.close()


def test_the_status_counts_what_the_keys_name_as_live_not_orphans(cluster_config: ClusterConfig) -> None:
    objects, lease = bucket(cluster_config), NodeLease(cluster_config, name="w").start()
    try:
        shards, extras = ShardMap(cluster_config, "c"), ShardExtras(cluster_config)
        token = Election(cluster_config, "c").campaign("w", lease, timeout_s=2)
        assert token is not None
        shards.publish(token, ShardEntry("c", 1, 100, (put(objects, shards, 1, token, "vectors"),)))
        extras.publish_deletes(token, deletes(objects, shards, 1, token, 2))
        extras.publish_index(token, IndexEntry("c", 1, (put(objects, shards, 1, token, "index.faiss"),)))
        orphan = put(objects, shards, 2, token, "vectors").key
        found = read_status(cluster_config, objects=objects, leases=False)
        assert found.objects is not None and (found.objects.objects, found.objects.orphans) == (4, (orphan,))
    finally:
        lease.close()
