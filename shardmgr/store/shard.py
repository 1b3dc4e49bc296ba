"""A shard: one directory of row files and a journal, appended in batches.

* ``vectors``: float32 rows of the collection's dimension (rows.py)
* ``ids``: one int64 per row (rows.py)
* ``deletes`` (from the first delete on): the rows deleted since (deletes.py)
* ``journal``: one record per appended batch, carrying its ids (batch_record.py)
* ``refs`` (rewritten shards only): each row's ref (lineage.py)
* ``closed`` (a growing shard closed cleanly): close_marker.py

An append writes the rows of both files (one pwrite each), then the batch's
journal record, which carries the ids too. The vectors file is the
journal's companion, synced with it in every flush, so a record a flush
confirmed (or a checkpoint declared durable) always has its vectors on
disk, and its ids in itself. The ids file is derived data: synced when the
shard is sealed or closed, and rewritten from the records by a replay
(replay.py). Shards written before (version 1 records, docs/format.md) are
read, and sealed when found growing; they are never appended to.

Opening a *sealed* shard is O(1) in its data: headers, the sealed checkpoint,
the last batch record and three file sizes. Opening a *mid-build* shard
replays its journal (replay.py), cuts the row files to the last complete
batch and seals the shard (it is never appended to again, so a ref handed
out for a batch that a crash lost can never name another vector later),
unless it was closed cleanly. A shard whose structure or durable data is
wrong raises :class:`ShardDamaged`; the collection quarantines it.

Threads: the collection's writer appends and seals (holding the store's
write lock); readers use :meth:`view`, a consistent snapshot.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid as uuidlib
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from common.journal import Flusher, Journal, Ticket
from common.journal.filesystem import fsync_dir, make_dirs

from . import batch_record, close_marker, layout, replay
from .batch_record import JOURNAL_KIND, V1, VERSION, VERSION_KEY, last_batch
from .close_marker import Closed
from .deletes import DeleteLog
from .lineage import Lineage, open_refs
from .rows import IDS, VECTORS, RowFile, RowHeader
from .shard_files import DAMAGE, JOURNAL_CONFIG, Meta, ShardDamaged, check_meta, open_rows
from .view import View

log = logging.getLogger(__name__)



class Shard:
    """One shard's files and row count."""

    def __init__(self, directory: Path, shard_id: int, dim: int, journal: Journal, vectors: RowFile,
                 ids: RowFile, rows: int, deletes: DeleteLog, version: int = VERSION) -> None:
        self.directory = directory
        self.id = shard_id
        self.dim = dim
        self.journal: Journal | None = journal  # None once sealed: a sealed shard holds no descriptors
        self.vectors = vectors
        self.ids = ids
        self.rows = rows
        self.deletes = deletes
        self.version = version  # of its batch records (batch_record.py); only VERSION is ever appended
        self.refs: RowFile | None = None  # rewritten shards: each row's ref (lineage.py)
        self.lineage: Lineage | None = None
        self.last_append = time.monotonic()
        self.index: Any = None  # set once an approximate index is built or loaded (sealed shards only)
        self._view: View | None = None  # the last view made (view())
        self.marked = False  # its clean-close marker is kept until the first append (close_marker.py)

    # -------------------------------------------------------------- creation

    @classmethod
    def create(cls, directory: Path, shard_id: int, dim: int, collection: str, flusher: Flusher,
               extent: int) -> Shard:
        """Build the shard in ``<directory>.tmp`` and rename it into place, so
        a shard directory exists whole or not at all (a crash or an error
        leaves only a ``.tmp`` directory, which the collection removes)."""
        building = directory.with_name(directory.name + layout.TMP_SUFFIX)
        if building.exists():
            shutil.rmtree(building)
        make_dirs(building)
        opened: list[Any] = []
        try:
            uid = uuidlib.uuid4().bytes
            opened.append(RowFile.create(building / layout.VECTORS, RowHeader(VECTORS, "<f4", dim, uid), extent))
            opened.append(RowFile.create(building / layout.IDS, RowHeader(IDS, "<i8", 1, uid), max(4096, extent // dim),
                                         "zero"))
            meta = msgpack.packb({"collection": collection, "shard": shard_id, "dim": dim, "uuid": uid,
                                  VERSION_KEY: VERSION})
            Journal.write_empty(building / layout.JOURNAL, kind=JOURNAL_KIND, metadata=meta, config=JOURNAL_CONFIG)
            for row_file in opened:
                row_file.close()
            opened.clear()
            os.rename(building, directory)
            fsync_dir(directory.parent)
            journal = Journal.open(directory / layout.JOURNAL, kind=JOURNAL_KIND, flusher=flusher,
                                   config=JOURNAL_CONFIG)
            opened.append(journal)
            vectors, ids = open_rows(directory, uid, dim, writable=True)
        except BaseException:
            for handle in opened:
                handle.close()
            shutil.rmtree(building, ignore_errors=True)
            raise
        _grow_by(vectors, ids, extent, dim)
        journal.add_companion(vectors.fd)  # the ids are in the records: the ids file is synced at seal and close
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

    def append(self, vectors: np.ndarray, ids: np.ndarray, durable: bool = False) -> tuple[int, Ticket]:
        """Write one batch (float32 [n, dim] and int64 [n], already checked,
        n >= 1); the first one of a session removes the clean-close marker
        first, durably. ``durable``: its flush is waited for next, so the
        disk starts writing the vectors while the record is made."""
        assert self.journal is not None and self.version == VERSION, "appended to a sealed or old shard"
        if self.marked:
            close_marker.remove(self.directory)
            self.marked = False
        first = self.rows
        self.vectors.write(first, vectors)
        if durable:
            self.vectors.start_writeback(first, len(vectors))
        self.ids.write(first, ids)
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
        self._seal_flushed()

    def _seal_flushed(self) -> None:
        """Cut the row files to the rows, make the ids file durable, then seal
        the journal (its flush syncs the cut vectors file, its companion,
        with it): a sealed checkpoint never describes an ids file not on disk."""
        assert self.journal is not None
        for column in (self.vectors, self.ids):
            column.truncate(self.rows)
        self.ids.sync()
        self.journal.seal()
        if self.marked:
            close_marker.remove(self.directory)
            self.marked = False
        self._let_go()

    def view(self) -> View:
        """A snapshot for readers: the last one made while rows, seal, deletes
        and index are as they were then (a collection republishes every
        shard's view after each write: making one is numpy work, ~10 us,
        which 200 sealed shards turned into 2.3 ms per append)."""
        rows, deletes, last = self.rows, self.deletes, self._view
        if last is not None and (last.rows, last.sealed, last.deleted_count) == (rows, self.sealed, deletes.count) \
                and last.index is self.index:
            return last
        self._view = View(self.id, rows, self.vectors.rows(rows), self.ids.rows(rows), self.index, self.sealed,
                          deletes.mask if deletes.count else None, deletes.count,
                          self.refs.rows(rows) if self.refs is not None else None, self.lineage, deletes.keep)
        return self._view

    def close(self) -> None:
        """Flush and release the files. A growing shard then gets its
        clean-close marker, so that the next open keeps it growing
        (close_marker.py; one it still has, nothing appended since it was
        written, stays); if a flush fails it gets none (and is sealed then)."""
        journal = self.journal
        growing = Closed(self.uuid, self.rows, journal.end) \
            if journal and self.rows and not journal.sealed and not self.marked else None
        try:
            if growing is not None:
                self.ids.sync()  # derived data, but a clean close leaves every file durable
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
        check fails; nothing is changed then (but a version 2 ids file,
        derived data, rewritten from the journal where it lost rows)."""
        try:
            probe = Journal.open(directory / layout.JOURNAL, kind=JOURNAL_KIND, writable=False, recount=False)
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
        journal = Journal.open(directory / layout.JOURNAL, kind=JOURNAL_KIND, writable=False, recount=False)
        try:
            meta = check_meta(journal, directory, shard_id, dim)
            last = last_batch(journal, meta.version)
            rows = last.end if last is not None else 0
            _check_sizes(directory, journal, meta, dim, rows)
            vectors, ids = open_rows(directory, meta.uuid, dim, writable=False)
        except BaseException:
            journal.close()
            raise
        try:
            lineage = Lineage.decode(msgpack.unpackb(journal.metadata), journal.path)
        except BaseException:
            for handle in (journal, vectors, ids):
                handle.close()
            raise
        shard = cls._with_deletes(directory, shard_id, dim, journal, vectors, ids, rows, meta, flusher)
        if lineage is not None:
            try:
                shard.refs, shard.lineage = open_refs(directory, meta.uuid, rows, lineage), lineage
            except BaseException:
                shard.close()
                raise
        shard._let_go()
        return shard

    @classmethod
    def _with_deletes(cls, directory: Path, shard_id: int, dim: int, journal: Journal, vectors: RowFile,
                      ids: RowFile, rows: int, meta: Meta, flusher: Flusher) -> Shard:
        """The shard, its delete log read (its files closed again if that fails)."""
        try:
            deletes = DeleteLog.open(directory, shard_id, meta.uuid, rows, flusher)
        except BaseException:
            for handle in (journal, vectors, ids):
                handle.close()
            raise
        return cls(directory, shard_id, dim, journal, vectors, ids, rows, deletes, meta.version)

    @classmethod
    def _recover(cls, directory: Path, shard_id: int, dim: int, flusher: Flusher, extent: int) -> Shard:
        """Replay a mid-build shard: find the complete batches with a
        read-only look, reopen the journal dropping the rest, rewrite the
        ids the ids file lost, cut the row files to the same rows, and
        seal, unless its clean-close marker says that nothing was lost:
        then it stays growing."""
        found = cls._replay(directory, shard_id, dim)
        journal = Journal.open(directory / layout.JOURNAL, kind=JOURNAL_KIND, flusher=flusher, limit=found.cut)
        try:
            meta = check_meta(journal, directory, shard_id, dim)
            vectors, ids = open_rows(directory, meta.uuid, dim, writable=True)
        except BaseException:
            journal.close()
            raise
        journal.add_companion(vectors.fd)
        shard = cls._with_deletes(directory, shard_id, dim, journal, vectors, ids, found.rows, meta, flusher)
        try:
            replay.rewrite_ids(ids, found.stale)
            shard._finish_recovery(found.cut is None, extent)
        except BaseException:
            shard.abandon()  # released, nothing more written: the next open starts over
            raise
        return shard

    def _finish_recovery(self, complete: bool, extent: int) -> None:
        """Cut the row files to the replayed rows; then keep growing if the
        clean-close marker vouches for them (and nothing was cut, and the
        shard's records are of the version appended now), else seal."""
        assert self.journal is not None
        closed = Closed(self.uuid, self.rows, self.journal.end)
        if (complete and not self.deletes.past and self.version == VERSION
                and close_marker.read(self.directory) == closed):
            for column in (self.vectors, self.ids):
                column.truncate(self.rows)
            self.ids.sync()
            _grow_by(self.vectors, self.ids, extent, self.dim)
            self.journal.flush()  # the cut vectors file (its companion) is durable before the marker goes
            self.marked = True  # removed before the first append: a session that appends nothing changes nothing
            log.info("shard %s: closed cleanly with %d rows; still growing", self.directory, self.rows)
            return
        self._seal_flushed()
        close_marker.remove(self.directory)
        fsync_dir(self.directory)
        log.info("shard %s: replayed and sealed with %d rows", self.directory, self.rows)

    @classmethod
    def _replay(cls, directory: Path, shard_id: int, dim: int) -> replay.Replayed:
        """What a read-only replay of the shard finds (replay.py)."""
        with Journal.open(directory / layout.JOURNAL, kind=JOURNAL_KIND, writable=False) as journal:
            meta = check_meta(journal, directory, shard_id, dim)
            vectors, ids = open_rows(directory, meta.uuid, dim, writable=False)
            try:
                return replay.replay(journal, vectors, ids, meta.version)
            finally:
                vectors.close()
                ids.close()


def _check_sizes(directory: Path, journal: Journal, meta: Meta, dim: int, rows: int) -> None:
    """A sealed shard's row files hold its rows: fewer is damage (but a
    version 2 ids file is rewritten from the journal), more is logged
    (stray bytes, never read; verify --repair cuts them)."""
    for name, row_bytes in ((layout.VECTORS, dim * 4), (layout.IDS, 8)):
        size, expect = (directory / name).stat().st_size, 4096 + rows * row_bytes
        if size < expect and name == layout.IDS and meta.version != V1:
            replay.rebuild_ids(directory, journal, meta.uuid, rows)
        elif size < expect:
            raise ShardDamaged(directory, f"{name} has {size} bytes; {rows} sealed rows need {expect}")
        elif size > expect:
            log.warning("shard %s: %s has %d bytes after its sealed rows", directory, name, size - expect)


def _grow_by(vectors: RowFile, ids: RowFile, extent: int, dim: int) -> None:
    """The growth steps of a growing shard's row files (ids: zero-filled, in proportion)."""
    vectors.extent, ids.extent, ids.preallocate = extent, max(4096, extent // dim), "zero"
