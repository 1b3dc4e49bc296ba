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

from collections.abc import Callable
from typing import Any

import numpy as np

from shardmgr.cluster.acked_deletes import AckedDeletes
from shardmgr.cluster.cache import ShardCache
from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.deletes_merger import DeletesMerger
from shardmgr.cluster.fanout import FanOut
from shardmgr.cluster.kv import Kv
from shardmgr.cluster.lease import NodeLease
from shardmgr.cluster.lookup import Lookup
from shardmgr.cluster.mirror import ClusterMirror
from shardmgr.cluster.objects import ObjectStore
from shardmgr.cluster.peers import Peers
from shardmgr.cluster.shard_search import ShardSearch
from shardmgr.errors import BadVectors
from shardmgr.store import batch, index
from shardmgr.store.search import Hits, SearchResult
from shardmgr.store.store import Store


class QueryRouter:
    """Searches and gets of a cluster node (module docstring)."""

    def __init__(self, config: ClusterConfig, node: NodeConfig, node_id: str, store: Store, objects: ObjectStore,
                 lease: Callable[[], NodeLease], peer_options: dict[str, Any] | None = None,
                 merger: DeletesMerger | None = None, acked: AckedDeletes | None = None) -> None:
        self.store = store
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
