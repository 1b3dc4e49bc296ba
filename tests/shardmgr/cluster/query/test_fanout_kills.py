"""Searches while things die (docs/cluster.md, "Searching the cluster"):

- rows by ref (``get``, ``ids``) from every node: rows of published shards
  wherever they are served, rows of the writer's growing shard from the
  writer, the single store's errors for unknown refs;
- a query node SIGKILLed while searches run through another node: every
  search in flight or after returns the complete answer (its shards are
  asked of the next ready node), none a short one;
- then the writer SIGKILLed: a get of its growing shard's rows is
  ``shards_unavailable`` (retryable), not ``unknown_ref``;
- etcd SIGKILLed for a few seconds: searches go on, complete, from each
  node's last known state; writes are refused as retryable while the
  writer's lease cannot be renewed, and resume once etcd is back;
- SeaweedFS SIGKILLed for a few seconds: searches through every node stay
  complete and equal (shards are served from local disks), appends go on
  and seal a shard whose upload waits; once S3 is back the shard is
  published, its owners fetch it, and every node finds the new rows.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from common.wire.client import RpcClient
from common.wire.errors import BadRequest, ServiceError
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import ShardsUnavailable
from shardmgr.cluster.published.placement import owners
from shardmgr.errors import UnknownCollection, UnknownRef
from shardmgr.store.client import StoreClient
from shardmgr.store.knn import SearchResult
from tests.cluster_servers import EtcdServer, WeedServer
from tests.shardmgr.cluster.nodes import (
    DIM,
    batches,
    published,
    search,
    served_by_owners,
    wait_for,
)
from tests.shardmgr.server.serverproc import ServerProcess


def equal(a: SearchResult, b: SearchResult) -> bool:
    return not a.partial and not b.partial and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_gets_from_every_node_then_a_query_node_then_the_writer_killed(three_nodes: list[ServerProcess]) -> None:
    """One cluster (its setup is the slow part) for three checks in a row:
    rows by ref from every node; a query node killed mid-search costs no
    result; with the writer dead, rows of its growing shard are unavailable
    (retryable), not unknown."""
    n1 = three_nodes[0]
    rows = list(batches(9, seed=11))
    vectors, ids = np.concatenate([v for v, _ in rows]), np.concatenate([i for _, i in rows])
    refs = search(n1.address, vectors, k=1).refs[:, 0]  # each row's own ref: 5 shards, the last growing
    assert len(np.unique(refs >> 40)) == 5
    for proc in three_nodes:
        with StoreClient(proc.address) as client:
            np.testing.assert_array_equal(client.get("docs", refs), vectors)
            np.testing.assert_array_equal(client.ids("docs", refs[::7]), ids[::7])
            with pytest.raises(UnknownRef):
                client.get("docs", [int(refs[0]) + 10_000])  # past its shard's end
            with pytest.raises(UnknownRef):
                client.get("docs", [99 << 40])  # a shard nobody has

    bad_parts_of_a_search_change_nothing(three_nodes[1], vectors, refs)
    through = query_node_killed_mid_search(three_nodes)

    n1.kill()  # the writer: its growing shard (5) is on no other node
    with StoreClient(through.address) as client, pytest.raises(ShardsUnavailable, match="shard"):
        client.get("docs", refs[-1:])


def bad_parts_of_a_search_change_nothing(proc: ServerProcess, vectors: np.ndarray, refs: np.ndarray) -> None:
    """A node's part of a search or get, asked with garbage, is refused with
    the single store's errors, and every row still answers as before."""
    good = {"queries": vectors[:2], "exclude": np.zeros(0, np.int64)}
    with RpcClient(proc.address) as rpc:
        for args, parts in (({"shards": ["x"]}, good), ({"shards": [1]}, {**good, "queries": vectors[:2, :3]}),
                            ({"shards": [1]}, {**good, "queries": np.full((1, DIM), np.nan, np.float32)}),
                            ({"shards": [1]}, {**good, "exclude": np.zeros(2, np.float32)})):
            with pytest.raises(BadRequest):
                rpc.call("shardmgr.search_shards", {"name": "docs", "k": 3, **args}, parts)
        with pytest.raises(BadRequest):
            rpc.call("shardmgr.get_shards", {"name": "docs"}, {"refs": np.zeros(2, np.float32)})
        with pytest.raises(UnknownCollection):
            rpc.call("shardmgr.get_shards", {"name": "nope"}, {"refs": refs[:1]})
    with StoreClient(proc.address) as client:
        np.testing.assert_array_equal(client.get("docs", refs), vectors)
        assert not client.search("docs", vectors[:3], k=1).partial


