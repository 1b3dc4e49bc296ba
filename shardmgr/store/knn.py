"""k-nearest-neighbour search's pieces: exact search of rows, each shard's
part of an answer, and the exact merge of the parts (the collection's search
that puts them together: searcher.py).

Each shard is searched with faiss on its rows in place (no copy): exact
``faiss.knn`` over the mapped vectors, or the shard's approximate index when
one is built. Scores are faiss's: squared L2 distance for ``l2`` (smaller is
nearer), inner product for ``ip`` (larger is nearer). The per-shard top-k
lists are concatenated and reduced to the global top-k per query with one
vectorised partition and sort; missing results (fewer than k rows) are
padded with ref -1, id -1 and score +inf (l2) or -inf (ip).

All queries of a call are searched as one batch per shard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import faiss
import numpy as np

from .deletes import Selector
from .refs import ref_of

METRICS = {"l2": faiss.METRIC_L2, "ip": faiss.METRIC_INNER_PRODUCT}
NO_MASK = np.zeros((0, 0), bool)
PARTITION_ABOVE = 4
"""merge partitions before sorting only past this many candidates per wanted result (a small sort is cheaper)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Hits:
    """Results per query: scores, ids and refs, each [nq, k]."""

    scores: np.ndarray
    ids: np.ndarray
    refs: np.ndarray


class SearchResult(tuple[np.ndarray, np.ndarray, np.ndarray]):
    """What a search returns: ``(scores, ids, refs)``, each [nq, k] (it
    unpacks as that tuple), and whether every row was searched. A single
    store's search is always complete; a cluster search (docs/cluster.md) is
    ``partial`` when some shards or some node's unpublished rows could not
    be searched, and ``missing`` names each of them in words."""

    missing: tuple[str, ...]

    def __new__(cls, scores: np.ndarray, ids: np.ndarray, refs: np.ndarray,
                missing: tuple[str, ...] | list[str] = ()) -> SearchResult:
        result = super().__new__(cls, (scores, ids, refs))
        result.missing = tuple(missing)
        return result

    @property
    def partial(self) -> bool:
        return bool(self.missing)

    @property
    def scores(self) -> np.ndarray:
        return self[0]

    @property
    def ids(self) -> np.ndarray:
        return self[1]

    @property
    def refs(self) -> np.ndarray:
        return self[2]


def worst(metric: str) -> float:
    return np.inf if metric == "l2" else -np.inf


