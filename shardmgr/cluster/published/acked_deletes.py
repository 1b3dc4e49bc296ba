"""Deletes this node acknowledged, held until searches routed without this
node find them deleted.

A delete is written on the collection's writer (its own copy of each shard
skips the rows at once) and reaches the other copies of a published shard
only once the writer has published the shard's delete log and each copy has
installed it (extras.py, cache.py). So that a client's acknowledged delete
is seen by its next search and get on the node that acknowledged it,
whichever nodes serve the shards, that node holds the acknowledged rows
here:

- :meth:`AckedDeletes.admit` before the delete: refused with DeletesBacklog
  (retryable, nothing written) while this node holds ``max_rows`` rows or
  more, so that what is held, and sent with each search, stays bounded
  (docs/cluster.md, "When a delete is seen"); from half of it on, every
  hold calls ``publish_now`` (the node's thread: a writer publishes at once).
- :meth:`AckedDeletes.hold` before the acknowledgement: the writer holds
  its own deletes (the store's gate, node.py); a node that forwarded the
  delete holds what the writer's answer lists (:func:`encode`, forwarding.py).
- Every search from this node sends each node it asks the held rows of the
  shards asked of it (:func:`asked`; ``shardmgr.search_shards``'s
  ``deleted`` part), which skips them inside its shard searches as it skips
  its own deleted rows (shard_search.py): so each shard still answers its k
  best live rows, and the merged answer is never short of k while k rows
  remain. A get of one of them is RowDeleted (lookup.py).
- They are dropped once this node's watched state shows them *seen*
  (:meth:`Acked.seen`): a deletes key holds them, and a live node serving
  the shard has a fresh copy (mirror.py). Searches then go to fresh copies
  only (routing.py), which hold that key's rows. While no fresh copy is
  served (the writer published the key and died before any other copy
  installed it) they are kept: the search goes to a stale copy, flagged
  partial, and still skips them. Once dropped, a search goes to a stale
  copy only if every fresh one has left since: flagged partial, as on any
  node.

When is a published log known to hold an acknowledged delete? The writer
says, per sealed shard, how many deleted rows its own copy held after the
delete (``count``) and what publishes it (``cover``; extras_uploader.py
``acked``): every log the writer itself publishes later with at least
``count`` rows holds them (its log only grows), and when its copy already
equalled the published log, any published log with at least ``cover`` rows
does (published logs grow as sets: deletes_merger.py). Rows of a growing
shard are not held: that shard is searched on its writer until it is
published, and its published log is copied after the delete.

Nothing is held without cluster mode, and a node holding nothing pays one
dict lookup per search. What is held lives in memory: a restart forgets it
(the delete is then seen as on other nodes: docs/cluster.md).

Threads: connection threads admit, hold and read. The entry per collection
(:class:`_Held`) is immutable and replaced whole under ``_lock``, as are the
counters; readers take an entry without the lock.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from shardmgr.cluster.config import NodeConfig
from shardmgr.cluster.errors import DeletesBacklog
from shardmgr.cluster.published.mirror import EMPTY, ClusterState
from shardmgr.errors import RowDeleted
from shardmgr.store import ROW_BITS, View

DEFAULT_MAX_ROWS = NodeConfig().max_held_deletes
PART = "acked"
"""Prefix of the parts a writer's answer to a forwarded delete lists its acknowledged rows in."""


@dataclasses.dataclass(frozen=True, slots=True)
class Acked:
    """Acknowledged deleted rows of one sealed shard, and what publishes them (module docstring)."""

    shard_id: int
    refs: np.ndarray  # int64
    writer: str
    count: int
    #: > 0: any published log of at least this many rows holds them; else only the writer's, of ``count``
    cover: int = 0

    def published(self, state: ClusterState, collection: str) -> bool:
        """Whether a deletes key in ``state`` holds these rows."""
        if self.cover > 0:
            key = state.deletes.get(collection, {}).get(self.shard_id)
            if key is not None and key.deleted >= self.cover:
                return True
        return state.deletes_by.get(collection, {}).get(self.shard_id, {}).get(self.writer, 0) >= self.count

    def seen(self, state: ClusterState, collection: str) -> bool:
        """Whether searches routed by ``state`` skip these rows without being
        told: a deletes key holds them and a live node serves a fresh copy of
        the shard (so routing.py asks fresh copies only)."""
        return self.published(state, collection) and any(
            self.shard_id in state.ready(node, collection) and state.fresh(node, collection, self.shard_id)
            for node in state.members)


