"""An acknowledged delete is seen by the next search on the node that
acknowledged it, whichever nodes serve the shards (docs/cluster.md, "When a
delete is seen"), with real ``shardmgr serve --cluster`` nodes.

n1 writes "docs" (4 published shards, served by their owners among n1, n2
and n3, and a growing one). Rows that searches through n2 return are
deleted through n2 (forwarded to the writer, by ref), rows n3 returns
through n3 (by id), rows n1 returns through n1 (the writer itself). The
very next search and get on the node that acknowledged each delete skips
every deleted row and still returns k rows, complete, and so do the next
search and get of a ``connect_cluster`` client that reads from n3 and
deleted through the writer (they go to the writer); once every node has
seen the published deletes, every node's answer equals the writer's data
directory opened as one store, and that client's reads go back to n3 (the
writer's reply said it holds none of its deletes: before, they stayed on
the writer for the client's whole life).
"""

from __future__ import annotations

import signal

import numpy as np
import pytest

import shardmgr
from common.wire.client import RpcClient
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.published.mirror import ClusterMirror
from shardmgr.cluster.state.kv import Kv
from shardmgr.errors import RowDeleted
from shardmgr.store.client import StoreClient
from shardmgr.store.knn import SearchResult
from shardmgr.store.store import Store
from tests.shardmgr.cluster.nodes import batches, search, wait_for
from tests.shardmgr.server.serverproc import ServerProcess

K = 7


def rows() -> tuple[np.ndarray, np.ndarray]:
    data = list(batches(9, seed=11))  # the rows of the three_nodes fixture
    return np.concatenate([v for v, _ in data]), np.concatenate([i for _, i in data])


def held(proc: ServerProcess) -> int:
    """The acknowledged deleted rows ``proc`` holds (acked_deletes.py)."""
    with RpcClient(proc.address) as rpc:
        return int(rpc.call("stats").result["cluster"]["acked_rows_held"])


def check(found: SearchResult, deleted_refs: set[int], deleted_ids: set[int]) -> None:
    """Complete, k rows for every query, none of them deleted."""
    assert not found.partial, found.missing
    assert (found.refs >= 0).all(), "fewer than k rows returned"
    assert not set(found.refs.ravel().tolist()) & deleted_refs, "deleted refs returned"
    assert not set(found.ids.ravel().tolist()) & deleted_ids, "deleted ids returned"


