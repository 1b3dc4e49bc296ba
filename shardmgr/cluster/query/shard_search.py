"""The part of a cluster search one node answers (``shardmgr.search_shards``).

A coordinating node (fanout.py) asks each node for some published shards by
id, and a holder also for its rows not yet published. This node searches
them where it has them: its own data directory (the shards it wrote, the
growing one included) or its cache of fetched shards (cache.py). It answers
with the merged top-k of those shards, exactly as a single store would
(the same Searcher and merge), and with the ids of the asked shards it does
not have (fetched elsewhere since, say), so the coordinator can ask another.

The coordinator may also send refs to skip (``deleted``: deletes it
acknowledged that are not published yet, acked_deletes.py). They are
skipped inside each shard's search exactly as its own deleted rows are
(a view with them added to its deleted mask), so each shard still answers
its k best live rows.

Threads: any connection thread; the views it reads are snapshots (view.py).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Sequence

import numpy as np

from shardmgr.errors import UnknownCollection
from shardmgr.store import ROW_BITS, ROW_MASK, Hits, Searcher, Store, View, gather, selector, split_refs


class ShardSearch:
    """Searches chosen shards of this node's store and cache store."""

    def __init__(self, store: Store, cache: Store) -> None:
        self.store = store
        self.cache = cache
        self._searchers: dict[str, Searcher] = {}
        self._lock = threading.Lock()

    def search(self, name: str, queries: np.ndarray, k: int, params: dict[str, int], shards: Sequence[int],
               unpublished: bool, exclude: np.ndarray, deleted: np.ndarray | None = None) -> tuple[Hits, list[int]]:
        """(top-k over the chosen shards, asked shard ids not here), skipping
        ``deleted`` (refs) too. ``queries`` and ``params`` were checked by the
        caller (Store's checks)."""
        collection = self.store.collection(name)
        here = {view.shard: view for view in collection.views()}
        try:
            fetched = {view.shard: view for view in self.cache.collection(name).views()}
        except UnknownCollection:
            fetched = {}
        views: list[View] = []
        not_here: list[int] = []
        for shard_id in shards:
            view = here.get(shard_id) or fetched.get(shard_id)
            if view is None:
                not_here.append(shard_id)
            else:
                views.append(view)
        if unpublished:
            skip = set(exclude.tolist()) | set(shards)
            views.extend(view for shard_id, view in here.items() if shard_id not in skip)
        if deleted is not None and len(deleted):
            views = list(without(views, deleted))
        return self._searcher(name, collection.metric).search(views, queries, k, params), not_here

    def rows(self, name: str, refs: np.ndarray,
             elsewhere: Iterable[int] = ()) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(vectors, ids, here) of ``refs`` (checked int64): the rows of shards
        this node has (except those of shards ``elsewhere``) are filled and
        ``here`` is True for them; the others are left for other nodes.
        UnknownRef for a row past its shard's end, RowDeleted for a deleted
        row, as a single store says."""
        shards, rows = split_refs(refs)
        views = self._views(name)
        for shard_id in elsewhere:
            views.pop(shard_id, None)
        return gather(views, shards, rows, refs, self.store.collection(name).dim, name)

    def _views(self, name: str) -> dict[int, View]:
        """Every shard of ``name`` this node can read: its cache's, and its own (which win)."""
        try:
            views = {view.shard: view for view in self.cache.collection(name).views()}
        except UnknownCollection:
            views = {}
        views.update((view.shard, view) for view in self.store.collection(name).views())
        return views

    def _searcher(self, name: str, metric: str) -> Searcher:
        searcher = self._searchers.get(name)
        if searcher is None:
            with self._lock:
                searcher = self._searchers.setdefault(name, Searcher(metric, self.store.config.hnsw_ef_search))
        return searcher


def without(views: Iterable[View], deleted: np.ndarray) -> Iterable[View]:
    """``views``, each with the rows of ``deleted`` (refs) it holds added to
    its deleted rows (a view of a shard without any of them: itself)."""
    shard_of = deleted >> np.int64(ROW_BITS)
    for view in views:
        if view.refs is None:
            rows = deleted[shard_of == view.shard] & np.int64(ROW_MASK)
            rows = rows[rows < view.rows]
        else:  # a rewritten shard: its rows keep the refs they had (lineage.py)
            rows = np.flatnonzero(np.isin(view.refs, deleted))
        if not len(rows):
            yield view
            continue
        mask = view.dead().copy()
        mask[rows] = True
        count = int(np.count_nonzero(mask))
        yield view if count == view.deleted_count else dataclasses.replace(view, deleted=mask, deleted_count=count,
                                                                          keep=selector(mask))
