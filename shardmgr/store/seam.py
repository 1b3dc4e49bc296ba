"""Cluster mode's seam in the store (shardmgr/cluster/node.py uses it;
unused otherwise, and then nothing here changes the store's behaviour).

:class:`ClusterSeam` is ``Store.seam``: an object the store makes over its
collections and its write lock. What the cluster node gets:

- a write gate: ``Store.gate`` (a :class:`WriteGate`) is asked before every
  create, append and delete, and may refuse; told which shards a delete
  names before it is written, and which rows it named once it is written;
  and told after each append and delete it let through;
- callbacks, each called with (collection name, shard id) under the store's
  write lock (so they must be quick and must not call back into the store):
  ``on_sealed`` after an append or the idle timer sealed a shard,
  ``on_deleted`` after a delete that newly deleted rows of a *sealed* shard
  wrote its record (not yet durable: :meth:`ClusterSeam.copy_deletes` waits
  for that), and ``on_indexed`` after a sealed shard's approximate index
  was built, persisted beside it and installed;
- listings of sealed shards with their files (sealed.py):
  :meth:`~ClusterSeam.sealed_shards`, :meth:`~ClusterSeam.sealed_shard`;
- a consistent, durable copy of a sealed shard's delete log, which keeps
  growing while it is read (:meth:`~ClusterSeam.copy_deletes`);
- shards from elsewhere (a query node's cache of fetched shards, a writer
  deleting in a shard another node wrote): :meth:`~ClusterSeam.adopt_shard`,
  :meth:`~ClusterSeam.drop_shard`; and another node's deletes of a shard
  held here (:meth:`~ClusterSeam.merge_deletes`);
- shard ids: with ``shard_ids_granted`` set before ``recover``, a collection
  starts new shards only under ids given by ``grant_shard_ids`` (so that
  two writers of one collection on two nodes never use one shard id).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import numpy as np

from common.journal.copying import copy_journal
from shardmgr.errors import UnknownCollection

from .collection import Collection
from .deletes import DeleteLog
from .refs import ref_of
from .sealed import SealedShard, sealed_shard

COPY_ATTEMPTS = 3
"""Tries of copy_deletes to find the delete log already durable, waiting off the lock in between;
the last one waits for the flush under the write lock."""


class WriteGate(Protocol):
    """Cluster mode's check of writes (shardmgr/cluster/node.py). Called on
    the caller's thread before the store's write lock is taken; raising
    refuses the call before anything is written."""

    def creating(self, name: str, dim: int, metric: str, index: str) -> None:
        """Before a create (parameters checked and normalised)."""

    def writing(self, name: str) -> None:
        """Before an append or delete of ``name``."""

    def written(self, name: str) -> None:
        """After an append or delete that ``writing`` let through, done or failed."""

    def deleting(self, name: str, shards: frozenset[int] | None) -> None:
        """Within an allowed delete, before it is written: the shards its refs
        name (None: a delete by id, which looks at every shard). Cluster mode
        brings published shards written elsewhere here first."""

    def deleted(self, name: str, refs: np.ndarray) -> None:
        """After an allowed delete was written (and made durable, if asked),
        before it returns: the refs it named (for a delete by id, every row
        carrying one of the ids, deleted before or not). Cluster mode holds
        them until other copies of the shards hold them too."""


class ClusterSeam:
    """The store's side for cluster mode (module docstring): ``collection``
    looks a collection up by name (UnknownCollection if there is none), and
    ``write`` is the store's write lock, taken as the store's own writes take it."""

    def __init__(self, collection: Callable[[str], Collection], write: threading.Lock) -> None:
        self.collection = collection
        self._write = write

    def sealed_shards(self, name: str) -> list[SealedShard]:
        """Every sealed shard of ``name`` with its files (sealed.py), by id."""
        collection = self.collection(name)
        with self._write:
            return [sealed_shard(name, s) for s in collection.shards.values() if s.sealed]

    def sealed_ids(self, name: str) -> set[int]:
        """Ids of the sealed shards ``name`` serves now (one snapshot of its
        views, no lock); empty if there is no such collection."""
        try:
            views = self.collection(name).views()
        except UnknownCollection:
            return set()
        return {view.shard for view in views if view.sealed}

    def sealed_shard(self, name: str, shard_id: int) -> SealedShard | None:
        """Sealed shard ``shard_id`` of ``name`` with its files, or None if
        there is no such sealed shard (growing, quarantined, never made)."""
        collection = self.collection(name)
        with self._write:
            shard = collection.shards.get(shard_id)
            return sealed_shard(name, shard) if shard is not None and shard.sealed else None

    def copy_deletes(self, name: str, shard_id: int, dest: Path) -> int:
        """Copy the delete log of sealed shard ``shard_id`` of ``name`` to the
        new file ``dest``, as it was at one moment when every delete in it
        was durable; returns how many deleted rows the copy holds (what a
        reader opening it counts). 0, and nothing written, if the shard has
        no delete log. ValueError if there is no such sealed shard.

        The copy is taken under the write lock (no delete is half written
        then) with the log's syncs paused (no checkpoint is half written),
        only once the log's newest record is durable: so the copy never
        holds a delete that a crash of this node could still undo. Waiting
        for that flush happens off the lock, unless deletes keep arriving:
        then the last attempt waits under it (one flush round)."""
        collection = self.collection(name)
        for attempt in range(COPY_ATTEMPTS):
            with self._write:
                shard = collection.shards.get(shard_id)
                if shard is None or not shard.sealed:
                    raise ValueError(f"collection {name!r} has no sealed shard {shard_id}")
                log = shard.deletes
                if log.journal is None:
                    return 0
                ticket = log.last  # None: every record was there at open, and recovery made them durable
                if ticket is None or ticket.durable or attempt == COPY_ATTEMPTS - 1:
                    if ticket is not None:
                        ticket.journal.wait_durable(ticket)
                    copy_journal(log.journal, dest)
                    return log.count
            ticket.journal.wait_durable(ticket)
        raise AssertionError("unreachable: the last attempt copies")

    def merge_deletes(self, name: str, shard_id: int, directory: Path) -> int:
        """Delete in sealed shard ``shard_id`` of ``name`` every row that the
        delete log in ``directory`` (another node's copy of this shard's log)
        deletes; durable when it returns. Returns the rows newly deleted.
        FormatError if that log is not this shard's, ValueError if there is
        no such sealed shard; nothing is deleted then."""
        collection = self.collection(name)
        with self._write:
            shard = collection.shards.get(shard_id)
            if shard is None or not shard.sealed:
                raise ValueError(f"collection {name!r} has no sealed shard {shard_id}")
            theirs = DeleteLog.open(directory, shard_id, shard.uuid, shard.rows, None)
            rows = np.flatnonzero(theirs.mask)
            deleted, tickets = collection.delete(ref_of(shard_id, rows)) if len(rows) else (0, [])
        for ticket in tickets:
            ticket.journal.wait_durable(ticket)
        return deleted

    def adopt_shard(self, name: str, shard_id: int) -> int:
        """Serve the sealed shard whose checked files a caller put at
        ``collection(name).shard_path(shard_id)`` (cluster mode's cache); its rows."""
        collection = self.collection(name)
        with self._write:
            return collection.adopt(shard_id).rows

    def drop_shard(self, name: str, shard_id: int) -> Path | None:
        """Stop serving a shard (files kept); its directory, or None if it was not served."""
        collection = self.collection(name)
        with self._write:
            return collection.drop(shard_id)

    def shard_ids(self, name: str) -> tuple[int, int | None]:
        """(the id ``name``'s next shard gets, the bound below which ids may be used; None: none)."""
        collection = self.collection(name)
        return collection.next_shard, collection.shard_id_limit

    def grant_shard_ids(self, name: str, first: int, limit: int) -> int:
        """Let ``name`` start new shards with ids from max(next id, ``first``)
        up to ``limit`` (excluded); returns the next id."""
        collection = self.collection(name)
        with self._write:
            collection.next_shard = max(collection.next_shard, first)
            collection.shard_id_limit = limit
            return collection.next_shard

    def revoke_shard_ids(self, name: str) -> None:
        """No new shard in ``name`` until the next grant (the growing one may still fill)."""
        collection = self.collection(name)
        with self._write:
            collection.shard_id_limit = collection.next_shard