def search_rows(queries: np.ndarray, vectors: np.ndarray, k: int, metric: str,
                keep: Selector | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k over in-place rows: (scores, row numbers), [nq, min(k, rows)];
    with ``keep``, over the rows it selects only (row -1 where fewer are left).
    faiss's C++ entry points are called directly (``faiss.knn`` adds checks
    that cost as much as searching a small shard for one query)."""
    k = min(k, len(vectors))
    if k == 0:
        return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    vectors = np.ascontiguousarray(vectors)  # mapped rows are contiguous already: no copy
    nq, dim = queries.shape
    scores, rows = np.empty((nq, k), np.float32), np.empty((nq, k), np.int64)
    args = (faiss.swig_ptr(queries), faiss.swig_ptr(vectors), dim, nq, len(vectors), k, faiss.swig_ptr(scores),
            faiss.swig_ptr(rows))
    if metric == "l2":
        faiss.knn_L2sqr(*args, None, keep.selector if keep else None)  # None: no precomputed norms
    else:
        faiss.knn_inner_product(*args, keep.selector if keep else None)
    return scores, rows


def merge(parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], nq: int, k: int, metric: str,
          complete: bool = False) -> Hits:
    """Global top-k from per-shard (scores, ids, refs) lists (each [nq, k_i]).

    One sort and one gather per column (plain fancy indexing:
    ``take_along_axis`` costs more than the search of one query on a small
    shard), with a partition first only when there are many more candidates
    than k. ``complete``: the caller knows no part has a missing (-1) result,
    so none is looked for; the padding is done only when some are missing or
    fewer than k were found. A complete first part that is the answer
    already (``_first_is_answer``) is returned as it is: no sort."""
    parts = [p for p in parts if p[0].shape[1]]
    if not parts:
        return _padded(nq, k, metric)
    if complete and _first_is_answer(parts, k, metric):
        return Hits(*parts[0])
    if len(parts) == 1:
        scores, ids, refs = parts[0]
    else:
        scores, ids, refs = (np.concatenate([p[i] for p in parts], axis=1) for i in range(3))
    missing = NO_MASK if complete else refs < 0
    some_missing = not complete and bool(missing.any())
    key = scores if metric == "l2" else -scores
    if some_missing:
        key = np.where(missing, np.inf, key)
    row = np.arange(nq)[:, None]
    if key.shape[1] > PARTITION_ABOVE * k:
        top = np.argpartition(key, k - 1, axis=1)[:, :k]
        pick = top[row, np.argsort(key[row, top], axis=1, kind="stable")]
    else:
        pick = np.argsort(key, axis=1, kind="stable")[:, :k]
    found_scores, found_ids, found_refs = scores[row, pick], ids[row, pick], refs[row, pick]
    if pick.shape[1] == k and not some_missing:
        return Hits(found_scores, found_ids, found_refs)
    out = _padded(nq, k, metric)
    width = pick.shape[1]
    lost = found_refs < 0
    out.refs[:, :width] = found_refs
    out.ids[:, :width] = np.where(lost, -1, found_ids)
    out.scores[:, :width] = np.where(lost, np.float32(worst(metric)), found_scores)
    return out


def _first_is_answer(parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], k: int, metric: str) -> bool:
    """Whether the merge of complete ``parts`` is their first part as it is:
    it has k columns in order (faiss sorts its results, and a stable sort
    of rows in order keeps them where they are) and no other part has a
    row ranked before its k-th (a tie goes to the first part, as the stable
    sort gives it). The usual search of one sealed shard, alone or beside a
    growing shard of a few rows, then costs a few comparisons instead of a
    sort and three gathers. Only where the merge would sort without a
    partition first (which does not keep tied rows in order)."""
    first = parts[0][0]
    if first.shape[1] != k or sum(p[0].shape[1] for p in parts) > PARTITION_ABOVE * k:
        return False
    # "not all(ranked no earlier)" rather than "any(ranked earlier)": a NaN compares false, so it takes the sort
    after = np.greater_equal if metric == "l2" else np.less_equal  # ranked no earlier than
    if k > 1 and not bool(after(first[:, 1:], first[:, :-1]).all()):
        return False
    kth = first[:, -1:]
    return all(bool(after(scores, kth).all()) for scores, _, _ in parts[1:])


def _padded(nq: int, k: int, metric: str) -> Hits:
    """No result yet: score worst, id -1, ref -1 everywhere."""
    return Hits(np.full((nq, k), worst(metric), np.float32), np.full((nq, k), -1, np.int64),
                np.full((nq, k), -1, np.int64))


def shard_part(shard: int, scores: np.ndarray, rows: np.ndarray, ids_column: np.ndarray,
               refs_column: np.ndarray | None = None,
               complete: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scores, ids, refs) of one shard's hits; faiss's -1 rows stay missing.
    ``refs_column``: the rows' refs of a rewritten shard (lineage.py);
    ``complete``: the caller knows every row is found (no -1), so no masking."""
    if complete:
        return scores, ids_column[rows], refs_column[rows] if refs_column is not None else ref_of(shard, rows)
    found = rows >= 0
    safe = np.where(found, rows, 0)
    ids = np.where(found, ids_column[safe] if len(ids_column) else -1, -1)
    named = refs_column[safe] if refs_column is not None and len(refs_column) else ref_of(shard, safe)
    refs = np.where(found, named, -1)
    return scores, ids, refs
