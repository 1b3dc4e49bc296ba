"""A node's query side: the service's searches and gets in cluster mode
(``StoreService.router``), and the parts of them other nodes ask of it.

It puts together the pieces: the watched cluster state (mirror.py), the
shards this node serves (cache.py), its own part of a search or get
(shard_search.py), connections to the other nodes (peers.py), and the
coordination of a whole search (fanout.py) or get (lookup.py).

Life: :meth:`start` after the store recovered (the mirror reads etcd, the
cache store reopens its shards and its thread starts), :meth:`announce`
once the node joined, :meth:`stop` at a clean stop.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from common.errors import CommonError
from shardmgr.cluster.acked_deletes import AckedDeletes
from shardmgr.cluster.cache import ShardCache
from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.counts import CollectionCount, count
from shardmgr.cluster.deletes_merger import DeletesMerger
from shardmgr.cluster.fanout import FanOut
from shardmgr.cluster.kv import Kv
from shardmgr.cluster.lease import NodeLease
from shardmgr.cluster.lookup import Lookup
from shardmgr.cluster.mirror import ClusterMirror
from shardmgr.cluster.objects import ObjectStore
from shardmgr.cluster.peers import Peers
from shardmgr.cluster.report import NodeReport
from shardmgr.cluster.shard_search import ShardSearch
from shardmgr.errors import BadVectors
from shardmgr.store import batch, index
from shardmgr.store.search import Hits, SearchResult
from shardmgr.store.store import Store

REPORT_TIMEOUT_S = 2.0
"""How long a count waits for a node's report (it is built from memory: milliseconds)."""


class QueryRouter:
    """Searches and gets of a cluster node (module docstring)."""

    def __init__(self, config: ClusterConfig, node: NodeConfig, node_id: str, store: Store, objects: ObjectStore,
                 lease: Callable[[], NodeLease], peer_options: dict[str, Any] | None = None,
                 merger: DeletesMerger | None = None, acked: AckedDeletes | None = None) -> None:
        self.store = store
        self.node_id = node_id
        #: this node's report now (node.py sets it; None before it joined)
        self.report_here: Callable[[], NodeReport | None] = lambda: None
        self.mirror = ClusterMirror(config, Kv(config))
        self.cache = ShardCache(config, node, node_id, store, objects, self.mirror, lease, store.flusher, merger)
        self.shard_search = ShardSearch(store, self.cache.cache)
        self.peers = Peers(**(peer_options or {}))
        self.fanout = FanOut(node_id, store, self.mirror, self.shard_search, self.peers, acked)
        self.lookup = Lookup(self.fanout)

    def start(self) -> None:
        self.mirror.start()
        self.cache.start()

    def announce(self, address: str) -> None:
        self.cache.announce(address)

    def stop(self) -> None:
        self.cache.stop()
        self.mirror.stop()
        self.fanout.close()
        self.peers.close()

    @property
    def counters(self) -> dict[str, int]:
        return {**self.cache.counters, **self.fanout.counters}

    def search(self, name: str, queries: Any, k: int, params: dict[str, int] | None) -> SearchResult:
        """A search of the whole collection across the cluster (fanout.py)."""
        return self.fanout.search(name, queries, k, params)

    def count(self, name: str) -> CollectionCount:
        """``name``'s whole count across the cluster (counts.py), the same on
        every node: the watched shard map and deletes keys, and the nodes'
        reports, those of the live nodes that may hold rows of ``name`` not
        published (its writer, holders not clean) asked now, so that a count
        follows the writes acknowledged before it. One that does not answer
        is counted from its report in etcd, and the answer says so."""
        state = self.mirror.state()
        reports = {n: r for n, (r, _) in self.mirror.reports().items()}
        late: list[str] = []
        holders = state.holders.get(name, {})
        asked = {n for n, clean in holders.items() if not clean} | {state.writers.get(name, "")}
        for node_id in sorted(asked & set(state.members)):
            try:
                fresh = self._report_of(node_id, state.members[node_id])
            except (CommonError, ValueError, KeyError, TypeError) as e:  # a node gone or slow; a bad answer
                age = f"{max(0.0, time.time() - reports[node_id].at):.0f} s old" if node_id in reports else "none"
                late.append(f"node {node_id} did not answer ({e}): its rows not yet published are counted from "
                            f"its report in etcd ({age})")
                continue
            if fresh is not None:
                reports[node_id] = fresh
        found = count(name, state.published.get(name, {}),
                      {i: d.deleted for i, d in state.deletes.get(name, {}).items()}, holders,
                      set(state.members), reports, time.time())
        return dataclasses.replace(found, missing=found.missing + tuple(late)) if late else found

    def _report_of(self, node_id: str, address: str) -> NodeReport | None:
        if node_id == self.node_id:
            return self.report_here()
        with self.peers.client(address) as client:
            answer = client.call("shardmgr.report", {}, timeout=REPORT_TIMEOUT_S).result
        return NodeReport.from_json(node_id, answer) if answer else None

    def report(self) -> dict[str, Any]:
        """This node's report now (report.py), for another node's count; {} before it joined."""
        mine = self.report_here()
        return mine.as_json() if mine is not None else {}

    def info(self, name: str) -> dict[str, Any]:
        """``collection_info`` in cluster mode: the collection's parameters, and
        its counts over the whole cluster (counts.py), the same on every node;
        ``partial`` and ``missing`` say what could not be counted; ``here``:
        this node's own data directory (what one store would answer)."""
        local = self.store.collection_info(name)  # UnknownCollection if no node created it
        c = self.count(name)
        shards = c.published_shards + c.unpublished_shards
        return {**{k: local[k] for k in ("name", "dim", "metric", "index", "quarantined")},
                "rows": c.rows, "deleted": c.deleted, "shards": shards, "sealed": shards - c.growing,
                "growing": c.growing, "bytes": (c.published_rows + c.unpublished_rows) * (local["dim"] * 4 + 8),
                "partial": c.partial, "missing": list(c.missing), "cluster": c.as_dict(),
                "here": {k: local[k] for k in ("rows", "deleted", "shards", "sealed", "growing")}}

    def rows(self, name: str, refs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Rows by ref wherever they are in the cluster (lookup.py)."""
        return self.lookup.rows(name, refs)

    def rows_here(self, name: str, refs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This node's part of another node's get: (vectors, ids, here) (shard_search.py)."""
        return self.shard_search.rows(name, batch.refs(refs, self.store.config.max_batch_rows))

    def search_shards(self, name: str, queries: Any, k: int, params: dict[str, int] | None, shards: list[int],
                      unpublished: bool, exclude: Any, deleted: Any = None) -> tuple[Hits, list[int]]:
        """This node's part of another node's search (shard_search.py), its
        input checked here; ``deleted``: refs to skip besides the deleted rows
        (what the asking node acknowledged: acked_deletes.py)."""
        collection = self.store.collection(name)
        checked = batch.vectors(queries, collection.dim, "queries", max_rows=self.store.config.max_queries)
        k = batch.k(k, self.store.config.max_k)
        chosen = index.check_params(params)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in shards):
            raise BadVectors(f"shards must be a list of shard ids (integers), got {shards!r:.200}")
        skip = batch.refs(deleted, self.store.config.max_batch_rows) if deleted is not None else None
        return self.shard_search.search(name, checked, k, chosen, shards, unpublished, batch.refs(exclude), skip)
