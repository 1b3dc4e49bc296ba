"""ShardTaker's wait for the watched state (taker.py): a delete on a new
writer must know every shard published before its tenure began."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import ShardsUnavailable
from shardmgr.cluster.published.cache import ShardCache
from shardmgr.cluster.published.deletes_merger import DeletesMerger
from shardmgr.cluster.published.mirror import ClusterMirror
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.writer.taker import ShardTaker
from shardmgr.store.store import Store
from tests.shardmgr.cluster.nodes import DIM, bucket


def test_a_take_waits_for_the_watched_state_to_reach_the_writers_tenure(
        cluster_config: ClusterConfig, tmp_path: Path) -> None:
    store = Store(tmp_path / "data").open()
    try:
        store.create_collection("c", DIM)
        objects = bucket(cluster_config)
        mirror = ClusterMirror(cluster_config, Kv(cluster_config))  # never started: at revision 0
        taker = ShardTaker(store, objects, mirror, cast(ShardCache, None), DeletesMerger("n1", store, objects))
        with pytest.raises(ShardsUnavailable, match=r"has not reached its own writer tenure \(revision 5\)"):
            taker.take("c", None, 5, timeout=0.05)
        revision = mirror.read().revision  # etcd's revision now
        taker.take("c", None, revision, timeout=0.05)  # caught up; nothing is published, so nothing is taken
        assert taker.counters["shards_taken_total"] == 0
    finally:
        store.close()