@dataclasses.dataclass(frozen=True, slots=True)
class _Held:
    """What one collection holds: ``acked``; their refs sorted and unique, once
    joined (None: not yet); the state they were last pruned at (None: not yet)."""

    acked: tuple[Acked, ...]
    refs: np.ndarray | None = None
    state: ClusterState | None = None

    @property
    def rows(self) -> int:
        return sum(len(a.refs) for a in self.acked)


class AckedDeletes:
    """The rows this node acknowledged as deleted that searches elsewhere may
    not skip yet (module docstring). ``max_rows``: the bound of :meth:`admit`;
    ``publish_now``: called when half of it is held."""

    def __init__(self, max_rows: int = DEFAULT_MAX_ROWS,
                 publish_now: Callable[[], None] = lambda: None) -> None:
        self.max_rows = max_rows
        self.publish_now = publish_now
        #: the watched cluster state that :meth:`admit` prunes by (node.py sets the mirror's)
        self.states: Callable[[], ClusterState] = lambda: EMPTY
        self._held: dict[str, _Held] = {}
        self._rows = 0  # over every collection, as held (a row deleted twice counts twice)
        self._lock = threading.Lock()
        self._last = threading.local()
        self.counters = {"acked_deletes_held_total": 0, "deletes_refused_held_total": 0}

    def admit(self) -> None:
        """Before a delete is written or forwarded: DeletesBacklog (nothing is
        written) if this node holds ``max_rows`` rows or more once those seen
        are dropped."""
        if self._rows < self.max_rows:
            return
        state = self.states()
        for collection, entry in list(self._held.items()):
            self._pruned(collection, entry, state)
        if self._rows < self.max_rows:
            return
        with self._lock:
            self.counters["deletes_refused_held_total"] += 1
        self.publish_now()
        raise DeletesBacklog(
            f"this node holds {self._rows} rows of acknowledged deletes that other nodes' searches may not skip "
            f"yet (max_held_deletes is {self.max_rows}): nothing was deleted; retry once the collection's writer "
            "has published its deletes (within about scan_interval_s)")

    def hold(self, collection: str, acked: Sequence[Acked]) -> None:
        """Hold ``acked`` (before the delete is acknowledged); it is also what
        :meth:`last` returns on this thread."""
        self._last.value = (collection, tuple(acked))
        if not acked:
            return
        rows = sum(len(a.refs) for a in acked)
        with self._lock:
            before = self._held.get(collection)
            self._held[collection] = _Held((*(before.acked if before is not None else ()), *acked))
            self._rows += rows
            self.counters["acked_deletes_held_total"] += rows
            many = self._rows >= self.max_rows // 2
        if many:
            self.publish_now()

    def last(self) -> tuple[str, tuple[Acked, ...]] | None:
        """What this thread held last, once (None: nothing since)."""
        found: tuple[str, tuple[Acked, ...]] | None = getattr(self._last, "value", None)
        self._last.value = None
        return found

    def holds(self, collection: str) -> bool:
        """Whether rows of ``collection`` are held (as of the last search, get or admit that pruned them)."""
        return collection in self._held

    def refs(self, collection: str, states: Callable[[], ClusterState]) -> tuple[ClusterState, np.ndarray | None]:
        """(the state to route a search or get by: ``states()``, the refs held
        for ``collection`` that it does not show seen, sorted and unique, or
        None). Those it shows seen are dropped. What is held is read before
        the state is taken, and states only move forward, so a search that
        took an older state read them before they were dropped."""
        entry = self._held.get(collection)
        state = states()
        if entry is None:
            return state, None
        if entry.state is not state:
            pruned = self._pruned(collection, entry, state)
            if pruned is None:
                return state, None
            entry = pruned
        if entry.refs is None:  # joined once per change (a race joins twice: no harm)
            joined = dataclasses.replace(entry, refs=np.unique(np.concatenate([a.refs for a in entry.acked])))
            with self._lock:
                if self._held.get(collection) is entry:
                    self._held[collection] = joined
            entry = joined
        return state, entry.refs

    def _pruned(self, collection: str, entry: _Held, state: ClusterState) -> _Held | None:
        """``entry`` less what ``state`` shows seen (None: nothing left); it
        replaces the stored entry if that is still ``entry``."""
        kept = tuple(a for a in entry.acked if not a.seen(state, collection))
        pruned = _Held(kept, entry.refs if len(kept) == len(entry.acked) else None, state) if kept else None
        with self._lock:
            if self._held.get(collection) is entry:
                self._rows -= entry.rows - (pruned.rows if pruned is not None else 0)
                if pruned is not None:
                    self._held[collection] = pruned
                else:
                    del self._held[collection]
        return pruned

    def check(self, collection: str, refs: np.ndarray, held: np.ndarray | None) -> None:
        """RowDeleted naming the first of ``refs`` among ``held`` (a get of it)."""
        if held is not None and (gone := np.isin(refs, held)).any():
            raise RowDeleted(f"collection {collection!r}: ref {int(refs[np.argmax(gone)])} was deleted")

    def rows_held(self) -> int:
        return self._rows


