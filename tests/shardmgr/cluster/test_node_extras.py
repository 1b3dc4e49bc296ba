"""``shardmgr serve --cluster``: a writer publishes the deletes and the index
of its published shards (extras_uploader.py), with a real server process on
the session's etcd and SeaweedFS.

An hnsw collection's shard is published, then its index files (the bytes on
the writer's disk) under a key created after the shard's. Deletes on the
published shard go up as durable copies of its delete log, under a deletes
key whose count grows; a shard deleted from before its first publish carries
its delete log in its entry, and gets no deletes key for it.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np

from common.journal import Journal
from common.wire.client import RpcClient
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.extras import DeletesEntry, ShardExtras
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.objects import ObjectStore, file_crc32c
from shardmgr.cluster.state.shard_map import ShardMap, ShardObject
from shardmgr.store.client import StoreClient
from shardmgr.store.deletes import DeleteLog
from tests.shardmgr.cluster.nodes import DIM, ROWS, batches, bucket, node, published, wait_for
from tests.shardmgr.server.serverproc import ServerProcess


def deleted_rows(objects: ObjectStore, obj: ShardObject, where: Path) -> list[int]:
    """The rows the delete log at ``obj`` deletes, fetched (checked) and read as a query node would."""
    where.mkdir()
    objects.fetch(obj.key, where / "deletes", size=obj.size, crc=obj.crc32c)
    with Journal.open(where / "deletes", writable=False) as journal:
        meta = msgpack.unpackb(journal.metadata)
    return np.flatnonzero(DeleteLog.open(where, meta["shard"], meta["uuid"], 2 * ROWS, None).mask).tolist()


def with_rows(extras: ShardExtras, shard_id: int, deleted: int) -> DeletesEntry | None:
    found = extras.deletes("h").get(shard_id)
    return found if found is not None and found.deleted == deleted else None


def test_a_writer_publishes_the_index_and_the_later_deletes_of_its_published_shards(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    n1 = node(tmp_path, "n1", cluster_config)
    started.append(n1.start())
    extras, objects = ShardExtras(cluster_config), bucket(cluster_config)
    with StoreClient(n1.address) as client:
        client.create_collection("h", dim=DIM, index="hnsw")
        data = list(batches(3))
        refs = [client.append("h", vectors, ids, durable=True) for vectors, ids in data]  # shard 1 sealed
        assert client.delete("h", refs[2][:1], durable=True) == 1  # shard 2, growing: its log goes up with it

        index = wait_for("shard 1's index published", lambda: extras.indexes("h").get(1))
        assert [o.name for o in index.files] == ["index.faiss", "index.meta"] and index.node == "n1"
        kv = Kv(cluster_config)
        shard_key, index_key = kv.get(ShardMap(cluster_config, "h").key(1)), kv.get(extras.key("indexes", "h", 1))
        assert shard_key is not None and index_key is not None
        assert shard_key.create_revision < index_key.create_revision  # the index goes up after the shard
        for obj in index.files:
            local = n1.data_dir / "shards" / "h" / "00000001" / obj.name
            assert file_crc32c(local) == (obj.crc32c, obj.size)
            objects.fetch(obj.key, tmp_path / obj.name, size=obj.size, crc=obj.crc32c)
            assert (tmp_path / obj.name).read_bytes() == local.read_bytes()
        assert 1 not in extras.deletes("h")

        assert client.delete("h", refs[0][:2], durable=True) == 2  # the published shard 1
        two = wait_for("2 deleted rows of shard 1 published", lambda: with_rows(extras, 1, 2))
        assert two.object.key.endswith(f"/{two.writer_revision}/deletes.2") and two.node == "n1"
        assert deleted_rows(objects, two.object, tmp_path / "two") == [0, 1]
        assert client.delete("h", np.concatenate([refs[0][1:3], refs[1][:3]]), durable=True) == 4
        six = wait_for("6 deleted rows of shard 1 published", lambda: with_rows(extras, 1, 6))
        assert six.object.key.endswith("/deletes.6") and objects.exists(two.object.key)  # replaced, not removed
        assert deleted_rows(objects, six.object, tmp_path / "six") == [0, 1, 2, ROWS, ROWS + 1, ROWS + 2]
        _, _, found = client.search("h", np.concatenate([data[0][0][:3], data[1][0][:3]]), 5)
        assert not np.isin(found, np.concatenate([refs[0][:3], refs[1][:3]])).any()  # the writer's own: at once

        for vectors, ids in batches(2, seed=700):  # shard 2 fills and seals
            client.append("h", vectors, ids, durable=True)
        wait_for("shard 2's index published", lambda: extras.indexes("h").get(2))
        entry = published(cluster_config, "h")[2]
        log_in_entry = next(o for o in entry.objects if o.name == "deletes")
        assert deleted_rows(objects, log_in_entry, tmp_path / "entry") == [0]
        assert 2 not in extras.deletes("h")  # the entry's log holds every delete: no key needed

    def counted() -> bool:  # the keys are in etcd an instant before the node's thread counts them
        with RpcClient(n1.address) as rpc:
            stats = rpc.call("stats").result["cluster"]
        return (stats["indexes_published_total"], stats["deletes_published_total"],
                stats["extras_fenced_total"]) == (2, 2, 0)

    wait_for("the node to count 2 indexes and 2 delete logs published, none fenced", counted, timeout=5)
