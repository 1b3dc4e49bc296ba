"""A shard's journal: one record per appended batch (shard.py appends them).

The journal's kind is ``SMSJ``; its metadata is ``{collection, shard, dim,
uuid}`` (plus a rewritten shard's lineage: lineage.py) and each record body
is::

    0   8   first_row
    8   8   count
    16  4   crc32c of the batch's vector bytes
    20  4   crc32c of the batch's id bytes

All records have the same size, so a sealed journal's last record is found
without a walk (``last_record``).
"""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import numpy as np

from common.journal import Journal
from common.journal.errors import FormatError
from common.journal.record import RECORD_HEADER_SIZE, align_up
from common.journal.scan import RecordChunk

from .rows import RowFile

JOURNAL_KIND = b"SMSJ"
BATCH = struct.Struct("<QQII")


def pack(first: int, vectors: np.ndarray, ids: np.ndarray) -> bytes:
    """The record of a batch of rows from ``first`` (checked float32 vectors, int64 ids)."""
    return BATCH.pack(first, len(ids), crc32c.crc32c(vectors.data.cast("B")), crc32c.crc32c(ids.data.cast("B")))


def unpack(body: bytes | memoryview, path: Path, offset: int) -> tuple[int, int, int, int]:
    """(first_row, count, vectors crc, ids crc) of the batch record at
    ``offset``; FormatError if the body is not one."""
    if len(body) != BATCH.size:
        raise FormatError(path, offset, f"a record of {len(body)} bytes is not a {BATCH.size}-byte batch record")
    first, count, vectors_crc, ids_crc = BATCH.unpack(body)
    return first, count, vectors_crc, ids_crc


def intact(vectors: RowFile, ids: RowFile, first: int, count: int, vectors_crc: int, ids_crc: int) -> bool:
    """Whether the row files hold the batch's rows, matching its checksums."""
    if min(vectors.rows_fitting(), ids.rows_fitting()) < first + count:
        return False
    return (crc32c.crc32c(vectors.rows(first + count)[first:].data.cast("B")) == vectors_crc
            and crc32c.crc32c(ids.rows(first + count)[first:].data.cast("B")) == ids_crc)


def last_record(journal: Journal) -> bytes:
    """The body of a sealed journal's last batch record, in O(1): every
    record has the same size, so it ends the journal; its checksum is
    verified (no walk of the record chain)."""
    offset = journal.end - align_up(RECORD_HEADER_SIZE + BATCH.size, journal.alignment)
    chunk = RecordChunk(np.array([offset], dtype=np.int64), np.zeros(1, dtype=np.uint32),
                        np.array([BATCH.size], dtype=np.int64), np.zeros(1, dtype=bool), 0)
    return bytes(journal.bodies(chunk)[0])
