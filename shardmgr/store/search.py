"""k-nearest-neighbour search over a collection's shards, merged exactly.

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


@dataclasses.dataclass(frozen=True, slots=True)
class Hits:
    """Results per query: scores, ids and refs, each [nq, k]."""

    scores: np.ndarray
    ids: np.ndarray
    refs: np.ndarray


def worst(metric: str) -> float:
    return np.inf if metric == "l2" else -np.inf


def search_rows(queries: np.ndarray, vectors: np.ndarray, k: int, metric: str,
                keep: Selector | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-k over in-place rows: (scores, row numbers), [nq, min(k, rows)];
    with ``keep``, over the rows it selects only (row -1 where fewer are left)."""
    k = min(k, len(vectors))
    if k == 0:
        return np.zeros((len(queries), 0), np.float32), np.zeros((len(queries), 0), np.int64)
    if keep is None:
        return faiss.knn(queries, vectors, k, metric=METRICS[metric])
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    vectors = np.ascontiguousarray(vectors)  # mapped rows are contiguous already: no copy
    nq, dim = queries.shape
    scores, rows = np.empty((nq, k), np.float32), np.empty((nq, k), np.int64)
    args = (faiss.swig_ptr(queries), faiss.swig_ptr(vectors), dim, nq, len(vectors), k, faiss.swig_ptr(scores),
            faiss.swig_ptr(rows))
    if metric == "l2":
        faiss.knn_L2sqr(*args, None, keep.selector)  # None: no precomputed norms
    else:
        faiss.knn_inner_product(*args, keep.selector)
    return scores, rows


def merge(parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], nq: int, k: int, metric: str) -> Hits:
    """Global top-k from per-shard (scores, ids, refs) lists (each [nq, k_i]).

    One partition, one sort and one gather per column (plain fancy indexing:
    ``take_along_axis`` costs more than the search of one query on a small
    shard)."""
    parts = [p for p in parts if p[0].shape[1]]
    out_scores = np.full((nq, k), worst(metric), np.float32)
    out_ids, out_refs = np.full((nq, k), -1, np.int64), np.full((nq, k), -1, np.int64)
    if not parts:
        return Hits(out_scores, out_ids, out_refs)
    if len(parts) == 1:
        scores, ids, refs = parts[0]
    else:
        scores, ids, refs = (np.concatenate([p[i] for p in parts], axis=1) for i in range(3))
    key = np.where(refs < 0, np.inf, scores if metric == "l2" else -scores)
    row = np.arange(nq)[:, None]
    if key.shape[1] > k:
        top = np.argpartition(key, k - 1, axis=1)[:, :k]
        pick = top[row, np.argsort(key[row, top], axis=1, kind="stable")]
    else:
        pick = np.argsort(key, axis=1, kind="stable")
    width = pick.shape[1]
    found = refs[row, pick]
    missing = found < 0
    out_refs[:, :width] = found
    out_ids[:, :width] = np.where(missing, -1, ids[row, pick])
    out_scores[:, :width] = np.where(missing, np.float32(worst(metric)), scores[row, pick])
    return Hits(out_scores, out_ids, out_refs)


def shard_part(shard: int, scores: np.ndarray, rows: np.ndarray, ids_column: np.ndarray,
               refs_column: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(scores, ids, refs) of one shard's hits; faiss's -1 rows stay missing.
    ``refs_column``: the rows' refs of a rewritten shard (lineage.py)."""
    found = rows >= 0
    safe = np.where(found, rows, 0)
    ids = np.where(found, ids_column[safe] if len(ids_column) else -1, -1)
    named = refs_column[safe] if refs_column is not None and len(refs_column) else ref_of(shard, safe)
    refs = np.where(found, named, -1)
    return scores, ids, refs
