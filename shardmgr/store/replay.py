"""Replay: a shard's row files checked against its journal, batch by batch.

Opening a mid-build shard replays it (shard.py): every batch's vector rows
must match the crc32c in its record, and its ids the record's ids (version
2, batch_record.py) or the crc32c of its id bytes (version 1). The first
batch whose rows fail ends what survives (a crash can leave a record whose
rows never reached the disk): it and every later batch are dropped, unless
a flush had confirmed it (then durable data is damaged: CorruptJournal).

A version 2 batch whose ids the ids file lacks is *kept*: the ids file is
derived data, synced only when the shard is sealed or closed (a power cut
can take any part of it written since), and the record holds the ids. Its
rows of the ids file are rewritten from the record (``rewrite_ids``). A
version 1 batch whose ids fail is dropped like one whose vectors fail: its
ids exist nowhere else (and its ids file was synced in every flush).

``replay`` only reads; the caller rewrites, from its writable open.
Threads: the opener's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

from common.journal import Journal
from common.journal.errors import CorruptJournal, FormatError

from . import layout, metadata
from .batch_record import JOURNAL_KIND, V1, V2, Batch, ids_intact, last_batch, unpack, vectors_intact, version_of
from .rows import RowFile
from .shard_files import open_row_file

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Replayed:
    """What a replay found."""

    rows: int  # rows of the complete batches
    cut: int | None  # journal offset of the first batch to drop; None: every batch is complete
    stale: tuple[Batch, ...]  # kept version 2 batches whose ids the ids file does not hold


def replay(journal: Journal, vectors: RowFile, ids: RowFile, version: int) -> Replayed:
    """Check every batch of ``journal`` (opened read-only, recovered)
    against the row files. FormatError if the batches do not follow each
    other, CorruptJournal if rows of a batch a flush confirmed fail."""
    durable_end = journal.recovery.checkpoint.end if journal.recovery else 0
    rows, stale = 0, list[Batch]()
    for record in journal.records():
        batch = unpack(record.body, version, journal.path, record.offset)
        if batch.first != rows:
            raise FormatError(journal.path, record.offset, f"the batch starts at row {batch.first}, expected {rows}")
        ids_ok = ids_intact(ids, batch)
        if not vectors_intact(vectors, batch) or (batch.ids is None and not ids_ok):
            if record.offset < durable_end:
                raise CorruptJournal(journal.path, record.offset, f"rows {batch.first}..{batch.end} of a durable "
                                     "batch fail their checksums")
            log.warning("%s: dropping rows %d.. (a batch whose rows never reached the disk)", journal.path,
                        batch.first)
            return Replayed(rows, record.offset, tuple(stale))
        if not ids_ok:
            stale.append(batch)
        rows = batch.end
    return Replayed(rows, None, tuple(stale))


def stale_ids(journal: Journal, ids: RowFile) -> list[Batch]:
    """The batches of a version 2 shard's journal whose ids the ids file
    does not hold (every record is read)."""
    batches = (unpack(r.body, V2, journal.path, r.offset) for r in journal.records())
    return [batch for batch in batches if not ids_intact(ids, batch)]


def rewrite_ids(ids: RowFile, stale: Sequence[Batch]) -> int:
    """Write the ids of version 2 batches into the ids file (opened
    writable); returns the rows written. The caller makes it durable."""
    for batch in stale:
        assert batch.ids is not None, "a version 1 batch's ids exist only in its ids file"
        ids.write(batch.first, batch.ids)
    rows = sum(batch.count for batch in stale)
    if rows:
        log.warning("%s: the ids of %d batches (%d rows) were missing or different; rewritten from the journal",
                    ids.path, len(stale), rows)
    return rows


def rebuild_ids(directory: Path, journal: Journal, uid: bytes, rows: int) -> int:
    """Make a sealed version 2 shard's ids file hold exactly its ``rows``
    ids, rewritten from ``journal`` (open read-only) where they differ,
    durably; returns the rows rewritten. The ids file is opened writable
    for this alone."""
    ids = open_row_file(directory, layout.IDS, uid, 1, writable=True)
    try:
        written = rewrite_ids(ids, stale_ids(journal, ids))
        ids.truncate(rows)
        ids.sync()
        return written
    finally:
        ids.close()


def repair_ids(directory: Path) -> int | None:
    """Rewrite a sealed version 2 shard's ids file from its journal where
    they differ (``verify --repair``); returns the rows rewritten, or None
    for a shard that is not one (a growing shard's replay does it at its
    next open; a version 1 shard's ids exist only in its ids file)."""
    with Journal.open(directory / layout.JOURNAL, kind=JOURNAL_KIND, writable=False, recount=False) as journal:
        meta = metadata.decode(journal.metadata, journal.path, {"uuid": bytes})
        version = version_of(meta, journal.path)
        if not journal.sealed or version == V1:
            return None
        last = last_batch(journal, version)
        return rebuild_ids(directory, journal, bytes(meta["uuid"]), last.end if last is not None else 0)
