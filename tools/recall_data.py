"""The data sets of tools/bench_recall.py, their exact answers and recall.

``debian``: one wordllama 256-d unit vector per Debian package description
(``apt-cache dumpavail``, embedded as examples/embedtext.py does), cached as
a .npy so that reruns skip the embedding; the last ``queries`` documents are
held out as queries (never in the collection). Metric ip.
``random``: Gaussian float32 rows and queries drawn apart. Metric l2.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np

K = 10
METRICS = {"ip": faiss.METRIC_INNER_PRODUCT, "l2": faiss.METRIC_L2}
EMBED_BATCH = 4096


@dataclass
class DataSet:
    """Rows (ids 0..n-1) and held-out queries, with the exact top-K of each query."""

    name: str
    metric: str
    vectors: np.ndarray
    queries: np.ndarray
    truth: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return len(self.vectors)

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def exact(self) -> np.ndarray:
        """The exact top-K ids of every query: faiss IndexFlat over every row (computed once)."""
        if self.truth is None:
            flat = faiss.IndexFlat(self.dim, METRICS[self.metric])
            flat.add(self.vectors)
            _, self.truth = flat.search(self.queries, K)
        return self.truth


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of |found ∩ truth| / K (ids; -1 never matches)."""
    hits = sum(len(set(f) & set(t)) for f, t in zip(found.tolist(), truth.tolist()))
    return hits / truth.size


def gaussian(rows: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, dim), dtype=np.float32)


def random_set(rows: int, dim: int, queries: int) -> DataSet:
    return DataSet(f"random {rows:,} x {dim}", "l2", gaussian(rows, dim, 1), gaussian(queries, dim, 2))


def debian_set(cache: Path, queries: int, limit: int | None = None) -> DataSet:
    """The Debian descriptions' embeddings (from ``cache`` when it exists), the last ``queries`` held out."""
    if cache.exists():
        vectors = np.load(cache)
    else:
        vectors = embed_debian()
        np.save(cache, vectors)
    if limit is not None:
        vectors = vectors[:limit]
    if len(vectors) <= queries:
        raise ValueError(f"{len(vectors)} documents: too few to hold out {queries} queries")
    return DataSet(f"debian {len(vectors) - queries:,} x {vectors.shape[1]}", "ip",
                   np.ascontiguousarray(vectors[:-queries]), np.ascontiguousarray(vectors[-queries:]))


def embed_debian() -> np.ndarray:
    """One unit vector per package ``apt-cache dumpavail`` lists, in its order."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import embedtext  # examples/embedtext.py: the example's model, text and documents

    started = time.perf_counter()
    model = embedtext.load_model()
    texts = [doc.text for doc in embedtext.debian_docs()]
    parts = [embedtext.embed(model, texts[i:i + EMBED_BATCH]) for i in range(0, len(texts), EMBED_BATCH)]
    print(f"embedded {len(texts):,} Debian descriptions in {time.perf_counter() - started:.0f} s",
          file=sys.stderr, flush=True)
    return np.concatenate(parts)


def nlist_for(rows: int) -> int:
    """The power of two nearest (in ratio) to 4·sqrt(rows), faiss's usual rule for IVF lists."""
    return int(2 ** round(math.log2(4 * math.sqrt(rows))))


def pq_m(dim: int) -> int:
    """PQ sub-quantizers: 8 dimensions each (dim must be a multiple of 8)."""
    return dim // 8
