"""Deletes in published shards another node wrote (taker.py,
deletes_merger.py; docs/cluster.md, "Deletes and indexes after publish").

n1 writes the collection and deletes a row, then stops cleanly (its shards
and deletes are published). n2 becomes the writer at its first delete: it
takes the shards that delete names (and, for a delete by id, every
published shard) into its own data directory, deletes there and publishes
the logs. n1 comes back holding its own copies without those deletes: it
merges them, so that what it answers from its copies skips them. With n2
killed, n1 writes again; its next delete publishes a log that holds both
nodes' deletes (a count that only the merged log has).
"""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.extras import DeletesEntry, ShardExtras
from shardmgr.store.client import StoreClient
from shardmgr.store.knn import SearchResult
from tests.shardmgr.cluster.nodes import DIM, batches, node, published, search, start_all, wait_for
from tests.shardmgr.server.serverproc import ServerProcess


def complete(address: str, vectors: np.ndarray) -> SearchResult | None:
    found = search(address, vectors, collection="d", k=1)
    return None if found.partial else found


def check_live(found: SearchResult, ids: np.ndarray, deleted: np.ndarray) -> None:
    """Each vector searched for itself: its own id if it is live, another row's if deleted."""
    hit = found.ids[:, 0]
    assert not np.isin(hit, ids[deleted]).any(), f"deleted ids returned: {sorted(set(hit) & set(ids[deleted]))}"
    np.testing.assert_array_equal(hit[~deleted], ids[~deleted])


def published_deletes(config: ClusterConfig, shard_id: int, count: int, by: str) -> DeletesEntry | None:
    found = ShardExtras(config).deletes("d").get(shard_id)
    return found if found is not None and (found.deleted, found.node) == (count, by) else None


def test_a_new_writer_deletes_in_shards_another_node_wrote_and_the_first_writer_merges_them(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    n1, n2 = nodes = [node(tmp_path, f"n{i}", cluster_config) for i in (1, 2)]
    start_all(started, nodes)
    data = list(batches(3, seed=21))  # shard 1 sealed (two batches), shard 2 growing
    vectors, ids = np.concatenate([v for v, _ in data]), np.concatenate([i for _, i in data])
    deleted = np.zeros(len(ids), dtype=bool)
    with StoreClient(n1.address) as client:
        client.create_collection("d", dim=DIM)
        refs = np.concatenate([client.append("d", v, i, durable=True) for v, i in data])
        assert client.delete("d", refs[:1], durable=True) == 1
    deleted[:1] = True
    n1.signal(signal.SIGTERM)  # a clean stop hands off: shard 2 sealed, both published (shard 1 with its log)
    assert n1.wait() == 0
    assert sorted(published(cluster_config, "d")) == [1, 2]
    check_live(wait_for("n2 serves both shards", lambda: complete(n2.address, vectors), timeout=20), ids, deleted)

    with StoreClient(n2.address) as client:  # n2 becomes the writer here, and takes shard 1 to delete in it
        assert client.delete("d", refs[1:3], durable=True) == 2
        deleted[1:3] = True
        n2.wait_log("took shard 1 of d")
        assert client.delete_ids("d", ids[[3, 120]], durable=True) == 2  # by id: every published shard taken
        deleted[[3, 120]] = True
        n2.wait_log("took shard 2 of d")
        assert client.delete("d", refs[:2], durable=True) == 0  # deleted already, by n1 and by n2
    check_live(search(n2.address, vectors, collection="d", k=1), ids, deleted)
    wait_for("n2's deletes published", lambda: published_deletes(cluster_config, 1, 4, "n2")
             and published_deletes(cluster_config, 2, 1, "n2"))

    n1.start()  # its own copies of shards 1 and 2 lack n2's deletes
    n1.wait_log("merged 3 rows deleted by n2 into shard 1 of d")
    n1.wait_log("merged 1 rows deleted by n2 into shard 2 of d")
    n2.kill()  # n1 now answers every shard from its own, merged copies
    check_live(wait_for("complete results from n1 alone", lambda: complete(n1.address, vectors), timeout=20),
               ids, deleted)
    with StoreClient(n1.address) as client:  # n1 writes again once n2's lease is gone
        assert wait_for("n1 deletes as the writer", lambda: client.delete("d", refs[4:5], durable=True),
                        timeout=20, every=0.5) == 1
    deleted[4] = True
    # 5 rows: only a log holding both nodes' deletes has them all (n1's own has 2, n2's 4)
    wait_for("n1 publishes the merged log", lambda: published_deletes(cluster_config, 1, 5, "n1"))
    check_live(search(n1.address, vectors, collection="d", k=1), ids, deleted)
