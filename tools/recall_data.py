"""The data sets of tools/bench_recall.py, their exact answers and recall.

``debian``: one wordllama 256-d unit vector per Debian package description
(``apt-cache dumpavail``, embedded as examples/embedtext.py does), cached as
a .npy so that reruns skip the embedding; the last ``queries`` documents are
held out as queries (never in the collection). Metric ip.
``random``: Gaussian float32 rows and queries drawn apart. Metric l2.
``clustered`` (the large set's default): rows with the structure real
embeddings have (clusters; a low intrinsic dimension), which i.i.d.
Gaussian rows lack (their nearest neighbours are barely nearer than the
rest, the worst case of every approximate index): see :class:`Clustered`.
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


@dataclass(frozen=True)
class Clustered:
    """A Gaussian mixture in a low-dimensional latent space, mapped to ``dim``.

    ``COMPONENTS`` centres drawn N(0, 1) in ``LATENT`` dimensions; a row is a
    centre plus N(0, ``SPREAD``²) per latent coordinate, times a fixed random
    LATENT x dim matrix (columns scaled by 1/sqrt(LATENT)), plus N(0, ``NOISE``²)
    per output coordinate. Chosen so that IVF behaves as on SIFT-like data:
    at 500,000 x 128, IVF2048,Flat gave recall@10 0.85 at nprobe 8, 0.97 at
    16 and 0.99 at 32 (faiss directly). Rows come chunk by chunk from their
    own seeds: the same rows in every run without holding them all.
    """

    dim: int
    LATENT = 48
    COMPONENTS = 100
    SPREAD = 1.0
    NOISE = 0.05

    def rows(self, count: int, seed: object) -> np.ndarray:
        shape = np.random.default_rng(7)
        centres = shape.standard_normal((self.COMPONENTS, self.LATENT), dtype=np.float32)
        mapping = shape.standard_normal((self.LATENT, self.dim), dtype=np.float32) / np.float32(math.sqrt(self.LATENT))
        rng = np.random.default_rng(seed)  # type: ignore[arg-type]
        latent = centres[rng.integers(0, self.COMPONENTS, count)]
        latent += np.float32(self.SPREAD) * rng.standard_normal((count, self.LATENT), dtype=np.float32)
        out = latent @ mapping
        out += np.float32(self.NOISE) * rng.standard_normal((count, self.dim), dtype=np.float32)
        return out


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
