"""Searches while things die (docs/cluster.md, "Searching the cluster"):

- a query node SIGKILLed while searches run through another node: every
  search in flight or after returns the complete answer (its shards are
  asked of the next ready node), none a short one;
- etcd SIGKILLed for a few seconds: searches go on, complete, from each
  node's last known state; writes are refused as retryable while the
  writer's lease cannot be renewed, and resume once etcd is back.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("boto3")
pytest.importorskip("etcd3gw")

from common.wire.errors import ServiceError  # noqa: E402
from shardmgr.cluster.config import ClusterConfig  # noqa: E402
from shardmgr.cluster.placement import owners  # noqa: E402
from shardmgr.store.client import StoreClient  # noqa: E402
from shardmgr.store.search import SearchResult  # noqa: E402
from tests.cluster_servers import EtcdServer  # noqa: E402
from tests.shardmgr.cluster.nodes import (  # noqa: E402
    DIM,
    batches,
    search,
    wait_for,
)
from tests.shardmgr.server.serverproc import ServerProcess  # noqa: E402


def equal(a: SearchResult, b: SearchResult) -> bool:
    return not a.partial and not b.partial and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_query_node_killed_mid_search_costs_no_result(three_nodes: list[ServerProcess]) -> None:
    n1, n2, n3 = three_nodes
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
