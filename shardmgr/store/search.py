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
    """Global top-k from per-shard (scores, ids, refs) lists (each [nq, k_i])."""
    parts = [p for p in parts if p[0].shape[1]]
    if not parts:
        return Hits(np.full((nq, k), worst(metric), np.float32), np.full((nq, k), -1, np.int64),
                    np.full((nq, k), -1, np.int64))
    scores = np.concatenate([p[0] for p in parts], axis=1)
    ids = np.concatenate([p[1] for p in parts], axis=1)
    refs = np.concatenate([p[2] for p in parts], axis=1)
    missing = refs < 0
    key = scores if metric == "l2" else -scores
    key = np.where(missing, np.inf, key)
    width = scores.shape[1]
    if width > k:
        top = np.argpartition(key, k - 1, axis=1)[:, :k]
        key = np.take_along_axis(key, top, axis=1)
        scores, ids, refs = (np.take_along_axis(a, top, axis=1) for a in (scores, ids, refs))
    order = np.argsort(key, axis=1, kind="stable")
    scores, ids, refs = (np.take_along_axis(a, order, axis=1) for a in (scores, ids, refs))
    if width < k:
        pad = ((0, 0), (0, k - width))
        scores = np.pad(scores, pad, constant_values=worst(metric))
        ids = np.pad(ids, pad, constant_values=-1)
        refs = np.pad(refs, pad, constant_values=-1)
    refs_missing = refs < 0
    scores = np.where(refs_missing, np.float32(worst(metric)), scores)
    ids = np.where(refs_missing, -1, ids)
    return Hits(scores.astype(np.float32), ids, refs)


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
