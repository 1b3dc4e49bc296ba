"""A shard: one directory of row files and a journal, appended in batches.

* ``vectors``: float32 rows of the collection's dimension (rows.py)
* ``ids``: one int64 per row (rows.py)
* ``deletes`` (from the first delete on): the rows deleted since (deletes.py)
* ``journal``: one record per appended batch (batch_record.py)
* ``refs`` (rewritten shards only): each row's ref (lineage.py)
* ``closed`` (a growing shard closed cleanly): close_marker.py

An append writes the rows of both files (one pwrite each), then the batch's
journal record. The row files are the journal's companions, synced before it
in every flush, so a record a flush confirmed (or a checkpoint declared
durable) always has its rows on disk.

Opening a *sealed* shard is O(1) in its data: headers, the sealed checkpoint,
the last batch record and three file sizes. Opening a *mid-build* shard
replays its journal: every batch's rows are checked against its checksums,
the first batch that fails (and those after) is dropped if no flush had
confirmed it, the row files are cut to the last complete batch, and the shard
is sealed (it is never appended to again, so a ref handed out for a batch
that a crash lost can never name another vector later). A shard whose
structure or durable data is wrong raises :class:`ShardDamaged`; the
collection quarantines it.

Threads: the collection's writer appends and seals (holding the store's
write lock); readers use :meth:`view`, a consistent snapshot.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from common.errors import CommonError
from common.journal import Flusher, Journal, JournalConfig, Ticket
from common.journal.errors import FormatError
from common.journal.filesystem import fsync_dir, make_dirs

from . import batch_record, close_marker, metadata
from .batch_record import BATCH, JOURNAL_KIND, last_record
from .close_marker import Closed
from .deletes import DeleteLog, Selector, over
from .lineage import Lineage, open_refs
from .refs import ref_of
from .rows import IDS, VECTORS, RowFile, RowHeader

log = logging.getLogger(__name__)



#: What says a shard's files are wrong: a bad format or content
#: (FormatError, CorruptJournal; undecodable metadata and records are
#: turned into FormatError where they are parsed) or a missing file. Errors
#: of the moment (too many open files, no memory, I/O errors) must not
#: quarantine a healthy shard, nor may bugs (TypeError, KeyError, ...):
#: those propagate and the open fails, changing nothing.
DAMAGE = (FormatError, FileNotFoundError)
TMP_SUFFIX = ".tmp"


class ShardDamaged(CommonError):
    """A shard failed its checks on open; ``reason`` says which."""

    def __init__(self, directory: Path, reason: str) -> None:
        super().__init__(f"{directory}: {reason}")
        self.directory = directory
        self.reason = reason


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """A consistent snapshot of a shard for readers."""

    shard: int
    rows: int
    vectors: np.ndarray  # [rows, dim] float32, read-only, in place
    ids: np.ndarray  # [rows] int64, read-only, in place
    index: Any = None  # an approximate faiss index over the rows, if built (index.py)
    sealed: bool = False
    deleted: np.ndarray | None = None  # bool mask of deleted rows (rows past its end are live); None: none deleted
    deleted_count: int = 0
    refs: np.ndarray | None = None  # [rows] int64, the rows' refs (rewritten shards); None: shard << 40 | row
    lineage: Lineage | None = None
    keep: Selector | None = None  # faiss's selector of the live rows; None: none deleted

    @property
    def live(self) -> int:
        return self.rows - self.deleted_count

    def dead(self) -> np.ndarray:
        """Deleted or not, per row: bool [rows]."""
        return over(self.deleted, self.rows) if self.deleted is not None else np.zeros(self.rows, dtype=bool)

    def refs_at(self, rows: np.ndarray) -> np.ndarray:
        """The refs of some of this shard's rows."""
        return self.refs[rows] if self.refs is not None else ref_of(self.shard, rows)


