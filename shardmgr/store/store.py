"""The vector store: named collections of append-only shards.

Embedded use (``shardmgr.open``) and the server component (service.py)
share this class.

Durability: an append is durable at the next flush of the shared flusher;
``durable=True`` returns only after it (vectors, ids and the batch record
are then all on disk). Refs returned by an append name (shard, row) and
stay valid for the life of the data.

Threads: one write lock (``_write``) serialises everything that changes
state (create, append, delete, seal, a rewrite's plan and commit, a
snapshot's copy); its holder is the owner. Searches and gets run on the
caller's thread, concurrently with appends, on a published snapshot of the
shards (rows are never rewritten in place, and faiss releases the GIL while
it computes). The background work, a composed Maintenance (maintenance.py),
has two threads: one seals shards that stay idle and runs rewrites (built
off the lock, one at a time), the other builds indexes.

Cluster mode's seam (seam.py: the write gate ``gate``, the callbacks
``on_sealed``, ``on_deleted`` and ``on_indexed``, listings of sealed shards
and their files, copies of delete logs, shards adopted from a cache,
granted shard ids) is a side of this class; unused, it changes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from common.journal import Flusher, FlusherConfig, Ticket
from common.journal.filesystem import NO_SPACE, make_dirs
from common.journal.full_disk import FullDisk
from common.journal.lockfile import LockFile
from shardmgr.errors import DiskFull, UnknownCollection

from . import index, inputs, layout
from .collection import Collection
from .config import StoreConfig
from .copies import copy_collections
from .knn import SearchResult
from .maintenance import Maintenance
from .names import check_name
from .refs import split_refs
from .seam import ClusterSeam, WriteGate

log = logging.getLogger(__name__)
NO_GATE = contextlib.nullcontext()
"""The write gate around a write when there is none (reusable: it holds no state)."""
T = TypeVar("T")
PARTLY = ("the rows of some shards may be deleted (not durably) and the others not: the call can be "
          "repeated once there is space (rows deleted already count 0)")


class Store:
    """Collections under ``data_dir/shards``."""

    def __init__(self, data_dir: str | Path, config: StoreConfig | None = None, *,
                 flusher: Flusher | FlusherConfig | None = None, lock: bool = True) -> None:
        """``flusher``: a shared, running Flusher (the server's), or the
        configuration of the store's own, which it starts and stops
        (default FlusherConfig()). ``lock`` takes the directory's LOCK."""
        self.data_dir = Path(data_dir)
        self.root = self.data_dir / layout.SHARDS
        self.config = (config or StoreConfig()).validate()
        self._own_flusher = not isinstance(flusher, Flusher)
        self.flusher = flusher if isinstance(flusher, Flusher) else Flusher(flusher or FlusherConfig())
        self._lock_file = LockFile(self.data_dir) if lock else None
        self._write = threading.Lock()
        #: cluster mode's side of the store (seam.py)
        self.seam = ClusterSeam(self.collection, self._write)
        #: writes refused for a full disk: counted in stats, logged once per episode
        self.full_disk = FullDisk(f"vector store {self.root}", log)
        self._collections: dict[str, Collection] = {}
        #: idle seals, rewrites and index builds, on threads of their own (maintenance.py)
        self.maintenance = Maintenance(self._listed, self._write, self.config, self.flusher)
        #: cluster mode (seam.py): the write gate, the callbacks (quick: they run under the write lock,
        #: with the collection's name and the shard's id), and granted shard ids only
        self.gate: WriteGate | None = None
        self.on_sealed: list[Callable[[str, int], None]] = []
        self.on_deleted: list[Callable[[str, int], None]] = []
        self.on_indexed: list[Callable[[str, int], None]] = []
        self.shard_ids_granted = False

    # -------------------------------------------------------------- lifecycle

    def open(self) -> Store:
        self.recover()
        self.start()
        return self

    def recover(self) -> None:
        """Lock the directory (embedded use), open every collection and
        shard (replaying and sealing mid-build ones, quarantining damaged
        ones). Nothing is served before this returns."""
        make_dirs(self.data_dir)
        if self._lock_file is not None:  # first: a directory it refuses (a snapshot cut short) is left as it is
            self._lock_file.acquire()
        make_dirs(self.root)
        if self._own_flusher:
            self.flusher.start()
        started = time.monotonic()
        try:
            for directory in sorted(p for p in self.root.iterdir() if (p / layout.COLLECTION).exists()):
                collection = Collection.open(directory, self.flusher, self.config)
                self._collections[collection.name] = self._adopt(collection)
        except BaseException:  # e.g. too many open files: release everything, so a retry can start clean
            self.close()
            raise
        shards = sum(len(c.shards) for c in self._collections.values())
        log.info("shardmgr: opened %d collections, %d shards (%d quarantined) in %.3f s", len(self._collections),
                 shards, sum(len(c.quarantined) for c in self._collections.values()), time.monotonic() - started)

    def start(self) -> None:
        self.maintenance.start()

    def close(self) -> None:
        self.maintenance.stop()
        with self._write:
            for collection in self._collections.values():
                collection.close()
            self._collections.clear()
        if self._own_flusher:
            self.flusher.stop()
        if self._lock_file is not None:
            self._lock_file.release()

    def abandon(self) -> None:
        """Stop at once, as a crash would: no further flush, files released
        unsynced (crash tests)."""
        self.maintenance.stop(wait_for_index=False)
        if self._own_flusher:
            self.flusher.stop(flush=False)
        with self._write:
            for collection in self._collections.values():
                for shard in collection.shards.values():
                    shard.abandon()
            self._collections.clear()
        if self._lock_file is not None:
            self._lock_file.release()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """Hold the write lock (no append, delete, seal or rewrite commit
        meanwhile); a snapshot copies the files (:meth:`copy_files`) inside."""
        with self._write:
            yield

    def copy_files(self, dest: Path) -> int:
        """Copy every collection to ``dest/shards`` (copies.py); only inside
        :meth:`frozen`, after a flush. Returns bytes copied (links count 0)."""
        return copy_collections(list(self._collections.values()), dest)

    def compact(self, name: str | None = None) -> int:
        """Run the rewrites that are due now (shards mostly deleted, small
        shards to merge: rewrite.py), in ``name`` or every collection, until
        none is; returns how many ran. The maintenance thread does the same
        in the background, one rewrite per collection per second."""
        return self.maintenance.compact([self.collection(name)] if name is not None else self._listed())

    def wait_for_indexes(self, timeout: float = 600.0) -> None:
        """Block until every sealed shard that should have an index has one (tests, benchmarks)."""
        self.maintenance.wait_for_indexes(timeout)

    # ------------------------------------------------------------ collections

    def collection(self, name: str) -> Collection:
        found = self._collections.get(name)
        if found is None:
            raise UnknownCollection(f"no collection named {name!r}")
        return found

    def create_collection(self, name: str, dim: int, metric: str = "l2", index: str = "flat") -> dict[str, Any]:
        """Create a collection; idempotent for the same parameters, an error
        (CollectionConflict) for different ones."""
        check_name(name)
        if self.gate is not None:
            self.gate.creating(name, *Collection.check_params(dim, metric, index))
        with self._write:
            existing = self._collections.get(name)
            if existing is not None:
                existing.matches(dim, metric, index)
                return existing.info()
            collection = Collection.create(self.root, name, dim, metric, index, self.flusher, self.config)
            self._collections[name] = self._adopt(collection)
            return collection.info()

    def _adopt(self, collection: Collection) -> Collection:
        collection.on_sealed, collection.on_deleted, collection.on_indexed = \
            self.on_sealed, self.on_deleted, self.on_indexed
        if self.shard_ids_granted:
            collection.shard_id_limit = collection.next_shard
        return collection

    def collections(self) -> list[str]:
        return sorted(self._collections)

    def _listed(self) -> list[Collection]:
        """The collections now (a copy: creators may add one meanwhile)."""
        return list(self._collections.values())

    def collection_info(self, name: str) -> dict[str, Any]:
        return self.collection(name).info()

    # ----------------------------------------------------------------- writes

    def append_async(self, name: str, vectors: Any, ids: Any, *,
                     durable: bool = False) -> tuple[np.ndarray, Ticket | None]:
        """Append a batch; returns its refs and the ticket that says when it
        is durable (None for an empty batch: nothing is written).
        ``durable``: the caller waits for the ticket next (the vectors'
        write-out then starts at once: Shard.append)."""
        with self._gated(name):
            collection = self.collection(name)
            checked = inputs.vectors(vectors, collection.dim, max_rows=self.config.max_batch_rows)
            checked_ids = inputs.ids(ids, len(checked))
            if not len(checked):
                return np.zeros(0, dtype=np.int64), None
            with self._write:
                return self._writing(name, lambda: collection.append(checked, checked_ids, durable),
                                     needed=checked.nbytes + checked_ids.nbytes)

    def append(self, name: str, vectors: Any, ids: Any, durable: bool = False) -> np.ndarray:
        """Append float32 [n, dim] vectors with int64 [n] ids; one ref per row
        (an empty batch answers no refs at once and writes nothing)."""
        refs, ticket = self.append_async(name, vectors, ids, durable=durable)
        if durable and ticket is not None:
            ticket.journal.wait_durable(ticket)
        return refs

    def delete(self, name: str, refs: Any, durable: bool = False) -> int:
        """Delete the rows ``refs`` name: search never returns them again and
        ``get`` answers RowDeleted. Returns how many were not deleted before
        (deleting a deleted row again changes nothing). UnknownRef, before
        anything is written, if a ref names no stored row. Durable like an
        append: at the next flush, or before returning with ``durable``; a
        crash before that flush may undo it (each shard's part of the call
        as a whole)."""
        checked = inputs.refs(refs, self.config.max_batch_rows)
        shards = frozenset(np.unique(split_refs(checked)[0]).tolist()) if self.gate is not None else None
        return self._delete(name, shards, lambda collection: checked, durable)

    def delete_ids(self, name: str, ids: Any, durable: bool = False) -> int:
        """Delete every live row carrying one of ``ids`` (every shard's ids
        are scanned); returns how many rows. Otherwise as :meth:`delete`."""
        wanted = inputs.ids(ids, None, self.config.max_batch_rows)
        dead = self.gate is not None  # the gate is told of every row carrying the ids
        return self._delete(name, None, lambda collection: collection.refs_of_ids(wanted, dead=dead), durable)

    def _delete(self, name: str, shards: frozenset[int] | None, refs: Callable[[Collection], np.ndarray],
                durable: bool) -> int:
        """One delete through the gate (``shards``: for it alone); ``refs`` runs under the write lock."""
        with self._gated(name):
            collection = self.collection(name)
            if self.gate is not None:
                self.gate.deleting(name, shards)
            with self._write:
                named = refs(collection)
                deleted, tickets = self._writing(name, lambda: collection.delete(named), PARTLY)
            if durable:
                _wait_durable(tickets)
            if self.gate is not None:
                self.gate.deleted(name, named)
        return deleted

    def _gated(self, name: str) -> contextlib.AbstractContextManager[None]:
        """The write gate around one write: ``writing`` before (it may refuse),
        ``written`` after; without a gate, a shared no-op (a generator-based
        context manager would add ~1.4 us to every append on the one-row path)."""
        return NO_GATE if self.gate is None else self._around(self.gate, name)

    @staticmethod
    @contextlib.contextmanager
    def _around(gate: WriteGate, name: str) -> Iterator[None]:
        gate.writing(name)
        try:
            yield
        finally:
            gate.written(name)

    def _writing(self, name: str, write: Callable[[], T], stored: str = "nothing was stored",
                 needed: int | None = None) -> T:
        """Run a write (of about ``needed`` bytes); a full disk becomes DiskFull, saying what ``stored`` of it,
        counted and logged once per episode (common/journal/full_disk.py)."""
        try:
            done = write()
        except OSError as exc:  # WriteFailed too
            if exc.errno in NO_SPACE:
                self.full_disk.refused_write(exc, self.root / name, needed)
                raise DiskFull(f"collection {name!r}: the disk is full: {exc} "
                               f"({free_bytes_under(self.root)} bytes free); {stored}") from exc
            raise
        self.full_disk.wrote()
        return done

    def flush(self) -> None:
        """Make every append so far durable now."""
        self.flusher.flush_now()

    # ------------------------------------------------------------------ reads

    def search(self, name: str, queries: Any, k: int = 10,
               params: dict[str, int] | None = None) -> SearchResult:
        """Top-k over every shard: (scores, ids, refs), each [nq, k]; missing
        results have ref -1. Exact, or through the collection's index on
        sealed shards that have one; ``params`` (``nprobe``, ``efSearch``)
        tune that index per query (index.py)."""
        collection = self.collection(name)
        checked = inputs.vectors(queries, collection.dim, "queries", max_rows=self.config.max_queries)
        k = inputs.k(k, self.config.max_k)
        chosen = index.check_params(params)
        if not len(checked):
            return SearchResult(np.zeros((0, k), np.float32), np.zeros((0, k), np.int64), np.zeros((0, k), np.int64))
        hits = collection.search(checked, k, chosen)
        return SearchResult(hits.scores, hits.ids, hits.refs)

    def get(self, name: str, refs: Any) -> np.ndarray:
        """The vectors [n, dim] stored at ``refs``."""
        return self.rows(name, refs)[0]

    def ids(self, name: str, refs: Any) -> np.ndarray:
        """The ids [n] stored with ``refs``."""
        return self.rows(name, refs)[1]

    def rows(self, name: str, refs: Any) -> tuple[np.ndarray, np.ndarray]:
        """(vectors [n, dim], ids [n]) stored at ``refs``."""
        return self.collection(name).rows(inputs.refs(refs, self.config.max_batch_rows))

    def stats(self) -> dict[str, int]:
        infos = [c.info() for c in list(self._collections.values())]  # creators may add one meanwhile
        return {**self.full_disk.stats(), "collections": len(infos), "rows": sum(i["rows"] for i in infos),
                "deleted_rows": sum(i["deleted"] for i in infos),
                "shards": sum(i["shards"] for i in infos), "growing_shards": sum(i["growing"] for i in infos),
                "quarantined_shards": sum(len(i["quarantined"]) for i in infos)}


def free_bytes_under(directory: Path) -> int:
    """Free bytes on ``directory``'s file system (for error messages)."""
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize


def _wait_durable(tickets: list[Ticket]) -> None:
    for ticket in tickets:
        ticket.journal.wait_durable(ticket)
