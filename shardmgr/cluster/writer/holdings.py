"""This node's holder keys (mirror.py): which collections it may hold rows
of that are not published, and whether all it holds is published now.

- A tenure's start writes the key ``{"clean": false}`` (roles.py, before any
  write of the tenure is acknowledged) and :meth:`Holdings.tenure_started`
  records that.
- :meth:`writing` (the store's gate, before each append or delete it lets
  through) sets the key back to ``{"clean": false}`` if it said clean, and
  counts the write in flight; :meth:`written` counts it done.
- :meth:`mark_clean` (the node's thread, for each collection it writes):
  when no write is in flight and every row held here is published, the key
  says ``{"clean": true}``. A clean holder that dies makes no search partial.
- :meth:`release` (the node's thread): once the node no longer writes a
  collection and every row it holds there is published, seen so on two
  passes in a row (an append that passed the writer check just before a
  step-down has landed by then), the key is deleted.

Threads: ``writing``/``written`` run on connection threads, the rest on the
node's thread (or the main thread at a clean stop). Every change of the
counts and flags, and each put it implies, is under ``_lock``: no write can
slip in between the check of :meth:`mark_clean` and its put.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.published.mirror import ClusterState, holder_value
from shardmgr.cluster.state.kv import Kv

log = logging.getLogger(__name__)


class Holdings:
    """This node's holder keys; ``all_published(name)`` says whether every row of ``name`` here is published."""

    def __init__(self, config: ClusterConfig, node_id: str, all_published: Callable[[str], bool]) -> None:
        self.config = config
        self.node_id = node_id
        self._all_published = all_published
        self._lock = threading.Lock()
        self._inflight: dict[str, int] = {}
        self._clean: dict[str, bool] = {}
        self._released: dict[str, int] = {}  # collection -> passes seen released

    def key(self, name: str) -> str:
        return self.config.key("holders", name, self.node_id)

    def tenure_started(self, name: str) -> None:
        with self._lock:
            self._clean[name] = False

    def writing(self, name: str, kv: Kv) -> None:
        with self._lock:
            if self._clean.get(name):
                kv.put(self.key(name), holder_value(self.node_id, clean=False))
                self._clean[name] = False
            self._inflight[name] = self._inflight.get(name, 0) + 1

    def written(self, name: str) -> None:
        with self._lock:
            self._inflight[name] -= 1

    def mark_clean(self, names: Iterable[str], kv: Kv) -> None:
        for name in names:
            with self._lock:
                if self._clean.get(name) or self._inflight.get(name, 0) or not self._all_published(name):
                    continue
                kv.put(self.key(name), holder_value(self.node_id, clean=True))
                self._clean[name] = True

    def release(self, state: ClusterState, held: Iterable[str], skip: Iterable[str], kv: Kv) -> None:
        """Delete the key of each collection this node holds but no longer writes, all published."""
        keep = set(held) | set(skip)
        for name, nodes in state.holders.items():
            if self.node_id not in nodes or name in keep or not self._all_published(name):
                self._released.pop(name, None)
                continue
            self._released[name] = self._released.get(name, 0) + 1
            if self._released[name] >= 2:
                kv.delete(self.key(name))
                log.info("%s: every row held here is published; no longer a holder", name)

    def hand_off(self, names: Iterable[str], kv: Kv) -> None:
        """At a clean stop: delete the key of each collection whose rows here are all published."""
        for name in names:
            if self._all_published(name):
                kv.delete(self.key(name))
            else:
                log.warning("%s: stopping with rows not published; searches name this node until it is back", name)
