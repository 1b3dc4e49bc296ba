"""A shard's deleted rows and the journal that records them.

On disk, ``<shard>/deletes``: a journal (kind ``SMDL``) created at the
shard's first delete. Its metadata is ``{shard, uuid}`` (the uuid of the
shard's other files); each record body is::

    0   8*n   the deleted row numbers of this shard, int64 little-endian,
              ascending and unique, each one a row the shard held when it
              was written; none of them deleted by an earlier record

so a record is one delete call's rows in this shard, checksummed by the
journal layer and group-committed by the shared flusher like an append. A
deleted row is never undeleted: the set only grows, until the shard is
rewritten without it.

At open the records are read (a torn tail is cut by the journal's recovery)
and become the in-memory set: a bool mask over the shard's rows. A record
may name rows past the shard's recovered rows (a crash can keep a delete's
record and lose, in the same flush round, the batch that held the rows):
those rows never existed durably and are ignored; any other malformed body
is damage (ShardDamaged, the shard is quarantined).

Threads: ``add`` under the store's write lock; readers use the immutable
bitmap of a published view (``bitmap``).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import faiss
import msgpack
import numpy as np

from common.journal import Flusher, Journal, JournalConfig, Ticket
from common.journal.errors import FormatError

from . import layout, metadata

log = logging.getLogger(__name__)

KIND = b"SMDL"
ROW = np.dtype("<i8")
CONFIG = JournalConfig(extent_bytes=64 << 10, preallocate="zero")
"""Deletes are small and rare next to appends: the file grows in 64 KiB steps."""


class DeleteLog:
    """One shard's deleted rows: a mask in memory, a journal on disk (created at the first delete)."""

    def __init__(self, directory: Path, shard_id: int, uuid: bytes, flusher: Flusher | None,
                 journal: Journal | None, mask: np.ndarray) -> None:
        self.directory = directory
        self.shard_id = shard_id
        self.uuid = uuid
        self.flusher = flusher
        self.journal = journal
        self.mask = mask  # bool [rows known so far]; replaced, never mutated (views share it)
        self.count = int(np.count_nonzero(mask))
        self.keep = selector(mask) if self.count else None  # made once per mask, not per search
        self.last: Ticket | None = None  # the newest record's ticket: a repeated delete waits for it too
        self.past = False  # the log names rows past the shard's (ignored; the shard must not grow again)

    @classmethod
    def open(cls, directory: Path, shard_id: int, uuid: bytes, rows: int, flusher: Flusher | None) -> DeleteLog:
        """The shard's deletes (none if it has no ``deletes`` file).
        ``flusher`` None opens read-only; else the journal stays open for
        appends. FormatError for a file that is not this shard's delete log."""
        path = directory / layout.DELETES
        if not path.exists():
            return cls(directory, shard_id, uuid, flusher, None, np.zeros(0, dtype=bool))
        journal = Journal.open(path, kind=KIND, flusher=flusher, writable=flusher is not None, config=CONFIG)
        try:
            meta = metadata.decode(journal.metadata, path, {"shard": int, "uuid": bytes})
            if meta["shard"] != shard_id or bytes(meta["uuid"]) != uuid:
                raise FormatError(path, 0, f"a delete log of shard {meta['shard']} ({bytes(meta['uuid']).hex()}), "
                                  f"not of shard {shard_id} ({uuid.hex()})")
            mask, past = np.zeros(rows, dtype=bool), False
            for record in journal.records():
                deleted = rows_of(record.body, path, record.offset)
                mask[deleted[deleted < rows]] = True
                past = past or bool(deleted[-1] >= rows)
            if past:
                log.warning("%s: a delete names rows past the shard's %d recovered rows (lost with their batch "
                            "in a crash): ignored", path, rows)
        except BaseException:
            journal.close()
            raise
        log_ = cls(directory, shard_id, uuid, flusher, journal if flusher is not None else None, mask)
        if flusher is None:  # read-only: nothing more to read
            journal.close()
        log_.past = past
        return log_

    def add(self, rows: np.ndarray, shard_rows: int) -> tuple[int, Ticket | None]:
        """Delete ``rows`` (each < ``shard_rows``, checked by the caller); rows
        already deleted are skipped. Returns (rows newly deleted, the ticket
        that says when all of ``rows`` are durably deleted: this call's
        record, or if it wrote none the newest one, since a row deleted
        before may still wait for its flush; None if the log is empty)."""
        mask = self.mask
        if len(mask) < shard_rows:
            mask = np.concatenate([mask, np.zeros(shard_rows - len(mask), dtype=bool)])
        fresh = np.unique(rows)
        fresh = fresh[~mask[fresh]]
        if not len(fresh):
            return 0, self.last
        if self.journal is None:
            self.journal = self._create()
        _, ticket = self.journal.append(fresh.astype(ROW, copy=False).tobytes())
        self.last = ticket
        mask = mask.copy() if mask is self.mask else mask
        mask[fresh] = True
        self.mask = mask
        self.count += len(fresh)
        self.keep = selector(mask)
        return len(fresh), ticket

    def _create(self) -> Journal:
        if self.flusher is None:
            raise ValueError(f"{self.directory}: deleting needs a writable shard")
        meta = msgpack.packb({"shard": self.shard_id, "uuid": self.uuid})
        return Journal.create(self.directory / layout.DELETES, kind=KIND, flusher=self.flusher, metadata=meta,
                              config=CONFIG)

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()

    def abandon(self) -> None:
        """Release the file without a further flush (crash tests)."""
        if self.journal is not None:
            self.journal.abandon()


def rows_of(body: bytes | memoryview, path: Path, offset: int) -> np.ndarray:
    """The rows of one delete record; FormatError if the body is not one."""
    if len(body) % ROW.itemsize or not len(body):
        raise FormatError(path, offset, f"a delete record of {len(body)} bytes is not a whole number of "
                          f"{ROW.itemsize}-byte rows")
    rows = np.frombuffer(body, dtype=ROW)
    if rows[0] < 0 or (len(rows) > 1 and not (np.diff(rows) > 0).all()):
        raise FormatError(path, offset, "a delete record's rows are not ascending, unique and non-negative")
    return rows


def over(mask: np.ndarray, rows: int) -> np.ndarray:
    """A deleted mask over exactly ``rows`` rows (rows past its end are live)."""
    return mask[:rows] if len(mask) >= rows else np.concatenate([mask, np.zeros(rows - len(mask), dtype=bool)])


@dataclasses.dataclass(frozen=True, slots=True)
class Selector:
    """A faiss selector of the rows *not* deleted (rows past the mask's end
    are selected), with the objects it points into, which must outlive it."""

    selector: faiss.IDSelector
    bitmap: faiss.IDSelectorBitmap
    bits: np.ndarray


def selector(mask: np.ndarray) -> Selector:
    bits = np.packbits(mask, bitorder="little")
    bitmap = faiss.IDSelectorBitmap(len(bits), faiss.swig_ptr(bits))  # n counts bytes: ids below 8n are looked up
    return Selector(faiss.IDSelectorNot(bitmap), bitmap, bits)
