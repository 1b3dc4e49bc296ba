"""A node's query side (shardmgr/cluster/query/query.py) on a real etcd, with this
test playing the rest of the cluster through its keys: a count that asks the
collection's writer for its report while that writer publishes a shard counts
the shard once (before, a shard published between the count's read of the
shard map and the report was counted nowhere); a read naming a revision waits
for the node's watch to reach it; a shard its writer has just published,
before any node's serving key lists it, is searched on the writer (before,
such a search in that window of a few milliseconds was partial: the cluster
quick start once printed other rows than the nearest ones).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.errors import WatchBehind
from shardmgr.cluster.published.mirror import holder_value
from shardmgr.cluster.query import query
from shardmgr.cluster.query.query import QueryRouter
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.cluster.state.report import NodeReport
from shardmgr.cluster.state.shard_map import ShardEntry, ShardObject
from shardmgr.store.config import StoreConfig
from shardmgr.store.store import Store


def shard_key(config: ClusterConfig, shard_id: int) -> str:
    return config.key("shards", "c", f"{shard_id:020d}")


def entry(shard_id: int, rows: int) -> bytes:
    return ShardEntry("c", shard_id, rows, (ShardObject("vectors", f"k/{shard_id}", 1, 0),), writer="me",
                      writer_revision=1, deleted=0).encode()


@pytest.fixture
def router(cluster_config: ClusterConfig, tmp_path: Path) -> Iterator[QueryRouter]:
    """The query side of node "me", the writer of collection "c" (a holder that is not clean), with shard
    1 published (100 rows); only its watched state runs (no cache, no peers asked)."""
    kv = Kv(cluster_config)
    kv.put(cluster_config.key("members", "me"), json.dumps({"node": "me", "address": "127.0.0.1:1"}).encode())
    kv.put(cluster_config.key("holders", "c", "me"), holder_value("me", clean=False))
    kv.put(shard_key(cluster_config, 1), entry(1, 100))
    with Store(tmp_path / "me").open() as store:
        store.create_collection("c", dim=2)
        found = QueryRouter(cluster_config, NodeConfig(), "me", store, ObjectStore(cluster_config),
                            lambda: pytest.fail("no lease is needed"))
        found.mirror.start()
        try:
            yield found
        finally:
            found.mirror.stop()
            found.fanout.close()
            found.peers.close()
            kv.close()


def test_a_shard_published_while_the_count_asks_its_writer_for_a_report_is_counted_once(
        router: QueryRouter, cluster_config: ClusterConfig) -> None:
    kv = Kv(cluster_config)

    def report_now() -> NodeReport:
        """The writer's report, built just after it published shard 2 (50 rows): so it lists only its
        growing shard 3 (10 rows), and says at which revision; this node's watch has not seen that yet."""
        revision = kv.put(shard_key(cluster_config, 2), entry(2, 50))
        return NodeReport.from_json("me", {"node": "me", "address": "127.0.0.1:1", "at": time.time(),
                                           "revision": revision, "uploads_failed_total": 0, "failing": [],
                                           "collections": {"c": {"unpublished": {"3": [10, 0, False]},
                                                                 "deleted_here": {}}}})

    router.report_here = report_now
    try:
        info = router.info("c")
    finally:
        kv.close()
    assert info["cluster"]["published"] == {"shards": 2, "rows": 150, "deleted": 0}, info
    assert (info["rows"], info["shards"], info["growing"], info["cluster"]["unpublished"]["rows"]) == (160, 3, 1, 10)
    assert not info["partial"], info["missing"]


def test_a_read_naming_a_revision_waits_for_the_watch_to_reach_it(
        router: QueryRouter, cluster_config: ClusterConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    kv = Kv(cluster_config)
    try:
        revision = kv.put(shard_key(cluster_config, 2), entry(2, 50))
    finally:
        kv.close()
    monkeypatch.setattr(query, "AFTER_WAIT_S", 0.2)  # (a revision never reached: no need to wait long)
    queries = np.zeros((1, 2), np.float32)
    # (the node serves no shard: the answer is partial, but planned with shard 2 in it)
    found, fields = router.search("c", queries, 1, None, after=revision)
    assert "shard 2 (no live node serves it now)" in found.missing
    assert fields["state_revision"] >= revision and "held_deletes" not in fields
    with pytest.raises(WatchBehind, match=f"has not seen the cluster state of revision {revision + 1000}"):
        router.search("c", queries, 1, None, after=revision + 1000)


def test_a_shard_just_published_is_searched_on_its_writer_until_a_node_serves_it(
        cluster_config: ClusterConfig, tmp_path: Path) -> None:
    """Node "me" wrote 600 rows: shard 1 sealed (512 rows) and published under its name, shard 2 growing.
    No serving key lists shard 1 yet, as between the publish and the writer's next cache pass."""
    kv = Kv(cluster_config)
    vectors = np.random.default_rng(0).random((600, 2), dtype=np.float32)
    with Store(tmp_path / "me", StoreConfig(seal_bytes=4096)).open() as store:
        store.create_collection("c", dim=2)
        for start in range(0, 600, 100):
            store.append("c", vectors[start:start + 100], np.arange(start, start + 100))
        assert store.collection_info("c")["sealed"] == 1
        kv.put(cluster_config.key("members", "me"), json.dumps({"node": "me", "address": "127.0.0.1:1"}).encode())
        kv.put(cluster_config.key("holders", "c", "me"), holder_value("me", clean=False))
        revision = kv.put(shard_key(cluster_config, 1), entry(1, 512))
        router = QueryRouter(cluster_config, NodeConfig(), "me", store, ObjectStore(cluster_config),
                             lambda: pytest.fail("no lease is needed"))
        router.mirror.start()
        try:
            found, _ = router.search("c", vectors[:3], 2, None, after=revision)
            assert not found.partial, found.missing
            assert found.ids[:, 0].tolist() == [0, 1, 2]
            assert router.fanout.plan("c").served_by == {1: "me"}
        finally:
            router.mirror.stop()
            router.fanout.close()
            router.peers.close()
            kv.close()
