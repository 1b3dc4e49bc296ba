"""Deletes this node acknowledged, held until the copies it reads hold them.

A delete is written on the collection's writer (its own copy of each shard
skips the rows at once) and reaches the other copies of a published shard
only once the writer has published the shard's delete log and each copy has
installed it (extras.py, cache.py). So that a client's acknowledged delete
is seen by its next search and get on the node that acknowledged it,
whichever nodes serve the shards, that node holds the acknowledged rows
here:

- :meth:`AckedDeletes.hold` before the acknowledgement: the writer holds
  its own deletes (the store's gate, node.py); a node that forwarded the
  delete holds what the writer's answer lists (:func:`encode`, forwarding.py).
- Every search from this node sends them to each node it asks
  (``shardmgr.search_shards``'s ``deleted`` part), which skips them inside
  its shard searches as it skips its own deleted rows (shard_search.py): so
  each shard still answers its k best live rows, and the merged answer is
  never short of k while k rows remain. A get of one of them is RowDeleted
  (lookup.py).
- They are dropped once they are published: once this node's watched state
  shows a deletes key that holds them (:meth:`Acked.published`). From then
  on searches go only to copies that hold that key's rows (fresh copies:
  mirror.py, routing.py), so nothing is dropped before every copy asked
  holds it.

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

Threads: connection threads hold and read; the tuple per collection is
replaced whole under ``_lock``, never mutated.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from shardmgr.cluster.mirror import ClusterState
from shardmgr.errors import RowDeleted
from shardmgr.store.refs import ROW_BITS
from shardmgr.store.view import View

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


class AckedDeletes:
    """The rows this node acknowledged as deleted and that are not published yet (module docstring)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[Acked, ...]] = {}
        self._joined: dict[str, tuple[tuple[Acked, ...], np.ndarray]] = {}  # the refs of a held tuple, made once
        self._lock = threading.Lock()
        self._last = threading.local()
        self.counters = {"acked_deletes_held_total": 0}

    def hold(self, collection: str, acked: Sequence[Acked]) -> None:
        """Hold ``acked`` (before the delete is acknowledged); it is also what
        :meth:`last` returns on this thread."""
        self._last.value = (collection, tuple(acked))
        if not acked:
            return
        with self._lock:
            self._held[collection] = (*self._held.get(collection, ()), *acked)
        self.counters["acked_deletes_held_total"] += sum(len(a.refs) for a in acked)

    def last(self) -> tuple[str, tuple[Acked, ...]] | None:
        """What this thread held last, once (None: nothing since)."""
        found: tuple[str, tuple[Acked, ...]] | None = getattr(self._last, "value", None)
        self._last.value = None
        return found

    def refs(self, collection: str, states: Callable[[], ClusterState]) -> tuple[ClusterState, np.ndarray | None]:
        """(the state to route a search or get by: ``states()``, the refs held
        for ``collection`` that it does not show published, sorted and unique,
        or None). Those it shows published are dropped: what is held is read
        before the state is taken, and states only move forward, so a search
        that took an older state read them before they were dropped."""
        held = self._held.get(collection)
        state = states()
        if not held:
            return state, None
        if any(a.published(state, collection) for a in held):
            with self._lock:
                kept = tuple(a for a in self._held.get(collection, ()) if not a.published(state, collection))
                if kept:
                    self._held[collection] = kept
                else:
                    self._held.pop(collection, None)
                    self._joined.pop(collection, None)
            held = tuple(a for a in held if not a.published(state, collection))
        if not held:
            return state, None
        joined = self._joined.get(collection)
        if joined is None or joined[0] is not held:  # (a race makes it twice: no harm)
            joined = self._joined[collection] = (held, np.unique(np.concatenate([a.refs for a in held])))
        return state, joined[1]

    def check(self, collection: str, refs: np.ndarray, held: np.ndarray | None) -> None:
        """RowDeleted naming the first of ``refs`` among ``held`` (a get of it)."""
        if held is not None and (gone := np.isin(refs, held)).any():
            raise RowDeleted(f"collection {collection!r}: ref {int(refs[np.argmax(gone)])} was deleted")

    def rows_held(self) -> int:
        return sum(len(a.refs) for held in list(self._held.values()) for a in held)


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


def decode(parts: dict[str, Any], writer: str) -> list[Acked]:
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
