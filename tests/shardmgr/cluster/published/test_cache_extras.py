"""A query node's cache follows a published shard's later deletes and takes
the writer's index (shardmgr/cluster/published/cache.py): the cached copy gets the
writer's index files byte for byte (so it searches what the writer's
searches), then each newer delete log, and searches through it stop
returning the deleted rows; unchanged files are linked, not fetched again."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np

from common.wire.client import RpcClient
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.published.mirror import ClusterMirror
from shardmgr.cluster.published.placement import owners
from shardmgr.cluster.state.extras import ShardExtras
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.objects import file_crc32c
from shardmgr.store.client import StoreClient
from tests.shardmgr.cluster.nodes import DIM, batches, node, search, start_all, wait_for
from tests.shardmgr.server.serverproc import ServerProcess


def cached(proc: ServerProcess, collection: str, shard_id: int, name: str) -> Path:
    return proc.data_dir / "cluster-cache" / "shards" / collection / f"{shard_id:08d}" / name


def test_the_cache_takes_the_writers_index_and_each_newer_delete_log(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    name = next(c for c in (f"h{i}" for i in range(100)) if owners(["n1", "n2"], c, 1) == ["n2"])  # n2 caches 1
    n1, n2 = node(tmp_path, "n1", cluster_config), node(tmp_path, "n2", cluster_config)
    start_all(started, [n1, n2])
    extras = ShardExtras(cluster_config)
    data = list(batches(3, seed=21))
    with StoreClient(n1.address) as client:
        client.create_collection(name, dim=DIM, index="hnsw")
        refs = [client.append(name, vectors, ids, durable=True) for vectors, ids in data]  # shard 1 sealed
        index = wait_for("shard 1's index published", lambda: extras.indexes(name).get(1), timeout=20)
        for obj in index.files:
            wait_for(f"n2's cached {obj.name} is the writer's", lambda o=obj: cached(n2, name, 1, o.name).exists()
                     and file_crc32c(cached(n2, name, 1, o.name)) == (o.crc32c, o.size), timeout=20)
        vectors_file = cached(n2, name, 1, "vectors")
        inode = vectors_file.stat().st_ino

        assert client.delete(name, refs[0][:3], durable=True) == 3
        entry = wait_for("the deletes key", lambda: (lambda d: d if d is not None and d.deleted == 3 else None)(
            extras.deletes(name).get(1)), timeout=20)
        wait_for("n2's cached delete log is the published one", lambda: cached(n2, name, 1, "deletes").exists()
                 and file_crc32c(cached(n2, name, 1, "deletes")) == (entry.object.crc32c, entry.object.size),
                 timeout=20)
    assert vectors_file.stat().st_ino == inode  # linked into the new copy, not fetched again
    found = search(n2.address, data[0][0][:3], collection=name, k=2)
    assert not found.partial and not np.isin(found.refs, refs[0][:3]).any()
    with RpcClient(n2.address) as rpc:
        stats = rpc.call("stats").result["cluster"]
    assert stats["shards_fetched_total"] == 1, stats

    n2.signal(signal.SIGTERM)  # a restart keeps the cache: nothing is fetched again
    n2.wait()
    n2.restart()
    wait_for("n2 announces shard 1 again", lambda: 1 in ClusterMirror(cluster_config, Kv(cluster_config)).read(
        ).ready("n2", name), timeout=20)
    with RpcClient(n2.address) as rpc:
        assert rpc.call("stats").result["cluster"]["bytes_fetched_total"] == 0