class Shard:
    """One shard's files and row count."""

    def __init__(self, directory: Path, shard_id: int, dim: int, journal: Journal, vectors: RowFile,
                 ids: RowFile, rows: int, deletes: DeleteLog) -> None:
        self.directory = directory
        self.id = shard_id
        self.dim = dim
        self.journal: Journal | None = journal  # None once sealed: a sealed shard holds no descriptors
        self.vectors = vectors
        self.ids = ids
        self.rows = rows
        self.deletes = deletes
        self.refs: RowFile | None = None  # rewritten shards: each row's ref (lineage.py)
        self.lineage: Lineage | None = None
        self.last_append = time.monotonic()
        self.index: Any = None  # set once an approximate index is built or loaded (sealed shards only)
        self.marked = False  # its clean-close marker is kept until the first append (close_marker.py)

    # -------------------------------------------------------------- creation

    @classmethod
    def create(cls, directory: Path, shard_id: int, dim: int, collection: str, flusher: Flusher,
               extent: int) -> Shard:
        """Build the shard in ``<directory>.tmp`` and rename it into place, so
        a shard directory exists whole or not at all (a crash or an error
        leaves only a ``.tmp`` directory, which the collection removes)."""
        building = directory.with_name(directory.name + TMP_SUFFIX)
        if building.exists():
            shutil.rmtree(building)
        make_dirs(building)
        opened: list[Any] = []
        try:
            uid = uuidlib.uuid4().bytes
            opened.append(RowFile.create(building / "vectors", RowHeader(VECTORS, "<f4", dim, uid), extent))
            opened.append(RowFile.create(building / "ids", RowHeader(IDS, "<i8", 1, uid), max(4096, extent // dim),
                                         "zero"))
            meta = msgpack.packb({"collection": collection, "shard": shard_id, "dim": dim, "uuid": uid})
            Journal.write_empty(building / "journal", kind=JOURNAL_KIND, metadata=meta)
            for row_file in opened:
                row_file.close()
            opened.clear()
            os.rename(building, directory)
            fsync_dir(directory.parent)
            journal = Journal.open(directory / "journal", kind=JOURNAL_KIND, flusher=flusher,
                                   config=JournalConfig(extent_bytes=1 << 20, preallocate="zero"))
            opened.append(journal)
            vectors, ids = _open_rows(directory, uid, dim, writable=True)
        except BaseException:
            for handle in opened:
                handle.close()
            shutil.rmtree(building, ignore_errors=True)
            raise
        _grow_by(vectors, ids, extent, dim)
        journal.add_companion(vectors.fd)
        journal.add_companion(ids.fd)
        return cls(directory, shard_id, dim, journal, vectors, ids, 0,
                   DeleteLog(directory, shard_id, uid, flusher, None, np.zeros(0, dtype=bool)))

    @property
    def sealed(self) -> bool:
        return self.journal is None or self.journal.sealed

    def _let_go(self) -> None:
        """A sealed shard is read through its mappings only: close its journal
        and the row files' descriptors (its delete log stays open)."""
        if self.journal is not None:
            self.journal.close()
            self.journal = None
        for column in (self.vectors, self.ids, self.refs):
            if column is not None:
                column.detach()

    @property
    def uuid(self) -> bytes:
        """The identity shared by the shard's journal, row files and index."""
        return self.vectors.header.uuid

    @property
    def vector_bytes(self) -> int:
        return self.rows * self.dim * 4

    # ---------------------------------------------------------------- writes

    def append(self, vectors: np.ndarray, ids: np.ndarray) -> tuple[int, Ticket]:
        """Write one batch (float32 [n, dim] and int64 [n], already checked);
        the first one of a session removes the clean-close marker first, durably."""
        if self.marked:
            close_marker.remove(self.directory)
            self.marked = False
        first = self.rows
        self.vectors.write(first, vectors)
        self.ids.write(first, ids)
        assert self.journal is not None, "appended to a sealed shard"
        _, ticket = self.journal.append(batch_record.pack(first, vectors, ids))
        self.rows = first + len(ids)
        self.last_append = time.monotonic()
        return first, ticket

    def delete(self, rows: np.ndarray) -> tuple[int, Ticket | None]:
        """Delete rows of this shard (each < ``rows``, checked by the caller);
        (rows newly deleted, the ticket of their record or None)."""
        return self.deletes.add(rows, self.rows)

    def seal(self) -> None:
        """Make everything durable, cut the row files to size, seal the journal."""
        assert self.journal is not None, "sealed twice"
        self.journal.flush()
        for column in (self.vectors, self.ids):
            column.truncate(self.rows)
        self.journal.seal()  # its flush syncs the truncated companions first
        if self.marked:
            close_marker.remove(self.directory)
            self.marked = False
        self._let_go()

    def view(self) -> View:
        rows, deletes = self.rows, self.deletes
        return View(self.id, rows, self.vectors.rows(rows), self.ids.rows(rows), self.index, self.sealed,
                    deletes.mask if deletes.count else None, deletes.count,
                    self.refs.rows(rows) if self.refs is not None else None, self.lineage, deletes.keep)

    def close(self) -> None:
        """Flush and release the files. A growing shard then gets its
        clean-close marker, so that the next open keeps it growing
        (close_marker.py; one it still has, nothing appended since it was
        written, stays); if a flush fails it gets none (and is sealed then)."""
        journal = self.journal
        growing = Closed(self.uuid, self.rows, journal.end) \
            if journal and self.rows and not journal.sealed and not self.marked else None
        try:
            if journal is not None:
                journal.close()
            self.deletes.close()
        finally:
            for column in (self.vectors, self.ids, self.refs):
                if column is not None:
                    column.close()
        if growing is not None:
            close_marker.write(self.directory, growing)

    def abandon(self) -> None:
        """Release the files without a further flush, as a crash would (crash tests)."""
        if self.journal is not None:
            self.journal.abandon()
        self.deletes.abandon()
        for column in (self.vectors, self.ids, self.refs):
            if column is not None:
                column.close()

    # --------------------------------------------------------------- opening

    @classmethod
    def open(cls, directory: Path, shard_id: int, dim: int, flusher: Flusher, extent: int = 64 << 20) -> Shard:
        """Open a shard, recovering it if it was mid-build (sealed then,
        unless it was closed cleanly: see close_marker.py); a growing
        shard's row files grow by ``extent`` bytes. ShardDamaged if any
        check fails; nothing is changed then."""
        try:
            probe = Journal.open(directory / "journal", kind=JOURNAL_KIND, writable=False, recount=False)
        except DAMAGE as exc:
            raise ShardDamaged(directory, f"journal: {exc}") from exc
        sealed = probe.sealed
        probe.close()
        try:
            if sealed:
                return cls._open_sealed(directory, shard_id, dim, flusher)
            return cls._recover(directory, shard_id, dim, flusher, extent)
        except ShardDamaged:
            raise
        except DAMAGE as exc:
            raise ShardDamaged(directory, f"{type(exc).__name__}: {exc}") from exc

    @classmethod
    def _open_sealed(cls, directory: Path, shard_id: int, dim: int, flusher: Flusher) -> Shard:
        close_marker.remove(directory)  # a crash between sealing and removing it left it: it says nothing now
        journal = Journal.open(directory / "journal", kind=JOURNAL_KIND, writable=False, recount=False)
        try:
            uid = _check_meta(journal, directory, shard_id, dim)
            rows = 0
            if journal.count:
                first, count, _, _ = BATCH.unpack(last_record(journal))  # always BATCH.size bytes (checked)
                rows = first + count
            vectors, ids = _open_rows(directory, uid, dim, writable=False)
        except BaseException:
            journal.close()
            raise
        try:
            lineage = Lineage.decode(msgpack.unpackb(journal.metadata), journal.path)
        except BaseException:
            for handle in (journal, vectors, ids):
                handle.close()
            raise
        shard = cls._with_deletes(directory, shard_id, dim, journal, vectors, ids, rows, uid, flusher)
        if lineage is not None:
            try:
                shard.refs, shard.lineage = open_refs(directory, uid, rows, lineage), lineage
            except BaseException:
                shard.close()
                raise
        for column in (vectors, ids):
            expect = 4096 + rows * column.header.row_bytes
            if column.size < expect:
                shard.close()
                raise ShardDamaged(directory, f"{column.path.name} has {column.size} bytes; {rows} sealed rows "
                                   f"need {expect}")
            if column.size > expect:  # sealing trimmed it: stray bytes, never read (verify --repair cuts them)
                log.warning("shard %s: %s has %d bytes after its sealed rows", directory, column.path.name,
                            column.size - expect)
        shard._let_go()
        return shard

    @classmethod
    def _with_deletes(cls, directory: Path, shard_id: int, dim: int, journal: Journal, vectors: RowFile,
                      ids: RowFile, rows: int, uid: bytes, flusher: Flusher) -> Shard:
        """The shard, its delete log read (its files closed again if that fails)."""
        try:
            deletes = DeleteLog.open(directory, shard_id, uid, rows, flusher)
        except BaseException:
            for handle in (journal, vectors, ids):
                handle.close()
            raise
        return cls(directory, shard_id, dim, journal, vectors, ids, rows, deletes)

    @classmethod
    def _recover(cls, directory: Path, shard_id: int, dim: int, flusher: Flusher, extent: int) -> Shard:
        """Replay a mid-build shard: find the complete batches with a
        read-only look, reopen the journal dropping the rest, cut the row
        files to the same rows, and seal, unless its clean-close marker
        says that nothing was lost: then it stays growing."""
        rows, cut = cls._replay(directory, shard_id, dim)
        journal = Journal.open(directory / "journal", kind=JOURNAL_KIND, flusher=flusher, limit=cut)
        try:
            uid = _check_meta(journal, directory, shard_id, dim)
            vectors, ids = _open_rows(directory, uid, dim, writable=True)
        except BaseException:
            journal.close()
            raise
        journal.add_companion(vectors.fd)
        journal.add_companion(ids.fd)
        shard = cls._with_deletes(directory, shard_id, dim, journal, vectors, ids, rows, uid, flusher)
        try:
            shard._finish_recovery(cut is None, extent)
        except BaseException:
            shard.abandon()  # released, nothing more written: the next open starts over
            raise
        return shard

    def _finish_recovery(self, complete: bool, extent: int) -> None:
        """Cut the row files to the replayed rows; then keep growing if the
        clean-close marker vouches for them (and nothing was cut), else seal."""
        assert self.journal is not None
        for column in (self.vectors, self.ids):
            column.truncate(self.rows)
        closed = Closed(self.uuid, self.rows, self.journal.end)
        if complete and not self.deletes.past and close_marker.read(self.directory) == closed:
            _grow_by(self.vectors, self.ids, extent, self.dim)
            self.journal.flush()  # the cut row files (its companions) are durable before the marker goes
            self.marked = True  # removed before the first append: a session that appends nothing changes nothing
            log.info("shard %s: closed cleanly with %d rows; still growing", self.directory, self.rows)
            return
        self.journal.seal()  # syncs the cut row files (its companions) first
        close_marker.remove(self.directory)
        fsync_dir(self.directory)
        self._let_go()
        log.info("shard %s: replayed and sealed with %d rows", self.directory, self.rows)

    @classmethod
    def _replay(cls, directory: Path, shard_id: int, dim: int) -> tuple[int, int | None]:
        """(rows of the complete batches, journal offset of the first batch
        to drop or None). Reads only. ShardDamaged if a batch that a flush
        had confirmed fails its checksums."""
        with Journal.open(directory / "journal", kind=JOURNAL_KIND, writable=False) as journal:
            uid = _check_meta(journal, directory, shard_id, dim)
            durable_end = journal.recovery.checkpoint.end if journal.recovery else 0
            vectors, ids = _open_rows(directory, uid, dim, writable=False)
            try:
                rows = 0
                for record in journal.records():
                    first, count, vectors_crc, ids_crc = batch_record.unpack(record.body, journal.path, record.offset)
                    if first != rows:
                        raise ShardDamaged(directory, f"batch at journal offset {record.offset} starts at row "
                                           f"{first}, expected {rows}")
                    if not batch_record.intact(vectors, ids, first, count, vectors_crc, ids_crc):
                        if record.offset < durable_end:
                            raise ShardDamaged(directory, f"rows {first}..{first + count} of a durable batch fail "
                                               f"their checksums")
                        log.warning("shard %s: dropping rows %d.. (a batch whose rows never reached the disk)",
                                    directory, first)
                        return rows, record.offset
                    rows = first + count
                return rows, None
            finally:
                vectors.close()
                ids.close()


def _grow_by(vectors: RowFile, ids: RowFile, extent: int, dim: int) -> None:
    """The growth steps of a growing shard's row files (ids: zero-filled, in proportion)."""
    vectors.extent, ids.extent, ids.preallocate = extent, max(4096, extent // dim), "zero"


def _check_meta(journal: Journal, directory: Path, shard_id: int, dim: int) -> bytes:
    """The shard's uuid from its journal's metadata, checked against the shard's path and dimension."""
    meta = metadata.decode(journal.metadata, journal.path, {"shard": int, "dim": int, "uuid": bytes})
    if meta["shard"] != shard_id or meta["dim"] != dim:
        raise ShardDamaged(directory, f"journal says shard {meta['shard']} of dim {meta['dim']}; "
                           f"expected shard {shard_id} of dim {dim}")
    return bytes(meta["uuid"])


def _open_rows(directory: Path, uid: bytes, dim: int, writable: bool) -> tuple[RowFile, RowFile]:
    """Both row files, their headers checked against the shard (closed again on failure)."""
    opened: list[RowFile] = []
    try:
        for name, want in (("vectors", (VECTORS, "<f4", dim)), ("ids", (IDS, "<i8", 1))):
            try:
                column = RowFile.open(directory / name, writable)
            except DAMAGE as exc:
                raise ShardDamaged(directory, f"row file: {exc}") from exc
            opened.append(column)
            header = column.header
            if (header.column, header.dtype, header.width) != want or header.uuid != uid:
                raise ShardDamaged(directory, f"{name}: header {header} does not belong to this shard")
    except BaseException:
        for column in opened:
            column.close()
        raise
    return opened[0], opened[1]


