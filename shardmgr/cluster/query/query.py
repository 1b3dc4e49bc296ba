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
import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.errors import WatchBehind
from shardmgr.cluster.peers import Peers
from shardmgr.cluster.published.acked_deletes import AckedDeletes
from shardmgr.cluster.published.cache import ShardCache
from shardmgr.cluster.published.deletes_merger import DeletesMerger
from shardmgr.cluster.published.mirror import ClusterMirror
from shardmgr.cluster.query.fanout import FanOut
from shardmgr.cluster.query.lookup import Lookup
from shardmgr.cluster.query.shard_search import ShardSearch
from shardmgr.cluster.state.counts import CollectionCount, count
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.cluster.state.report import NodeReport
from shardmgr.errors import BadVectors
from shardmgr.store import Hits, SearchResult, Store, check_params, inputs

REPORT_TIMEOUT_S = 2.0
"""How long a count waits for a node's report (it is built from memory: milliseconds), and then for
this node's watch to reach the reports' revision."""
AFTER_WAIT_S = 2.0
"""How long a search or get that names a revision (``after``) waits for this node's watch to reach it."""


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

    def search(self, name: str, queries: Any, k: int, params: dict[str, int] | None,
               after: int = 0) -> tuple[SearchResult, dict[str, Any]]:
        """A search of the whole collection across the cluster (fanout.py),
        once this node's state reflects revision ``after``; and what its
        reply adds (:meth:`read_fields`)."""
        self._reach(after)
        return self.fanout.search(name, queries, k, params), self.read_fields(name)

    def rows(self, name: str, refs: Any, after: int = 0) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
        """Rows by ref wherever they are in the cluster (lookup.py), as :meth:`search`."""
        self._reach(after)
        vectors, ids = self.lookup.rows(name, refs)
        return vectors, ids, self.read_fields(name)

    def read_fields(self, name: str) -> dict[str, Any]:
        """What a search or get reply adds in cluster mode (docs/protocol.md):
        ``state_revision``, the ``applied`` revision of this node's state now
        (at least the one it read by), and ``held_deletes``: true while it
        holds acknowledged deletes of ``name`` (acked_deletes.py)."""
        fields: dict[str, Any] = {"state_revision": self.mirror.state().applied}
        if self.fanout.acked.holds(name):
            fields["held_deletes"] = True
        return fields

    def _reach(self, after: int) -> None:
        """Wait until this node's state reflects revision ``after``; WatchBehind after AFTER_WAIT_S."""
        if after > 0 and not self.mirror.caught_up(after, AFTER_WAIT_S):
            raise WatchBehind(f"node {self.node_id} has not seen the cluster state of revision {after} within "
                              f"{AFTER_WAIT_S:g} s (its watch is behind etcd): nothing was read; retry, here or "
                              "on another node")

    def count(self, name: str) -> CollectionCount:
        """``name``'s whole count across the cluster (counts.py), the same on
        every node: the watched shard map and deletes keys, and the nodes'
        reports. The live nodes that may hold rows of ``name`` not published
        (its writer, holders not clean) are asked for their report now, all at
        once, so that a count follows the writes acknowledged before it; then
        the state is read again, once it reflects every report's revision, so
        that a shard a node published before its report is counted as
        published (never nowhere). A node that does not answer is counted from
        its report in etcd, and the answer says so."""
        first = self.mirror.state()
        holders = first.holders.get(name, {})
        asked = ({n for n, clean in holders.items() if not clean} | {first.writers.get(name, "")}) & set(first.members)
        answers = self.fanout.at_once({node_id: functools.partial(self._report_of, node_id, first.members[node_id])
                                       for node_id in sorted(asked)})
        fresh = {node_id: report for node_id, (report, _) in answers.items() if report is not None}
        revision = max((report.revision for report in fresh.values()), default=0)
        behind = not self.mirror.caught_up(revision, REPORT_TIMEOUT_S)
        state = self.mirror.state()
        reports = {n: r for n, (r, _) in self.mirror.reports().items()} | fresh
        late = [_late(node_id, error, reports.get(node_id)) for node_id, (_, error) in answers.items()
                if error is not None]
        if behind:
            late.append(f"this node's view of the cluster (revision {state.applied}) is behind the reports counted "
                        f"(revision {revision}): rows published in between may be left out")
        found = count(name, state.published.get(name, {}),
                      {i: d.deleted for i, d in state.deletes.get(name, {}).items()}, state.holders.get(name, {}),
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

    def rows_here(self, name: str, refs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This node's part of another node's get: (vectors, ids, here) (shard_search.py)."""
        return self.shard_search.rows(name, inputs.refs(refs, self.store.config.max_batch_rows))

    def search_shards(self, name: str, queries: Any, k: int, params: dict[str, int] | None, shards: list[int],
                      unpublished: bool, exclude: Any, deleted: Any = None) -> tuple[Hits, list[int]]:
        """This node's part of another node's search (shard_search.py), its
        input checked here; ``deleted``: refs to skip besides the deleted rows
        (what the asking node acknowledged: acked_deletes.py)."""
        collection = self.store.collection(name)
        checked = inputs.vectors(queries, collection.dim, "queries", max_rows=self.store.config.max_queries)
        k = inputs.k(k, self.store.config.max_k)
        chosen = check_params(params)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in shards):
            raise BadVectors(f"shards must be a list of shard ids (integers), got {shards!r:.200}")
        # no row limit: the asking node bounds what it holds (max_held_deletes), the frame what it sends
        skip = inputs.refs(deleted) if deleted is not None else None
        return self.shard_search.search(name, checked, k, chosen, shards, unpublished, inputs.refs(exclude), skip)


def _late(node_id: str, error: BaseException, report: NodeReport | None) -> str:
    """What a count says of a node asked for its report that did not answer."""
    age = f"{max(0.0, time.time() - report.at):.0f} s old" if report is not None else "none"
    return (f"node {node_id} did not answer ({error}): its rows not yet published are counted from its report in "
            f"etcd ({age})")
