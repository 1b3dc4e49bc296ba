"""Approximate per-shard indexes (faiss HNSW), built after sealing.

A collection's ``index`` setting says how sealed shards are searched:

* ``flat`` (default): exact, on the shard's vectors file in place. The rows
  are an IndexFlat's storage already, so nothing is built or copied.
* ``hnsw``: a faiss ``IndexHNSWFlat`` per sealed shard, built in the
  background after the shard is sealed and persisted beside it as
  ``index.faiss`` with ``index.meta``. Until it exists, the shard is
  searched exactly. Recall is measured by tools/bench_shards.py.

``index.meta`` is a journal (kind ``SMIX``) with no records whose
checksummed metadata is ``{type, rows, bytes, crc, m, ef_construction,
shard}``: the shard's row count, the index file's size and crc32c when it was
built, and the shard's uuid. On open all of them must match (else the index
is rebuilt, so an index moved to another shard is never used);
``shardmgr verify`` checks the same.

Threads: built on the store's index thread from immutable sealed rows;
installed under the store's write lock.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import crc32c
import faiss
import msgpack
import numpy as np

from common.errors import CommonError
from common.journal import Journal
from common.journal.filesystem import fsync_dir

from . import metadata
from .search import METRICS

log = logging.getLogger(__name__)

META_KIND = b"SMIX"
INDEX_FILE = "index.faiss"
META_FILE = "index.meta"
EF_CONSTRUCTION = 64


def build(vectors: np.ndarray, metric: str, m: int) -> faiss.Index:
    index = faiss.IndexHNSWFlat(vectors.shape[1], m, METRICS[metric])
    index.hnsw.efConstruction = EF_CONSTRUCTION
    index.add(vectors)
    return index


def save(directory: Path, index: faiss.Index, rows: int, m: int, shard_uuid: bytes) -> None:
    """Write the index (temporary file, fsync, rename), then its metadata."""
    tmp = directory / (INDEX_FILE + ".tmp")
    faiss.write_index(index, str(tmp))
    with open(tmp, "rb") as f:
        data = f.read()
        os.fsync(f.fileno())
    os.replace(tmp, directory / INDEX_FILE)
    (directory / META_FILE).unlink(missing_ok=True)
    meta = msgpack.packb({"type": "hnsw", "rows": rows, "bytes": len(data), "crc": crc32c.crc32c(data), "m": m,
                          "ef_construction": EF_CONSTRUCTION, "shard": shard_uuid})
    Journal.write_empty(directory / META_FILE, kind=META_KIND, metadata=meta)
    fsync_dir(directory)


def load(directory: Path, rows: int, shard_uuid: bytes) -> faiss.Index | None:
    """The persisted index if it matches the shard (its uuid, rows, the
    file's size and checksum); else None."""
    try:
        with Journal.open(directory / META_FILE, kind=META_KIND, writable=False) as journal:
            meta = metadata.decode(journal.metadata, journal.path, {"rows": int, "bytes": int, "crc": int})
        data = (directory / INDEX_FILE).read_bytes()  # faiss reads it whole anyway: check it on the way
        if meta.get("shard") != shard_uuid or meta["rows"] != rows or len(data) != meta["bytes"] \
                or crc32c.crc32c(data) != meta["crc"]:
            log.warning("%s: index built for %s rows / %s bytes does not match the shard (%d rows) or its "
                        "checksum; rebuilding", directory, meta["rows"], meta["bytes"], rows)
            return None
        return faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
    except FileNotFoundError:
        return None
    except (OSError, CommonError, RuntimeError) as exc:  # FormatError, or faiss refusing the file: rebuilt
        log.warning("%s: index unusable (%s); rebuilding", directory, exc)
        return None
