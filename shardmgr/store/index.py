"""Approximate per-shard indexes, chosen as faiss users already write them.

A collection's ``index`` says how its sealed shards are searched:

* ``flat`` (default): exact, on the shard's vectors file in place. The rows
  are an IndexFlat's storage already, so nothing is built or copied.
* ``hnsw``: a faiss ``IndexHNSWFlat`` of ``hnsw_m`` links (StoreConfig),
  efConstruction 64 (the project's first index kind; kept as it was).
* any faiss ``index_factory`` string: ``"HNSW32"``, ``"IVF1024,Flat"``,
  ``"IVF4096,PQ32"``, ``"OPQ32,IVF4096,PQ32"``, ``"IVF1024,SQ8"``... checked
  when the collection is created (faiss must accept it for the dimension
  and metric).

Each sealed shard's index is built in the background after the shard is
sealed (or rewritten), trained first if the index kind needs it, on the
shard's own rows (an even sample of at most ``index_train_rows``). A shard
with fewer rows than its index kind needs to train well (:func:`min_rows`:
39 per IVF list, 39 × 256 for product or scalar quantizers, as faiss's own
k-means advises) is searched exactly instead: at that size exact search is
cheap. Until its index exists, a shard is searched exactly; the growing
shard always is. Deleted rows are excluded inside the index's search (an
IDSelector in the search parameters), and a query the index answers with
fewer than k live rows (an IVF list of fewer than k rows at a low nprobe;
a graph whose neighbourhoods are deleted) is searched again through the
index at twice the breadth (``widened``), then exactly over that shard if
it is still short.

Persisted beside the shard as ``index.faiss`` with ``index.meta``: a journal
(kind ``SMIX``) with no records whose checksummed metadata is ``{type, rows,
bytes, crc, m, ef_construction, shard}``: the index string, the shard's row
count, the index file's size and crc32c when it was built, and the shard's
uuid. On open all of them must match (else the index is rebuilt, so an
index moved to another shard, or built for another index string, is never
used); ``shardmgr verify`` checks the same.

Per query, search takes ``nprobe`` (IVF lists visited; default 1, faiss's)
and ``efSearch`` (HNSW breadth; default ``hnsw_ef_search``, at least k);
a parameter the shard's index kind does not have is ignored.

Threads: built on the store's index thread from immutable sealed rows;
installed under the store's write lock; searched by any thread with its
own parameters (the index itself is never changed by a search).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import crc32c
import faiss
import msgpack
import numpy as np

from common.errors import CommonError
from common.journal import Journal
from common.journal.filesystem import fsync_dir
from shardmgr.errors import BadVectors

from . import layout, metadata
from .knn import METRICS

log = logging.getLogger(__name__)

META_KIND = b"SMIX"
EF_CONSTRUCTION = 64
EXACT, LEGACY_HNSW = "flat", "hnsw"
TRAIN_PER_CENTROID = 39
"""Training rows per k-means centroid below which faiss warns (and we search exactly)."""
SEARCH_PARAMS = {"nprobe": (1, 1 << 20), "efSearch": (1, 1 << 20)}
"""Per-query search parameters and their allowed ranges."""
HNSW_WIDEST = 1024
"""The widest efSearch a short answer is searched again with before the exact search (widened)."""
HNSW_SPARSE = 64
"""An HNSW shard with fewer than 1/HNSW_SPARSE of its rows live searches short answers exactly at once (widened)."""


def check_spec(spec: Any, dim: int, metric: str) -> str:
    """``spec`` if it names an index kind for this dimension and metric; else BadVectors."""
    if spec in (EXACT, LEGACY_HNSW):
        return str(spec)
    if not isinstance(spec, str) or not spec or len(spec) > 256:
        raise BadVectors(f"index must be 'flat', 'hnsw' or a faiss index_factory string, got {spec!r}")
    try:
        made = faiss.index_factory(dim, spec, METRICS[metric])
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else "refused"
        raise BadVectors(f"index {spec!r}: faiss's index_factory refuses it for dim {dim}: {reason}") from None
    if not _takes_params(made):
        raise BadVectors(f"index {spec!r}: a {type(made).__name__} cannot skip deleted rows during a search "
                         f"(faiss search parameters); use an IVF, HNSW, flat or scalar-quantizer index, "
                         f"optionally behind a PCA or OPQ transform")
    return spec


def _takes_params(index: faiss.Index) -> bool:
    """Whether faiss searches ``index`` with SearchParameters (a selector of live rows, nprobe, efSearch):
    faiss refuses them for PQ, LSH, additive quantizers, NSG, refinement and fast-scan flat codes."""
    if isinstance(index, faiss.IndexPreTransform):
        return _takes_params(faiss.downcast_index(index.index))
    return isinstance(index, (faiss.IndexIVF, faiss.IndexHNSW, faiss.IndexFlat, faiss.IndexScalarQuantizer))


def min_rows(spec: str, dim: int, metric: str) -> int:
    """Rows a shard needs before this index kind is built for it (else it is searched exactly)."""
    if spec in (EXACT, LEGACY_HNSW):
        return 1
    made = faiss.index_factory(dim, spec, METRICS[metric])
    if made.is_trained:
        return 1
    # product and scalar quantizers train 256 codes per sub-quantizer
    need = TRAIN_PER_CENTROID * 256 if "PQ" in spec or "SQ" in spec else 1
    with contextlib.suppress(RuntimeError):  # RuntimeError: not an IVF index
        need = max(need, TRAIN_PER_CENTROID * faiss.extract_index_ivf(made).nlist)
    return need


def build(vectors: np.ndarray, metric: str, spec: str, m: int, train_rows: int) -> faiss.Index:
    """The index of ``spec`` over ``vectors``, trained on an even sample of at most ``train_rows`` of them."""
    if spec == LEGACY_HNSW:
        graph = faiss.IndexHNSWFlat(vectors.shape[1], m, METRICS[metric])
        graph.hnsw.efConstruction = EF_CONSTRUCTION
        index: faiss.Index = graph
    else:
        index = faiss.index_factory(vectors.shape[1], spec, METRICS[metric])
        _no_polysemous_training(index)
    if not index.is_trained:
        step = max(1, len(vectors) // train_rows)
        index.train(np.ascontiguousarray(vectors[::step][:train_rows]))
    index.add(vectors)
    return index


def _no_polysemous_training(index: faiss.Index) -> None:
    """index_factory turns on polysemous training for IVF-PQ, which search
    never uses here (no Hamming threshold is set) and which costs minutes
    per shard: off."""
    with contextlib.suppress(RuntimeError):  # RuntimeError: not an IVF index
        ivf = faiss.downcast_index(faiss.extract_index_ivf(index))
        if hasattr(ivf, "do_polysemous_training"):
            ivf.do_polysemous_training = False


def search_params(index: faiss.Index, params: Mapping[str, int], k: int, ef_default: int,
                  selector: faiss.IDSelector | None) -> Any:
    """Search parameters for ``index`` (a faiss SearchParameters of its kind):
    ``nprobe`` for IVF, ``efSearch`` for HNSW (at least k), the selector of
    live rows, through a pre-transform (OPQ, PCA) to the index it wraps."""
    if isinstance(index, faiss.IndexPreTransform):
        wrapper: Any = faiss.SearchParametersPreTransform()
        inner = search_params(faiss.downcast_index(index.index), params, k, ef_default, selector)
        wrapper.index_params = inner
        wrapper.referenced_objects = [inner]  # the C++ side holds a bare pointer: keep the object alive
        return wrapper
    if isinstance(index, faiss.IndexIVF):
        made: Any = faiss.SearchParametersIVF()
        made.nprobe = int(params.get("nprobe", index.nprobe))
    elif isinstance(index, faiss.IndexHNSW):
        # faiss's own type stubs lack SearchParametersHNSW; the class exists (faiss >= 1.7.3)
        made = faiss.SearchParametersHNSW(efSearch=max(int(params.get("efSearch", ef_default)), k))  # type: ignore[attr-defined]
    else:
        made = faiss.SearchParameters()
    if selector is not None:
        made.sel = selector
    return made


def widened(index: faiss.Index, params: Mapping[str, int], k: int, ef_default: int,
            live: int) -> dict[str, int] | None:
    """``params`` with the index's search breadth doubled, for queries it
    answered with fewer rows than it should (searcher.py), or None where an
    exact search of them is expected to cost less (measured: docs/benchmarks.md,
    issue 24). IVF: ``nprobe`` doubled while it stays within an eighth of
    the lists. HNSW: ``efSearch`` (at least k) doubled up to
    ``HNSW_WIDEST``, unless fewer than 1/``HNSW_SPARSE`` of the index's
    rows are ``live``: a graph that is nearly all deleted costs more to
    walk wider than a scan of the shard. Other kinds have no breadth: None."""
    while isinstance(index, faiss.IndexPreTransform):
        index = faiss.downcast_index(index.index)
    if isinstance(index, faiss.IndexIVF):
        nprobe = 2 * int(params.get("nprobe", index.nprobe))
        return {**params, "nprobe": nprobe} if nprobe <= index.nlist // 8 else None
    if isinstance(index, faiss.IndexHNSW):
        ef = 2 * max(int(params.get("efSearch", ef_default)), k)
        return {**params, "efSearch": ef} if ef <= HNSW_WIDEST and live * HNSW_SPARSE >= index.ntotal else None
    return None


def check_params(value: Any) -> dict[str, int]:
    """Per-query search parameters (a map of SEARCH_PARAMS names to ints); else BadVectors."""
    if value is None:
        return {}
    if not isinstance(value, Mapping) or set(value) - set(SEARCH_PARAMS):
        raise BadVectors(f"search params must be a map of {', '.join(SEARCH_PARAMS)}, got {value!r}")
    for name, number in value.items():
        low, high = SEARCH_PARAMS[name]
        if not isinstance(number, (int, np.integer)) or isinstance(number, bool) or not low <= number <= high:
            raise BadVectors(f"search param {name} must be an integer in {low}..{high}, got {number!r}")
    return {name: int(number) for name, number in value.items()}


def save(directory: Path, index: faiss.Index, rows: int, spec: str, m: int, shard_uuid: bytes) -> None:
    """Write the index (temporary file, fsync, rename), then its metadata."""
    tmp = directory / (layout.INDEX + ".tmp")
    faiss.write_index(index, str(tmp))
    with open(tmp, "rb") as f:
        data = f.read()
        os.fsync(f.fileno())
    os.replace(tmp, directory / layout.INDEX)
    (directory / layout.INDEX_META).unlink(missing_ok=True)
    meta = msgpack.packb({"type": spec, "rows": rows, "bytes": len(data), "crc": crc32c.crc32c(data), "m": m,
                          "ef_construction": EF_CONSTRUCTION, "shard": shard_uuid})
    Journal.write_empty(directory / layout.INDEX_META, kind=META_KIND, metadata=meta)
    fsync_dir(directory)


def load(directory: Path, rows: int, spec: str, shard_uuid: bytes) -> faiss.Index | None:
    """The persisted index if it matches the shard (its uuid, rows, the
    index string, the file's size and checksum); else None."""
    try:
        with Journal.open(directory / layout.INDEX_META, kind=META_KIND, writable=False) as journal:
            meta = metadata.decode(journal.metadata, journal.path, {"rows": int, "bytes": int, "crc": int})
        data = (directory / layout.INDEX).read_bytes()  # faiss reads it whole anyway: check it on the way
        if meta.get("shard") != shard_uuid or meta["rows"] != rows or meta.get("type") != spec \
                or len(data) != meta["bytes"] or crc32c.crc32c(data) != meta["crc"]:
            log.warning("%s: index %r built for %s rows / %s bytes does not match the shard (%d rows, index %r) "
                        "or its checksum; rebuilding", directory, meta.get("type"), meta["rows"], meta["bytes"],
                        rows, spec)
            return None
        loaded: faiss.Index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        return loaded
    except FileNotFoundError:
        return None
    except (OSError, CommonError, RuntimeError) as exc:  # FormatError, or faiss refusing the file: rebuilt
        log.warning("%s: index unusable (%s); rebuilding", directory, exc)
        return None