def test_the_next_search_on_the_acknowledging_node_skips_the_deleted_rows(
        three_nodes: list[ServerProcess], cluster_config: ClusterConfig) -> None:
    n1, n2, n3 = three_nodes
    state = ClusterMirror(cluster_config, Kv(cluster_config)).read()
    cached = sorted(state.ready("n2", "docs") | state.ready("n3", "docs"))  # copies that lack the deletes at first
    assert cached, state.serving
    vectors, all_ids = rows()
    queries = vectors[::9]  # rows of every shard, each its own nearest
    deleted_refs: set[int] = set()
    deleted_ids: set[int] = set()
    with StoreClient(n1.address) as c1, StoreClient(n2.address) as c2, StoreClient(n3.address) as c3:
        before = c2.search("docs", queries, k=K)
        check(before, set(), set())
        assert len(np.unique(before.refs >> 40)) >= 4, "the rows come from several shards"

        # through n2, which forwards to the writer n1: by ref, the rows n2's search returned first
        doomed = np.unique(before.refs[:, :3])
        assert np.isin(doomed >> 40, cached).any()
        assert c2.delete("docs", doomed) == len(doomed)
        deleted_refs |= set(doomed.tolist())
        check(c2.search("docs", queries, k=K), deleted_refs, deleted_ids)
        with pytest.raises(RowDeleted):
            c2.get("docs", doomed[:1])

        # through n3, by id: ids n3's search returns now (n2's deletes may not be seen there yet)
        now = c3.search("docs", queries, k=K)
        check(now, set(), set())
        live = ~np.isin(now.refs[:, :2], list(deleted_refs))
        ids = np.unique(now.ids[:, :2][live])
        assert np.isin(now.refs[:, :2][live] >> 40, cached).any()
        assert c3.delete_ids("docs", ids, durable=True) == len(ids)
        deleted_ids |= set(ids.tolist())
        check(c3.search("docs", queries, k=K), set(), deleted_ids)

        # through the writer itself
        now = c1.search("docs", queries, k=K)
        check(now, set(), set())
        doomed = np.unique(now.refs[:, :2][~np.isin(now.refs[:, :2], list(deleted_refs)) &
                                           ~np.isin(now.ids[:, :2], list(deleted_ids))])
        assert np.isin(doomed >> 40, cached).any()
        assert c1.delete("docs", doomed) == len(doomed)
        check(c1.search("docs", queries, k=K), set(doomed.tolist()), set())
        deleted_refs |= set(doomed.tolist())
        with pytest.raises(RowDeleted):
            c1.get("docs", doomed[-1:])

    # through connect_cluster reading from n3: the delete goes to the writer, and the client's next
    # search and get of the collection go to the node that acknowledged it, while it holds the rows
    cluster = shardmgr.connect_cluster(cluster_config.etcd_url, prefer="n3")
    try:
        now = cluster.search("docs", queries, k=K)
        check(now, set(), set())  # (n3 may not have seen the deletes above yet)
        fresh = ~np.isin(now.refs[:, :2], list(deleted_refs)) & ~np.isin(now.ids[:, :2], list(deleted_ids))
        doomed = np.unique(now.refs[:, :2][fresh])
        assert np.isin(doomed >> 40, cached).any()
        assert cluster.delete("docs", doomed) == len(doomed)
        deleted_refs |= set(doomed.tolist())
        before = searches(three_nodes)
        check(cluster.search("docs", queries, k=K), deleted_refs, deleted_ids)
        assert (searches(three_nodes) - before).tolist() == [1, 0, 0]  # on the writer, which acknowledged it
        with pytest.raises(RowDeleted):
            cluster.get("docs", doomed[:1])
        assert len(deleted_refs) + len(deleted_ids) > 40
        answers = wait_for("every node to skip every deleted row",
                           lambda: converged(three_nodes, queries, deleted_refs, deleted_ids), timeout=20)
        # the writer holds none of them now: the client's first read from it says so, and its reads go
        # back to n3, which has seen what the writer saw
        check(cluster.search("docs", queries, k=K), deleted_refs, deleted_ids)
        before = searches(three_nodes)
        check(cluster.search("docs", queries, k=K), deleted_refs, deleted_ids)
        assert (searches(three_nodes) - before).tolist() == [0, 0, 1]
    finally:
        cluster.close()
    n1.signal(signal.SIGTERM)
    assert n1.wait() == 0
    with Store(n1.data_dir).open() as reference:
        want = reference.search("docs", queries, k=K)
        assert reference.collection_info("docs")["deleted"] == len(deleted_refs) + len(deleted_ids)
    for found in answers:
        for got, expected in zip(found, want, strict=True):
            np.testing.assert_array_equal(got, expected)


def searches(nodes: list[ServerProcess]) -> np.ndarray:
    """Each node's searches_total."""
    found = []
    for proc in nodes:
        with RpcClient(proc.address) as rpc:
            found.append(int(rpc.call("stats").result["cluster"]["searches_total"]))
    return np.array(found)


def converged(three_nodes: list[ServerProcess], queries: np.ndarray, deleted_refs: set[int],
              deleted_ids: set[int]) -> list[SearchResult] | None:
    """Once the writer published the logs: every node skips every deleted row, the acknowledging nodes
    no longer hold them, and the answers (the writer's as one store, checked by the caller)."""
    for proc in three_nodes:
        search(proc.address, queries, k=K)  # (a search drops what is seen elsewhere)
    if any(held(proc) for proc in three_nodes):
        return None
    found = [search(proc.address, queries, k=K) for proc in three_nodes]  # with nothing held
    for result in found:
        check(result, set(), set())
    gone = all(not set(r.refs.ravel().tolist()) & deleted_refs and not set(r.ids.ravel().tolist()) & deleted_ids
               for r in found)
    return found if gone else None
