"""A shard's journal: one record per appended batch (shard.py appends them).

The journal's kind is ``SMSJ``, its alignment 8; its metadata is
``{collection, shard, dim, uuid, records}`` (plus a rewritten shard's
lineage: lineage.py), where ``records`` is the version of its batch
records. A shard's records all have one version: a journal without
``records`` (written before version 2) has version 1 records.

**Version 2** (every shard written now). The record carries the batch's
ids, so the ids file is derived data: it is written with every append but
synced only when the shard is sealed or closed, and replay rewrites from the
records whatever part of it a crash lost (docs/durability.md). A body is
``8 * n + 24`` bytes for a batch of ``n >= 1`` rows::

    0         8n  ids         int64, one per row, in row order
    8n        8   first_row   the batch's first row
    8n + 8    8   count       n
    8n + 16   4   vectors     crc32c of the batch's vector bytes
    8n + 20   4   version     2

The fixed fields come last: bodies are multiples of 8 bytes and the journal
is 8-aligned, so the last record of a sealed journal ends at the journal's
end, and its trailer says where it starts (``last_batch`` needs no walk).

**Version 1** (read only: shards written before; a growing one is sealed
when it is opened, so none is appended to again). A body is 24 bytes::

    0   8   first_row
    8   8   count
    16  4   crc32c of the batch's vector bytes
    20  4   crc32c of the batch's id bytes (the ids file is authoritative)
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import crc32c
import numpy as np

from common.journal import Journal
from common.journal.errors import FormatError
from common.journal.header import HEADER_SIZE, METADATA_OFFSET
from common.journal.record import LENGTH_MASK, RECORD_HEADER_SIZE, align_up
from common.journal.scan import RecordChunk

from .rows import RowFile

JOURNAL_KIND = b"SMSJ"
ALIGNMENT = 8
"""Every shard journal's record alignment (version 2 relies on it: see above)."""
VERSION_KEY = "records"
"""The journal metadata field naming the version of its batch records."""
V1, V2 = 1, 2
VERSION = V2
"""The version of every shard written now."""
V1_RECORD = struct.Struct("<QQII")  # first_row, count, vectors crc, ids crc
V2_TRAILER = struct.Struct("<QQII")  # first_row, count, vectors crc, version (after the ids)
ID = np.dtype("<i8")
MAX_RECORD_BYTES = LENGTH_MASK
"""A shard journal's largest record body: the journal layer's limit (its header stores it)."""
MAX_ROWS = (MAX_RECORD_BYTES - V2_TRAILER.size) // ID.itemsize
"""The most rows one batch record can carry (33,554,428): the bound of ``max_batch_rows``."""


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """One batch record, decoded."""

    first: int
    count: int
    vectors_crc: int
    ids_crc: int | None  # version 1: the crc32c of the id bytes in the ids file
    ids: np.ndarray | None  # version 2: the ids themselves, int64 [count] (a read-only view of the body)

    @property
    def end(self) -> int:
        """The row after the batch's last."""
        return self.first + self.count


def version_of(meta: Mapping[str, Any], path: Path) -> int:
    """The batch record version a shard journal's decoded metadata names."""
    version = meta.get(VERSION_KEY, V1)
    if version not in (V1, V2) or isinstance(version, bool):
        raise FormatError(path, METADATA_OFFSET, f"batch record version {version!r} is not supported")
    return int(version)


def pack(first: int, vectors: np.ndarray, ids: np.ndarray) -> bytes:
    """The version 2 record of a batch of rows from ``first`` (checked
    float32 vectors, int64 ids, at least one row)."""
    return ids.tobytes() + V2_TRAILER.pack(first, len(ids), crc32c.crc32c(vectors.data.cast("B")), V2)


def unpack(body: bytes | memoryview, version: int, path: Path, offset: int) -> Batch:
    """The batch record at ``offset``; FormatError if the body is not one of ``version``."""
    if version == V1:
        if len(body) != V1_RECORD.size:
            raise FormatError(path, offset, f"a record of {len(body)} bytes is not a {V1_RECORD.size}-byte "
                              "batch record")
        first, count, vectors_crc, ids_crc = V1_RECORD.unpack(body)
        return Batch(first, count, vectors_crc, ids_crc, None)
    size = len(body)
    if size < V2_TRAILER.size + ID.itemsize or size % ID.itemsize:
        raise FormatError(path, offset, f"a record of {size} bytes is not a version 2 batch record")
    first, count, vectors_crc, tag = V2_TRAILER.unpack_from(body, size - V2_TRAILER.size)
    if tag != V2 or count * ID.itemsize != size - V2_TRAILER.size:
        raise FormatError(path, offset, f"a record of {size} bytes saying version {tag} and {count} rows is not "
                          "a version 2 batch record")
    ids = np.frombuffer(body, dtype=ID, count=count)
    return Batch(first, count, vectors_crc, None, ids)


def last_batch(journal: Journal, version: int) -> Batch | None:
    """The last batch record of a sealed journal (None if it has none),
    checksum verified, without a walk of the record chain: version 1
    records all have one size; a version 2 record's trailer ends the
    journal and says how long the record is."""
    if not journal.count:
        return None
    if version == V1:
        size = V1_RECORD.size
        offset = journal.end - align_up(RECORD_HEADER_SIZE + size, journal.alignment)
    else:
        if journal.alignment != ALIGNMENT:
            raise FormatError(journal.path, 10, f"a shard journal must be {ALIGNMENT}-aligned, not "
                              f"{journal.alignment}")
        tail = journal.end - V2_TRAILER.size
        count = V2_TRAILER.unpack(journal.peek(tail, V2_TRAILER.size))[1]
        size = V2_TRAILER.size + count * ID.itemsize
        offset = journal.end - RECORD_HEADER_SIZE - size
        if offset < HEADER_SIZE:
            raise FormatError(journal.path, tail, f"the last batch record says {count} rows: more than the "
                              "journal holds")
    chunk = RecordChunk(np.array([offset], dtype=np.int64), np.zeros(1, dtype=np.uint32),
                        np.array([size], dtype=np.int64), np.zeros(1, dtype=bool), 0)
    return unpack(journal.bodies(chunk)[0], version, journal.path, offset)


def vectors_intact(vectors: RowFile, batch: Batch) -> bool:
    """Whether the vectors file holds the batch's rows, matching its checksum."""
    if vectors.rows_fitting() < batch.end:
        return False
    return crc32c.crc32c(vectors.rows(batch.end)[batch.first:].data.cast("B")) == batch.vectors_crc


def ids_intact(ids: RowFile, batch: Batch) -> bool:
    """Whether the ids file holds the batch's ids: its crc32c (version 1)
    or the record's ids (version 2)."""
    if ids.rows_fitting() < batch.end:
        return False
    stored = ids.rows(batch.end)[batch.first:]
    if batch.ids is None:
        return crc32c.crc32c(stored.data.cast("B")) == batch.ids_crc
    return bool(np.array_equal(stored, batch.ids))
