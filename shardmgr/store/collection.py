"""A collection: a fixed dimension and metric, and its shards.

On disk, ``DATA/shards/<name>/``::

    collection      a journal (kind SMCO) with no records; its checksummed
                    header metadata holds {name, dim, metric, index}
    <id:08d>/       one directory per shard (shard.py)
    quarantine/     shards that failed their checks on open, moved aside

At most one shard is growing; the others are sealed. A shard is sealed when
its vectors reach ``seal_bytes`` or it stayed idle for ``idle_seal_s``, and
every shard found mid-build at start-up is sealed after its replay. Shard
ids are never reused (quarantined ones included), so a ref stays valid for
the life of its data.

Threads: appends, seals and creation run under the store's write lock;
searches and gets take a snapshot of the shard list (``views``) and read
rows in place, concurrently with appends.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from common.journal import Flusher, Journal, Ticket
from common.journal.filesystem import fsync_dir, make_dirs
from shardmgr.errors import BadVectors, CollectionConflict, NeedsReopen, NoShardIds, RowDeleted

from . import index as indexes
from . import layout, lineage, metadata, rewrite
from .config import StoreConfig
from .knn import Hits
from .opening import open_shards
from .refs import MAX_SHARD, ref_of
from .searcher import Searcher
from .shard import Shard
from .shard_files import ShardDamaged
from .view import View, gather

log = logging.getLogger(__name__)

META_KIND = b"SMCO"
class Collection:
    """One collection's metadata and shards."""

    def __init__(self, directory: Path, name: str, dim: int, metric: str, index: str, flusher: Flusher,
                 config: StoreConfig) -> None:
        self.directory = directory
        self.name = name
        self.dim = dim
        self.metric = metric
        self.index = index
        self.flusher = flusher
        self.config = config
        self.shards: dict[int, Shard] = {}
        self.quarantined: list[str] = []
        self._min_rows: int | None = None  # rows a shard needs for its index to be built (index.min_rows)
        self.broken: BaseException | None = None  # set for good when a committed rewrite could not be opened
        self.next_shard = 1
        #: new shards only get ids below this; None: no bound (store.py's cluster-mode seam sets it)
        self.shard_id_limit: int | None = None
        #: run with (name, shard id) under the write lock (store.py's cluster-mode seam, seam.py): after an
        #: append or the idle timer sealed a shard; after a delete's record newly deleted rows of a sealed
        #: shard; after a sealed shard's index was built, persisted and installed
        self.on_sealed: list[Callable[[str, int], None]] = []
        self.on_deleted: list[Callable[[str, int], None]] = []
        self.on_indexed: list[Callable[[str, int], None]] = []
        self._searcher = Searcher(metric, config.hnsw_ef_search)
        # for readers: the views and which shard now holds each rewritten one's rows;
        # replaced together (never mutated) by writers
        self._published: tuple[list[View], dict[int, int]] = ([], {})

    # -------------------------------------------------------------- lifecycle

    @staticmethod
    def check_params(dim: int, metric: str, index: str) -> tuple[int, str, str]:
        """(dim, metric, index) as a new collection would store them (the index
        string normalised), or BadVectors naming what is wrong."""
        if not isinstance(dim, int) or isinstance(dim, bool) or not 0 < dim <= 65536:
            raise BadVectors(f"dim must be an integer in 1..65536, got {dim!r}")
        if metric not in ("l2", "ip"):
            raise BadVectors(f"metric must be 'l2' or 'ip', got {metric!r}")
        return dim, metric, indexes.check_spec(index, dim, metric)

    @classmethod
    def create(cls, root: Path, name: str, dim: int, metric: str, index: str, flusher: Flusher,
               config: StoreConfig) -> Collection:
        dim, metric, index = cls.check_params(dim, metric, index)
        directory = root / name
        make_dirs(directory)
        meta = msgpack.packb({"name": name, "dim": dim, "metric": metric, "index": index})
        Journal.write_empty(directory / layout.COLLECTION, kind=META_KIND, metadata=meta)
        return cls(directory, name, dim, metric, index, flusher, config)

    @classmethod
    def open(cls, directory: Path, flusher: Flusher, config: StoreConfig) -> Collection:
        """Load the metadata, open every shard (opening.py: leftovers removed, those that fail quarantined)."""
        with Journal.open(directory / layout.COLLECTION, kind=META_KIND, writable=False) as journal:
            meta = metadata.decode(journal.metadata, journal.path, {"name": str, "dim": int, "metric": str,
                                                                    "index": str})
        collection = cls(directory, meta["name"], meta["dim"], meta["metric"], meta["index"], flusher, config)
        opened = open_shards(directory, collection.name, collection.dim, collection.index, flusher, config)
        collection.shards, collection.quarantined, collection.next_shard = \
            opened.shards, opened.quarantined, opened.next_shard
        collection._publish()
        return collection

    def close(self) -> None:
        for shard in self.shards.values():
            shard.close()
        self.shards.clear()
        self._publish()

    def matches(self, dim: int, metric: str, index: str) -> None:
        if (dim, metric, index) != (self.dim, self.metric, self.index):
            raise CollectionConflict(f"collection {self.name!r} exists with dim {self.dim}, metric {self.metric}, "
                                     f"index {self.index}; asked for dim {dim}, metric {metric}, index {index}")

    # ---------------------------------------------------------------- writes

    @property
    def active(self) -> Shard | None:
        last = self.shards[max(self.shards)] if self.shards else None
        return last if last is not None and not last.sealed else None

    def _check_writable(self) -> None:
        if self.broken is not None:
            raise NeedsReopen(f"collection {self.name!r}: a rewrite was committed but could not be opened "
                              f"({self.broken}); reopen the store (restart the server) before writing") from None

    def append(self, vectors: np.ndarray, ids: np.ndarray, durable: bool = False) -> tuple[np.ndarray, Ticket]:
        """Append a checked batch; returns its refs and the ticket to wait for
        (``durable``: the caller waits for it next; Shard.append). The
        caller holds the store's write lock."""
        self._check_writable()
        shard = self.active
        full = shard is not None and shard.rows > 0 and shard.vector_bytes + vectors.nbytes > self.config.seal_bytes
        if shard is None or full:
            self._check_new_shard()
        if shard is not None and full:
            shard.seal()
            self._sealed(shard)
            shard = None
        created = shard is None
        if shard is None:
            shard_id = self.next_shard
            self.next_shard += 1  # used even if the creation fails: a failed attempt never blocks the next
            shard = Shard.create(self.directory / f"{shard_id:08d}", shard_id, self.dim, self.name,
                                 self.flusher, self.config.extent_bytes)
            self.shards[shard.id] = shard
        try:
            first, ticket = shard.append(vectors, ids, durable)
        except BaseException:
            if created:  # e.g. a full disk: leave no empty shard behind (no ref ever named it)
                self._discard(shard)
            raise
        self._publish()
        return ref_of(shard.id, np.arange(first, first + len(ids), dtype=np.int64)), ticket

    def _check_new_shard(self) -> None:
        """Refuse (before anything is written) if the next shard id may not be used."""
        if self.next_shard > MAX_SHARD:
            raise BadVectors(f"collection {self.name!r} has used all {MAX_SHARD} shard ids")
        if self.shard_id_limit is not None and self.next_shard >= self.shard_id_limit:
            raise NoShardIds(f"collection {self.name!r}: this node may not start shard {self.next_shard} now "
                             f"(cluster mode: it holds no shard ids of the collection); nothing was stored")

    def _sealed(self, shard: Shard) -> None:
        for callback in self.on_sealed:
            callback(self.name, shard.id)

    def _discard(self, shard: Shard) -> None:
        """Remove a shard that never held a row (its creation's first append failed)."""
        del self.shards[shard.id]
        try:
            shard.close()
            shutil.rmtree(shard.directory, ignore_errors=True)
            fsync_dir(self.directory)
        except Exception:  # the append's own error is the one to report; a leftover empty shard is harmless
            log.exception("collection %s: removing the empty shard %s failed", self.name, shard.directory)

    def seal_idle(self, idle_since: float) -> bool:
        """Seal the growing shard if nothing was appended since ``idle_since``."""
        shard = self.active
        if shard is None or not shard.rows or shard.last_append > idle_since:
            return False
        shard.seal()
        self._publish()
        self._sealed(shard)
        return True

    def delete(self, refs: np.ndarray) -> tuple[int, list[Ticket]]:
        """Delete the rows ``refs`` name (checked: UnknownRef for the first
        that names no stored row, before anything is written); rows already
        deleted are skipped. (rows newly deleted, the tickets to wait for).
        The caller holds the store's write lock."""
        self._check_writable()
        shards, rows, _ = self._locate(refs)  # gone: deleted before a rewrite dropped the row
        deleted, tickets, touched = 0, [], []
        try:  # shard by shard: if one fails (a full disk), the shards before it keep their deletes
            for shard_id in np.unique(shards[shards >= 0]).tolist():
                shard = self.shards[shard_id]
                count, ticket = shard.delete(rows[shards == shard_id])
                deleted += count
                if ticket is not None:
                    tickets.append(ticket)
                if count and shard.sealed:
                    touched.append(shard_id)
        finally:
            self._publish()
            for shard_id in touched:  # the records written, even if a later shard's failed
                for callback in self.on_deleted:
                    callback(self.name, shard_id)
        return deleted, tickets

    def refs_of_ids(self, ids: np.ndarray, *, dead: bool = False) -> np.ndarray:
        """The refs of every live row carrying one of ``ids`` (a scan of every
        shard's ids); with ``dead``, of the deleted ones too."""
        found = []
        for view in self.views():
            carrying = np.isin(view.ids, ids)
            found.append(view.refs_at(np.flatnonzero(carrying if dead else carrying & ~view.dead())))
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def _publish(self) -> None:
        shards = list(self.shards.values())
        moved = {source: s.id for s in shards if s.lineage is not None for source in s.lineage.sources}
        self._published = ([shard.view() for shard in shards], moved)
        self._searcher.forget()

    # ------------------------------------------------ shards from elsewhere

    def shard_path(self, shard_id: int) -> Path:
        """Where shard ``shard_id`` lives in this collection's directory."""
        return self.directory / f"{shard_id:08d}"

    def adopt(self, shard_id: int) -> Shard:
        """Open the sealed shard a caller put at :meth:`shard_path` (cluster
        mode's cache: fetched, checked files) and serve it; ShardDamaged if it
        fails the checks of any reopened shard. The caller holds the write lock."""
        shard = Shard.open(self.shard_path(shard_id), shard_id, self.dim, self.flusher, self.config.extent_bytes)
        if not shard.sealed:
            shard.close()
            raise ShardDamaged(shard.directory, "an adopted shard must be sealed")
        if self.index != indexes.EXACT:
            shard.index = indexes.load(shard.directory, shard.rows, self.index, shard.uuid)
        self.shards = dict(sorted({**self.shards, shard_id: shard}.items()))
        self.next_shard = max(self.next_shard, shard_id + 1)
        self._publish()
        return shard

    def drop(self, shard_id: int) -> Path | None:
        """Stop serving shard ``shard_id`` (its files stay; readers holding
        views keep their mappings); its directory, or None if not here. The
        caller holds the write lock."""
        shard = self.shards.pop(shard_id, None)
        if shard is None:
            return None
        self._publish()
        shard.close()
        return shard.directory

    # -------------------------------------------------------------- rewrites

    def plan_rewrite(self, index_failed: set[Path] | None = None) -> rewrite.Plan | None:
        """The next rewrite (rewrite.py), with a fresh shard id; caller holds
        the write lock. Shards waiting for an index build are left alone (the
        build would write into a directory being replaced); ``index_failed``:
        shards whose build failed, which wait for nothing."""
        if self.broken is not None:
            return None
        busy = {s.id for s in self.unindexed() if s.directory not in (index_failed or set())}
        inputs = rewrite.plan([s for s in self.shards.values() if s.id not in busy], self.config, self.dim)
        if not inputs or self.next_shard > MAX_SHARD:
            return None
        self.next_shard += 1
        return rewrite.Plan(self.next_shard - 1, tuple(s.view() for s in inputs))

    def publish_rewrite(self, built: rewrite.Built, plan: rewrite.Plan) -> None:
        """Commit a built rewrite and drop its inputs; caller holds the write lock."""
        inputs = [self.shards[v.shard] for v in plan.inputs]
        final = rewrite.publish(built, plan, inputs, self.flusher)
        try:
            shard = Shard.open(final, plan.shard_id, self.dim, self.flusher, self.config.extent_bytes)
        except BaseException as exc:
            # committed on disk, not in memory: a delete or a second rewrite of the inputs now would be
            # undone at the next open (which removes them); writes wait for that open
            self.broken = exc
            log.error("collection %s: rewrite %d committed but cannot be opened (%s); writes are refused until "
                      "the store is reopened", self.name, plan.shard_id, exc)
            raise
        self.shards[shard.id] = shard
        for old in inputs:
            del self.shards[old.id]
        self._publish()
        rewrite.remove(inputs)
        log.info("collection %s: shards %s rewritten into %d (%d rows)", self.name,
                 [s.id for s in inputs], shard.id, shard.rows)

    # ----------------------------------------------------------------- reads

    def views(self) -> list[View]:
        return self._published[0]

    def search(self, queries: np.ndarray, k: int, params: dict[str, int] | None = None) -> Hits:
        """Top-k live rows over every shard (deleted rows are skipped inside
        faiss); ``params``: per-query index parameters (index.py)."""
        return self._searcher.search(self.views(), queries, k, params or {})

    # --------------------------------------------------------------- indexes

    def unindexed(self) -> list[Shard]:
        """Sealed shards that should have an approximate index and lack one."""
        if self.index == indexes.EXACT:
            return []
        if self._min_rows is None:
            self._min_rows = indexes.min_rows(self.index, self.dim, self.metric)
        need = self._min_rows
        return [s for s in list(self.shards.values()) if s.sealed and s.index is None and s.rows >= need]

    def install_index(self, shard: Shard, built: Any) -> None:
        """Caller holds the write lock."""
        if self.shards.get(shard.id) is shard:
            shard.index = built
            self._publish()
            for callback in self.on_indexed:
                callback(self.name, shard.id)

    def rows(self, refs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(vectors [n, dim], ids [n]) of refs; UnknownRef naming the first
        that names no stored row, RowDeleted the first deleted one."""
        views, moved = self._published  # one snapshot: a rewrite may publish another meanwhile
        by_id = {view.shard: view for view in views}
        shards, rows, gone = lineage.locate(refs, by_id, moved, self.name)
        if gone.any():
            raise RowDeleted(f"collection {self.name!r}: ref {int(refs[np.argmax(gone)])} was deleted")
        vectors, ids, _ = gather(by_id, shards, rows, refs, self.dim, self.name)  # locate found every row
        return vectors, ids

    def _locate(self, refs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(shard ids, rows, gone) where ``refs`` name rows now (lineage.locate);
        UnknownRef, naming the first, for a ref that names no stored row."""
        views, moved = self._published
        return lineage.locate(refs, {view.shard: view for view in views}, moved, self.name)

    def info(self) -> dict[str, Any]:
        views = self.views()  # a snapshot: appends and seals on other threads do not disturb it
        deleted = sum(v.deleted_count for v in views)
        return {"name": self.name, "dim": self.dim, "metric": self.metric, "index": self.index,
                "rows": sum(v.rows for v in views) - deleted, "deleted": deleted, "shards": len(views),
                "sealed": sum(1 for v in views if v.sealed), "growing": sum(1 for v in views if not v.sealed),
                "bytes": sum(v.rows for v in views) * (self.dim * 4 + 8), "quarantined": list(self.quarantined)}

