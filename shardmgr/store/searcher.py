"""A collection's search: every shard's top-k live rows, merged (knn.py).

One call costs the shards' faiss searches plus a fixed part that matters
for one-query calls (a faiss HNSW or IVF search of one query takes a few
hundred microseconds). The fixed part is kept to a few numpy calls per
shard: the faiss search parameters are made once per (shard view, params,
k) and reused, the check for short results looks at a whole result array at
once, and the merge skips its padding work when every shard filled its k.

Threads: any number of searching threads share one :class:`Searcher`. The
parameter cache belongs to one published list of views and is dropped when
the collection publishes another (``forget``), so it never keeps a replaced
shard's mapping alive past the next search or publish. It is replaced whole,
never locked: the cost of a race is a parameter object made twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from . import index as indexes
from .knn import Hits, merge, search_rows, shard_part
from .view import View

MAX_CACHED = 1024
"""Search parameter objects kept per collection (shards x distinct params x k); the cache starts over past it."""

Knobs = tuple[tuple[str, int], ...]


class Searcher:
    """Searches one collection's shard views (``metric``: "l2" or "ip")."""

    def __init__(self, metric: str, ef_default: int) -> None:
        self.metric = metric
        self.ef_default = ef_default
        self._cache: tuple[Sequence[View] | None, dict[tuple[int, Knobs, int], Any]] = (None, {})

    def forget(self) -> None:
        """Drop the cached parameters (the collection published new views)."""
        self._cache = (None, {})

    def search(self, views: Sequence[View], queries: np.ndarray, k: int, params: dict[str, int]) -> Hits:
        """Top-k live rows over ``views`` (deleted rows are skipped inside faiss)."""
        knobs = tuple(sorted(params.items())) if params else ()
        cached_views, cache = self._cache
        if cached_views is not views:
            cache = {}
            self._cache = (views, cache)
        parts, complete = [], True
        for view in views:
            if view.live > 0:
                scores, rows, found = self._search_shard(view, queries, k, knobs, cache)
                complete = complete and found
                parts.append(shard_part(view.shard, scores, rows, view.ids, view.refs, found))
        return merge(parts, len(queries), k, self.metric, complete)

    def _search_shard(self, view: View, queries: np.ndarray, k: int, knobs: Knobs,
                      cache: dict[tuple[int, Knobs, int], Any]) -> tuple[np.ndarray, np.ndarray, bool]:
        """(scores, rows, whether every row was found) of one shard's top-k
        live rows (one ``min()`` decides the last: the common case needs no
        masking anywhere). Every shard returns k rows when it holds k live
        ones: with an approximate index, a query answered with fewer than
        min(k, live rows) rows (IVF lists of fewer than k rows at a low
        nprobe; a graph whose neighbourhoods are mostly deleted runs dry) is
        searched again, first through the index at doubled breadth
        (``_widen``), then exactly over the shard if it is still short.
        Queries answered in full keep the index's answer unchanged."""
        keep = view.keep
        if view.index is None:
            scores, rows = search_rows(queries, view.vectors, k, self.metric, keep)
            return scores, rows, bool(rows.min() >= 0)
        scores, rows = view.index.search(queries, min(k, view.rows), params=self._chosen(view, knobs, k, cache))
        if rows.min() >= 0:  # every query got min(k, rows) >= min(k, live) rows: nothing is short
            return scores, rows, True
        short = _short(rows, min(k, view.live))
        if len(short):
            short = self._widen(view, queries, k, knobs, cache, scores, rows, short)
        if len(short):
            scores[short], rows[short] = search_rows(queries[short], view.vectors, rows.shape[1], self.metric,
                                                     keep)
        return scores, rows, bool(rows.min() >= 0)

    def _widen(self, view: View, queries: np.ndarray, k: int, knobs: Knobs, cache: dict[tuple[int, Knobs, int], Any],
               scores: np.ndarray, rows: np.ndarray, short: np.ndarray) -> np.ndarray:
        """Search the ``short`` queries again through the index, doubling its
        breadth (index.widened: nprobe, efSearch) while any is still short and
        the bound allows; their rows of ``scores`` and ``rows`` are replaced.
        Returns the queries still short. An exact search of one short query
        reads the whole shard (at IVF1024 nprobe 1, half as long as faiss's
        search of the whole batch of a thousand); a search at twice the
        breadth reads a few lists."""
        wanted = min(k, view.live)
        params = dict(knobs)
        while len(short):
            wider = indexes.widened(view.index, params, k, self.ef_default, view.live)
            if wider is None:
                break
            params = wider
            chosen = self._chosen(view, tuple(sorted(params.items())), k, cache)
            found_scores, found_rows = view.index.search(queries[short], rows.shape[1], params=chosen)
            scores[short], rows[short] = found_scores, found_rows
            short = short[(found_rows >= 0).sum(axis=1) < wanted]
        return short

    def _chosen(self, view: View, knobs: Knobs, k: int, cache: dict[tuple[int, Knobs, int], Any]) -> Any:
        """The faiss search parameters for ``view``'s index (made once per published view list, then reused)."""
        key = (view.shard, knobs, k)
        chosen = cache.get(key)
        if chosen is None:
            chosen = indexes.search_params(view.index, dict(knobs), k, self.ef_default,
                                           view.keep.selector if view.keep is not None else None)
            if len(cache) >= MAX_CACHED:
                cache.clear()
            cache[key] = chosen
        return chosen


def _short(rows: np.ndarray, wanted: int) -> np.ndarray:
    """The queries (in order) answered with fewer than ``wanted`` of the rows
    in ``rows`` (-1: missing). The missing rows are counted per query from
    one pass over the flat array (at IVF nprobe 1 a batch of a thousand
    misses about one): a count per query costs four times as much, and
    np.unique imports numpy.ma on its first call (a tenth of a second)."""
    missing = np.bincount(np.flatnonzero(rows.ravel() < 0) // rows.shape[1])  # up to the last query missing one
    short: np.ndarray = np.flatnonzero(missing > rows.shape[1] - wanted)
    return short