def asked(deleted: np.ndarray | None, shards: Sequence[int], unpublished: bool,
          published: np.ndarray) -> np.ndarray | None:
    """Of the refs a search holds (``deleted``), those a node is asked to
    skip: the rows of the published ``shards`` asked of it and, if it is
    asked for its rows not published too (a holder), the rows of every shard
    outside ``published``; None if none."""
    if deleted is None:
        return None
    shard_of = deleted >> np.int64(ROW_BITS)
    mine = np.isin(shard_of, shards)
    found = deleted[mine | ~np.isin(shard_of, published) if unpublished else mine]
    return found if len(found) else None


def written(collection: str, refs: np.ndarray, views: Iterable[View], state: ClusterState,
            writer: str) -> tuple[list[Acked], list[Acked]]:
    """On the writer, just after a delete of ``refs``: (what to hold, of
    which the shards that need a deletes key of the writer's own: the
    writer promises one, extras_uploader.py). ``views``: the collection's
    views after the delete; ``state``: the writer's watched state, which
    has every key published before its tenure (taker.py), and whose keys by
    other nodes this copy has merged (node.py, before the delete)."""
    sealed = {view.shard: view for view in views if view.sealed}
    shards = np.asarray(refs, np.int64) >> np.int64(ROW_BITS)
    keys = state.deletes.get(collection, {})
    held: list[Acked] = []
    promised: list[Acked] = []
    for shard_id in np.unique(shards).tolist():
        view = sealed.get(shard_id)
        if view is None:
            continue  # the growing shard (module docstring), or a row a rewrite moved before cluster mode
        key = keys.get(shard_id)
        # this copy holds every row of ``key`` and as many: the same rows, so any log of as many holds them
        cover = view.deleted_count if key is not None and key.deleted == view.deleted_count else 0
        held.append(Acked(shard_id, np.unique(refs[shards == shard_id]), writer, view.deleted_count, cover))
        if not cover:
            promised.append(held[-1])
    return held, promised


def encode(acked: Iterable[Acked]) -> dict[str, np.ndarray]:
    """The parts of a writer's answer listing ``acked`` (all of one writer)."""
    found = list(acked)
    return {f"{PART}_refs": np.concatenate([a.refs for a in found]) if found else np.zeros(0, np.int64),
            f"{PART}_shards": np.array([[a.shard_id, len(a.refs), a.count, a.cover] for a in found],
                                       np.int64).reshape(-1, 4)}


def decode(parts: Mapping[str, Any], writer: str) -> list[Acked]:
    """The ``acked`` a writer's answer lists (:func:`encode`); ValueError if malformed."""
    refs, shards = parts.get(f"{PART}_refs"), parts.get(f"{PART}_shards")
    if refs is None or shards is None:
        return []  # a writer that lists none (a version before this one)
    refs, shards = np.asarray(refs, np.int64), np.asarray(shards, np.int64)
    if shards.ndim != 2 or shards.shape[1] != 4 or refs.ndim != 1 or int(shards[:, 1].sum()) != len(refs):
        raise ValueError(f"a writer's list of acknowledged deleted rows is malformed ({shards.shape}, {refs.shape})")
    found, start = [], 0
    for shard_id, size, count, cover in shards.tolist():
        found.append(Acked(shard_id, refs[start:start + size], writer, count, cover))
        start += size
    return found