def query_node_killed_mid_search(three_nodes: list[ServerProcess]) -> ServerProcess:
    """SIGKILL the query node that owns the most shards while searches run
    through the other: every search returns the complete answer. Returns the
    node searched through."""
    _, n2, n3 = three_nodes
    owned = {p: sum(owners(["n1", "n2", "n3"], "docs", s) == [p.data_dir.name] for s in range(1, 5)) for p in (n2, n3)}
    victim = max(owned, key=owned.__getitem__)
    through = n2 if victim is n3 else n3
    queries = np.random.default_rng(2).random((40, DIM), dtype=np.float32)
    want = search(through.address, queries)
    results: list[SearchResult] = []
    stop = threading.Event()

    def searching() -> None:
        with StoreClient(through.address) as client:
            while not stop.is_set() and len(results) < 2000:
                results.append(client.search("docs", queries, k=7))

    thread = threading.Thread(target=searching)
    thread.start()
    try:
        wait_for("searches under way", lambda: len(results) >= 5)
        victim.kill()
        count = len(results)
        wait_for("searches after the kill", lambda: len(results) >= count + 20)
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()
    short = [i for i, r in enumerate(results) if not equal(r, want)]
    assert not short, (len(short), len(results), results[short[0]].missing)
    return through




def test_etcd_killed_for_a_while_searches_go_on_and_writes_resume(
        three_nodes: list[ServerProcess], etcd: EtcdServer, cluster_config: ClusterConfig) -> None:
    n1, n2, _ = three_nodes
    queries = np.random.default_rng(3).random((20, DIM), dtype=np.float32)
    want = search(n2.address, queries)
    etcd.kill()
    try:
        during = [search(proc.address, queries) for proc in three_nodes]
        assert all(equal(found, want) for found in during), [f.missing for f in during]
        vectors, ids = next(batches(1, seed=99))
        refused = wait_for("a write refused while the writer's lease cannot be renewed", lambda: _refused(
            n1.address, vectors, ids), timeout=15)
        assert refused.code.startswith("shardmgr.cluster.") or refused.code == "unavailable", refused
    finally:
        etcd.restart()
    with StoreClient(n1.address) as client:
        wait_for("appends resume", lambda: _appended(client, vectors, ids), timeout=30)
    wait_for("complete results with the new rows", lambda: (lambda r: not r.partial and (
        r.ids[:, 0] == ids[:5]).all())(search(n2.address, vectors[:5], k=1)), timeout=30)


def test_object_storage_killed_for_a_while_searches_stay_complete_and_appends_go_on(
        three_nodes: list[ServerProcess], weed: WeedServer, cluster_config: ClusterConfig) -> None:
    n1 = three_nodes[0]
    queries = np.random.default_rng(4).random((20, DIM), dtype=np.float32)
    want = search(n1.address, queries)
    shards = len(published(cluster_config, "docs"))
    data = list(batches(2, seed=77))  # with the growing batch: three, so that shard is sealed
    weed.kill()
    try:
        assert all(equal(search(proc.address, queries), want) for proc in three_nodes)
        with StoreClient(n1.address) as client:
            for vectors, ids in data:
                client.append("docs", vectors, ids + 50_000, durable=True)
        n1.wait_log(r"uploading shard \d+ of docs failed \(retried in")
        found = [search(proc.address, data[0][0], k=1) for proc in three_nodes]  # the holder answers its rows
        assert all(not f.partial and (f.ids[:, 0] == data[0][1] + 50_000).all() for f in found)
    finally:
        weed.restart()
    wait_for("the sealed shard published", lambda: len(published(cluster_config, "docs")) == shards + 1, timeout=30)
    wait_for("its owners serve it", lambda: served_by_owners(cluster_config, "docs"), timeout=30)
    vectors = np.concatenate([v for v, _ in data])
    ids = np.concatenate([i for _, i in data]) + 50_000
    for proc in three_nodes:
        found = search(proc.address, vectors, k=1)
        assert not found.partial and (found.ids[:, 0] == ids).all()


def _refused(address: str, vectors: np.ndarray, ids: np.ndarray) -> ServiceError | None:
    with StoreClient(address, retry_for=0.0) as client:
        try:
            client.append("docs", vectors[:1] + 5.0, ids[:1] + 10_000)  # far from every other row
        except ServiceError as e:
            return e
    return None


def _appended(client: StoreClient, vectors: np.ndarray, ids: np.ndarray) -> bool:
    try:
        client.append("docs", vectors, ids, durable=True)
    except ServiceError:
        return False
    return True
