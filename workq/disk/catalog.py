"""The catalog: an audit record of which queue files exist, for ``verify``.

The collector deletes segments as part of normal work, so a missing file
proves nothing by itself. ``workq/catalog.wqct`` is a journal (kind
``WQCT``, never sealed) with one record per queue file ever created, and
the record's marker says what became of the file::

    0   4   kind      1 = input segment, 2 = completion-log segment
    4   4   reserved  0
    8   8   id        the segment id, or the job id
    16  8   seq       0, or the completion-log segment's sequence number

    LIVE      the file exists. Appended after the file's creation is
              durable, so a LIVE record never names a file a crash undid.
    RETIRED   collected. The tombstone is made durable before the file is
              unlinked.
    BURIED    lost or quarantined, and acknowledged by ``verify --repair``.

Verify reports a LIVE record without its file as data loss, and a file
whose record is RETIRED as a collection a crash cut short.

Recovery never obeys the catalog: every file's fate comes from the file's
own markers (workq/state/recovery.py; docs/durability.md). Recovery only
writes to it: files present that it lacks (created just before a crash, a
directory older than the catalog, or a record it wrongly calls RETIRED) get
a new LIVE record, and files recovery deletes are retired first, as the
collector does. Recovery compacts the catalog (new file, fsync, rename) to
its LIVE and BURIED records when most records are RETIRED. A damaged
catalog does not stop the queue: it is renamed aside and a new one begun
(a file lost before then goes unnoticed by verify). Two things are read
back, and both can only make a new number higher, never change what a
file holds or whether it is kept: :meth:`Catalog.segment_ids`, a floor for
the next segment id beyond what the files prove (a lost newest segment
whose items no result names), and :meth:`Catalog.next_seq`, a naming hint
so that a new completion-log segment takes a number no recorded one had
and verify can still tell a lost log segment from its successor.

Threads: under the broker's owner lock (workq/loop.py).
"""

from __future__ import annotations

import logging
import os
import struct
import time
from pathlib import Path
from typing import Final, NamedTuple

import numpy as np

from common.journal import Flusher, Journal, JournalConfig, Marker, Ticket
from common.journal.errors import CorruptJournal, FormatError
from common.journal.filesystem import fsync_dir
from common.journal.header import HEADER_SIZE

from .records import RESULTS_DIR, RESULTS_SUFFIX, SEGMENT_SUFFIX, SEGMENTS_DIR, job_dir, log_file, segment_file

log = logging.getLogger(__name__)

KIND: Final = b"WQCT"
FILE: Final = "catalog.wqct"
SEGMENT, RESULTS = 1, 2
RECORD: Final = struct.Struct("<I4xQQ")
#: Recovery compacts once dead records are this many and more than the live ones.
COMPACT_AFTER = 4096
MAX_SEGMENT: Final = 1 << 32  # handles hold a segment id in 32 bits
CONFIG: Final = JournalConfig(extent_bytes=64 << 10, max_record_bytes=RECORD.size)


class Entry(NamedTuple):
    """One queue file: (kind, id, seq)."""

    kind: int
    id: int
    seq: int = 0

    @classmethod
    def of(cls, root: Path, path: Path) -> Entry | None:
        """The entry of a queue file's path (None: not a queue file's name)."""
        parts = path.relative_to(root).parts
        try:
            if len(parts) == 2 and parts[0] == SEGMENTS_DIR and path.suffix == SEGMENT_SUFFIX:
                return cls(SEGMENT, int(path.stem))
            if len(parts) == 3 and parts[0] == RESULTS_DIR and path.suffix == RESULTS_SUFFIX and len(parts[1]) == 16:
                return cls(RESULTS, int(parts[1], 16), int(path.stem))
        except ValueError:
            pass
        return None

    def path(self, root: Path) -> Path:
        """Where the file lives under ``DATA/workq`` (root)."""
        if self.kind == SEGMENT:
            return root / SEGMENTS_DIR / segment_file(self.id)
        return root / RESULTS_DIR / job_dir(self.id) / log_file(self.seq)


def read(journal: Journal) -> dict[Entry, tuple[int, Marker]]:
    """Every entry's newest record: (offset, marker). Vectorised scan."""
    found: dict[Entry, tuple[int, Marker]] = {}
    for chunk in journal.scan():
        fields = np.stack([journal.fields(chunk, at, "<u8") for at in (0, 8, 16)], axis=1)
        kinds = fields[:, 0] & np.uint64(0xFFFFFFFF)
        for (kind, id_, seq), offset, marker in zip(np.column_stack([kinds, fields[:, 1:]]).tolist(),
                                                    chunk.offsets.tolist(), chunk.markers.tolist()):
            found[Entry(kind, id_, seq)] = (offset, Marker(marker))
    return found


