"""The journal: an append-only file of checksummed records with state markers.

The file format is described in header.py (the first 4 KiB) and record.py
(the records). A journal is created once, appended to until it is sealed,
and read and re-marked for the rest of its life.

Durability: every write (append, marker change) returns a
:class:`~common.flusher.Ticket`. The write is durable once a flush round of
the shared :class:`~common.flusher.Flusher` covering it completes;
:meth:`Journal.wait_durable` blocks until then. Nothing is durable earlier.

The journal is its lifecycle (create, open and recover, seal, close) and
its durability (tickets, flusher steps); its three sides are layers below
it over its state, one base class each (writing.py says why): reads
(reader.py), marker changes (marking.py), appends (appending.py).

I/O: appends are one ``pwrite`` per batch (measured faster than copying into
the mapping; see docs/benchmarks.md). Reads, scans and marker changes go
through a shared memory mapping of the file, so numpy reads records in place
and a batch of marker changes is one vectorised store.

Threads: one thread at a time may write (append, set markers, seal, close);
call it the owner. Any thread may read, scan or wait. The flusher thread
syncs concurrently. ``_lock`` guards the write position, counters and the
mapping; the syncer's lock serialises fdatasync and checkpoint writes
(syncer.py) and closing the file.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from pathlib import Path

from . import filesystem
from .anchors import Anchors
from .appending import Appended, RecordAppender
from .config import JournalConfig
from .errors import CorruptJournal, FlushFailed, FormatError, JournalClosed, JournalError
from .flusher import Flusher, Ticket
from .header import HEADER_SIZE, Checkpoint, Identity, initial_header, newest, read_checkpoints
from .mapping import MappedFile
from .marker import MARKER_INDEX, Marker
from .recovery import RecoveryReport, recover
from .syncer import Syncer

log = logging.getLogger(__name__)

__all__ = ["Appended", "Journal"]


class Journal(RecordAppender):
    """One journal file. Build it with :meth:`create` or :meth:`open`."""

    def __init__(self, path: Path, fd: int, header: bytes, *, writable: bool,
                 flusher: Flusher | None, config: JournalConfig, snapshot: bool = False) -> None:
        """Private: use create() or open(). ``header`` is the file's first 4 KiB."""
        identity = Identity.decode(header, str(path))
        config = JournalConfig(alignment=identity.alignment, max_record_bytes=identity.max_record_bytes,
                               extent_bytes=config.extent_bytes, preallocate=config.preallocate,
                               capacity_bytes=config.capacity_bytes)
        self.path = path
        self.identity = identity
        self.config = config
        self.recovery: RecoveryReport | None = None
        self._file = MappedFile(fd, writable, snapshot)
        self._writable = writable
        self._flusher = flusher
        self._lock = threading.Lock()
        slot, checkpoint = newest(read_checkpoints(header))
        self._syncer = Syncer(path, fd, checkpoint, slot, self._notify)
        self._end = HEADER_SIZE
        self._count = 0
        self._counters = [0] * len(Marker)  # records per marker, in Marker order (plain ints: one-record writes)
        self._sealed = False
        self._anchors: Anchors | None = None  # known record starts; None until needed (O(1) opens)
        self._seq = 0  # writes issued; guarded by _lock
        self.closed = False

    # ----------------------------------------------------------------- opening

    @classmethod
    def create(cls, path: str | Path, *, kind: bytes, flusher: Flusher, metadata: bytes = b"",
               config: JournalConfig | None = None) -> Journal:
        """Create a new, empty journal at ``path`` (which must not exist).

        The header is written and made durable (file and directory) before
        this returns, so the journal exists after a crash or not at all.
        """
        config = (config or JournalConfig()).validate()
        path = Path(path)
        cls.write_empty(path, kind=kind, metadata=metadata, config=config)
        return cls.open(path, kind=kind, flusher=flusher, config=config)

    @staticmethod
    def write_empty(path: str | Path, *, kind: bytes, metadata: bytes = b"",
                    config: JournalConfig | None = None) -> None:
        """Create a journal with no records, durably, without opening it:
        a checksummed, versioned home for small metadata (its header)."""
        config = (config or JournalConfig()).validate()
        identity = Identity(kind=kind, alignment=config.alignment, max_record_bytes=config.max_record_bytes,
                            metadata=bytes(metadata), created_ns=time.time_ns(), uuid=uuid.uuid4().bytes)
        filesystem.create_atomically(Path(path), initial_header(identity))

    @classmethod
    def open(cls, path: str | Path, *, kind: bytes | None = None, flusher: Flusher | None = None,
             writable: bool = True, recount: bool = True, config: JournalConfig | None = None,
             limit: int | None = None, snapshot: bool = False) -> Journal:
        """Open and recover a journal.

        ``recount=False`` opens a sealed journal read-only in O(1) (its
        counters come from the seal's checkpoint); every other open recovers
        the journal. Writable journals need a running ``flusher``; recovery
        truncates a torn tail and makes the recovered state durable before
        returning (FlushFailed if it cannot). ``limit`` (a record boundary)
        drops every record from that byte on: an owner that found, with a
        read-only open, records whose companion data never reached the disk
        drops them so; records a checkpoint declared durable cannot be
        dropped (CorruptJournal).
        ``snapshot`` (read-only) reads the file into memory instead of
        mapping it: for a reader beside another process that may shrink it.
        Read-only opens change nothing on disk. Raises FormatError for a
        file that is not a (matching) journal and CorruptJournal for damaged
        durable data; the file is untouched in both cases.
        """
        path = Path(path)
        if writable and (flusher is None or not flusher.running):
            raise ValueError("a writable journal needs a running Flusher")
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        journal = None
        try:
            journal = cls(path, fd, os.pread(fd, HEADER_SIZE, 0), writable=writable, flusher=flusher,
                          config=config or JournalConfig(), snapshot=snapshot)
            if kind is not None and journal.kind != kind:
                raise FormatError(path, 12, f"journal kind is {journal.kind!r}, expected {kind!r}")
            journal._load(recount or writable, limit)
        except BaseException:
            if journal is not None:
                journal._file.close()
            else:
                os.close(fd)
            raise
        if writable:
            flusher.register(journal)  # type: ignore[union-attr]
        return journal

    def _load(self, recount: bool, limit: int | None = None) -> None:
        """Recover (or, sealed and not recounting, trust the checkpoint)."""
        ckpt, size = self._syncer.checkpoint, self._file.size
        if limit is not None:
            size = min(size, limit)
        if ckpt.sealed and not recount and limit is None:
            if size < ckpt.end:
                raise CorruptJournal(self.path, size, f"sealed journal ends at byte {ckpt.end} but the file has {size}")
            self._end, self._count, self._sealed = ckpt.end, ckpt.count, True
            self._counters = [int(c) for c in ckpt.counters]
            return
        self._anchors = Anchors()
        report = recover(self._file.bytes, file_size=size, alignment=self.identity.alignment,
                         max_record_bytes=self.identity.max_record_bytes, checkpoint=ckpt, path=str(self.path),
                         anchors=self._anchors)
        self.recovery = report
        self._end, self._count, self._sealed = report.end, report.count, ckpt.sealed
        self._counters = [int(c) for c in report.counters]
        if not report.clean:
            log.info("%s: recovery kept %d records up to byte %d; dropped %d records of a torn batch; "
                     "walk stopped at byte %d (%s)", self.path, report.count, report.end,
                     report.dropped_records, report.stop_offset, report.stop_reason)
        if self._writable:
            if not report.clean or self._file.size > report.end and limit is not None:
                self._file.truncate(report.end)
            self._seq = 1  # whatever recovery kept must be flushed and checkpointed
            self._sync_fully()
            self.raise_if_failed()

    # -------------------------------------------------------------- properties

    @property
    def kind(self) -> bytes:
        return self.identity.kind

    @property
    def metadata(self) -> bytes:
        return self.identity.metadata

    @property
    def end(self) -> int:
        """Byte offset just past the last record."""
        return self._end

    @property
    def count(self) -> int:
        """Number of records."""
        return self._count

    @property
    def sealed(self) -> bool:
        return self._sealed

    @property
    def counters(self) -> dict[Marker, int]:
        """Records per marker state (maintained in memory, recounted on open)."""
        return {m: int(c) for m, c in zip(Marker, self._counters)}

    def count_of(self, marker: Marker) -> int:
        """Records carrying ``marker`` now (a cheap single counter)."""
        return self._counters[MARKER_INDEX[marker]]

    def __repr__(self) -> str:
        state = "sealed" if self._sealed else "open"
        return f"<Journal {self.path} kind={self.kind!r} records={self._count} end={self._end} {state}>"

    # ------------------------------------------------------------------ writes

    def syncs_paused(self) -> threading.Lock:
        """A lock that, held, keeps the flusher from syncing, checkpointing or
        closing this journal (a consistent copy: copying.py)."""
        return self._syncer.lock

    def add_companion(self, fd: int) -> None:
        """Sync the data file ``fd`` with this journal, in every flush.

        An owner that keeps bulk data beside the journal (a shard's vectors)
        writes the data first and the journal record that describes it
        second; each flush notes the journal's newest write and syncs the
        companions and the journal at once (syncer.py), confirming nothing
        and writing no checkpoint before all are durable. So when a journal
        write's ticket is durable, every companion write made before it is
        durable too, and a checkpointed record never describes data that is
        not on disk. A record past the checkpoint may reach the disk without
        its data (a crash during the sync, or the kernel's own writeback):
        the owner's recovery checks those against their data. The owner
        keeps ``fd`` open while the journal is.
        """
        self._check_writable()
        with self._syncer.lock:
            self._syncer.companions.append(fd)

    def seal(self) -> None:
        """Refuse further appends, trim preallocated space, and make the
        sealed state and every earlier write durable before returning (so
        the journal reopens in O(1)). Sealing again only flushes."""
        self._check_writable()
        with self._syncer.lock:
            with self._lock:
                if not self._sealed:
                    self._sealed = True
                    self._file.truncate(self._end)
                    self._seq += 1
            self._sync_fully(locked=True)
        self.raise_if_failed()

    # -------------------------------------------------------------- durability

    def wait_durable(self, ticket: Ticket, timeout: float | None = None) -> None:
        """Block until ``ticket`` is durable (see Flusher.wait_durable)."""
        if ticket.journal is not self:
            raise ValueError(f"ticket belongs to {ticket.journal.path}, not {self.path}")
        if ticket.seq <= self.durable_seq:
            return
        if self._flusher is None:
            raise JournalClosed(f"{self.path} is read-only: nothing to wait for")
        self._flusher.wait_durable(ticket, timeout)

    def flush(self, timeout: float | None = None) -> None:
        """Make every write so far durable now (a flusher round, waited for)."""
        self._check_writable()
        ticket = Ticket(self, self._seq)
        if not ticket.durable:
            self._flusher.flush_now(timeout)  # type: ignore[union-attr]
            self.wait_durable(ticket, timeout)

    @property
    def durable_seq(self) -> int:
        """The newest write known durable (tickets up to it are confirmed)."""
        return self._syncer.durable_seq

    @property
    def failed(self) -> FlushFailed | None:
        """Set for good once durability is lost (see syncer.py)."""
        return self._syncer.failed

    def _notify(self) -> None:
        if self._flusher is not None:
            self._flusher.notify()

    def raise_if_failed(self) -> None:
        if self.failed is not None:
            raise self.failed

    def sync_for_flusher(self, lazy: bool = True) -> bool:
        """One flusher step: fdatasync if needed, then checkpoint. Returns
        True if an fdatasync was issued. Called by the flusher thread.
        ``lazy``: a sync only for the checkpoint may wait (syncer.py)."""
        # unlocked read: a write racing this step is not covered by it anyway (its round started before)
        if self._syncer.settled(self._seq, lazy):
            return False
        with self._syncer.lock:
            return self._sync_once(lazy)

    def _sync_fully(self, locked: bool = False) -> None:
        """Sync until the newest checkpoint itself is durable."""
        if not locked:
            with self._syncer.lock:
                return self._sync_fully(locked=True)
        for _ in range(3):
            if not self._sync_once():
                break
        self._notify()

    def _sync_once(self, lazy: bool = False) -> bool:
        """fdatasync covering every write issued so far, then checkpoint.
        Caller holds the syncer's lock."""
        if self.closed:
            return False
        with self._lock:
            seq = self._seq
            state = Checkpoint(0, self._end, self._count, tuple(self._counters),  # type: ignore[arg-type]
                               self._sealed)
        return self._syncer.sync(seq, state, lazy)

    def _fail(self, exc: OSError, during: str) -> None:
        self._syncer.fail(exc, during)

    # ----------------------------------------------------------------- closing

    def close(self) -> None:
        """Flush (if writable and healthy) and release the file. Idempotent."""
        with self._syncer.lock:  # no flusher step may touch the fd once it is closed
            if self.closed:
                return
            try:
                if self._writable:
                    self._sync_fully(locked=True)
            finally:
                self._release()
        if self._flusher is not None:
            if self._writable:
                self._flusher.unregister(self)
            self._flusher.notify()

    def abandon(self) -> None:
        """Release the file without flushing anything, as a crash would.

        For crash tests, and for callers giving up on a failed journal.
        Writes not yet durable stay that way. Idempotent.
        """
        with self._syncer.lock:
            if self.closed:
                return
            self._syncer.fail(None, "abandoned: a flush")
            self._release()
        if self._flusher is not None:
            self._flusher.unregister(self)
            self._flusher.notify()

    def _release(self) -> None:
        with self._lock:
            self.closed = True
            self._file.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- helpers

    def _check_open(self) -> None:
        if self.closed:
            raise JournalClosed(f"{self.path} is closed")

    def _ticket(self) -> Ticket:
        return Ticket(self, self._seq)

    def _check_writable(self) -> None:
        self._check_open()
        if not self._writable:
            raise JournalError(f"{self.path} was opened read-only")
        self.raise_if_failed()