class Catalog:
    """The catalog of one queue directory, open for writing."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.entries = read(journal)
        if any(e.kind not in (SEGMENT, RESULTS) or (e.kind == SEGMENT and e.id >= MAX_SEGMENT) for e in self.entries):
            raise CorruptJournal(journal.path, HEADER_SIZE, "a record of an unknown kind or a segment id past 2**32")
        self._next_seqs: dict[int, int] = {}  # job id -> above its highest completion-log seq recorded
        self._note_seqs(list(self.entries))

    @classmethod
    def open(cls, root: Path, flusher: Flusher) -> Catalog:
        """Open (or create, empty) ``root/catalog.wqct``, compacting it if
        most records are retired. A damaged catalog is renamed aside (it is
        bookkeeping: the queue starts) and a new one is begun; recovery
        then records the files present."""
        path = root / FILE
        if not path.exists():
            return cls(Journal.create(path, kind=KIND, flusher=flusher, config=CONFIG))
        try:
            catalog = cls(_open_checked(path, flusher))
        except (FormatError, CorruptJournal) as exc:
            return cls._rebuilt(path, flusher, exc)
        retired = sum(marker == Marker.RETIRED for _, marker in catalog.entries.values())
        if retired >= COMPACT_AFTER and retired > len(catalog.entries) - retired:
            catalog = catalog._compacted(flusher)
        return catalog

    @classmethod
    def _rebuilt(cls, path: Path, flusher: Flusher, exc: Exception) -> Catalog:
        """Move a damaged catalog aside (never deleted) and begin a new one."""
        stamp = time.strftime("%Y%m%dT%H%M%S")
        aside = next(a for n in range(1000) if not (a := path.with_name(f"{FILE}.damaged-{stamp}-{n}")).exists())
        log.error("workq: the catalog is damaged (%s); moved to %s and rebuilt from the files present: a queue "
                  "file lost before now goes unnoticed", exc, aside.name)
        os.rename(path, aside)
        fsync_dir(path.parent)
        return cls(Journal.create(path, kind=KIND, flusher=flusher, config=CONFIG))

    def _compacted(self, flusher: Flusher) -> Catalog:
        """A new file with the LIVE and BURIED records (losses stay
        acknowledged); renamed into place."""
        path = self.journal.path
        tmp = path.with_name(path.name + ".new")
        tmp.unlink(missing_ok=True)
        fresh = Journal.create(tmp, kind=KIND, flusher=flusher, config=CONFIG)
        for marker in (Marker.LIVE, Marker.BURIED):
            kept = [e for e, (_, m) in self.entries.items() if m == marker]
            if kept:
                fresh.append_batch([RECORD.pack(*e) for e in kept], marker)
        fresh.flush()
        fresh.close()
        self.journal.close()
        os.rename(tmp, path)
        fsync_dir(path.parent)
        return Catalog(Journal.open(path, kind=KIND, flusher=flusher, config=CONFIG))

    def add(self, entries: list[Entry]) -> Ticket | None:
        """Record files whose creation is durable (one append); entries
        already LIVE are skipped."""
        new = [e for e in entries if self.marker(e) != Marker.LIVE]
        if not new:
            return None
        appended = self.journal.append_batch([RECORD.pack(*e) for e in new])
        self._note_seqs(new)
        for entry, offset in zip(new, appended.offsets.tolist()):
            self.entries[entry] = (offset, Marker.LIVE)
        return appended.ticket

    def mark(self, entries: list[Entry], marker: Marker) -> Ticket | None:
        """Tombstone (RETIRED) or bury (BURIED) the records of ``entries``
        in place; entries without a record are skipped."""
        known = [e for e in entries if e in self.entries and self.entries[e][1] != marker]
        if not known:
            return None
        ticket = self.journal.set_markers([self.entries[e][0] for e in known], marker)
        for entry in known:
            self.entries[entry] = (self.entries[entry][0], marker)
        return ticket

    def retire_durably(self, entries: list[Entry]) -> None:
        """Tombstone ``entries`` and wait for the flush: call before unlinking
        their files. Always flushes: a tombstone set by an earlier call whose
        flush failed is in memory only, and the flush raises for a failed
        journal (so nothing is unlinked)."""
        self.mark(entries, Marker.RETIRED)
        self.journal.flush()

    def next_seq(self, job: int) -> int:
        """Above every completion-log sequence number of ``job`` the catalog
        ever recorded: a lost log segment's number is never reused."""
        return self._next_seqs.get(job, 0)

    def _note_seqs(self, entries: list[Entry]) -> None:
        for e in entries:
            if e.kind == RESULTS and e.seq + 1 > self._next_seqs.get(e.id, 0):
                self._next_seqs[e.id] = e.seq + 1

    def segment_ids(self) -> list[int]:
        """Every input segment id the catalog has a record of (created,
        collected, lost or quarantined)."""
        return [e.id for e in self.entries if e.kind == SEGMENT]

    def live(self) -> list[Entry]:
        """Entries whose files should exist."""
        return [e for e, (_, marker) in self.entries.items() if marker == Marker.LIVE]

    def marker(self, entry: Entry) -> Marker | None:
        found = self.entries.get(entry)
        return found[1] if found is not None else None

    @property
    def size(self) -> int:
        return self.journal.end - HEADER_SIZE

    def close(self) -> None:
        self.journal.close()

    def abandon(self) -> None:
        self.journal.abandon()


def _open_checked(path: Path, flusher: Flusher) -> Journal:
    """Open the catalog, every record's checksum verified: it is small, and a
    flipped bit in an id must not be believed (CorruptJournal if one fails)."""
    journal = Journal.open(path, kind=KIND, flusher=flusher, config=CONFIG)
    try:
        for chunk in journal.scan():
            bad = journal.bad_checksums(chunk)
            if len(bad):
                raise CorruptJournal(path, int(bad[0]), "a catalog record fails its checksum")
    except BaseException:
        journal.close()
        raise
    return journal

