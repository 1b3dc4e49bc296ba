"""This node's copy of the cluster state that searches are routed by.

One watch over the cluster's whole key prefix keeps, decoded, the keys that
decide where a collection's rows are searched:

| key | held as |
|---|---|
| ``<P>/members/<node>`` | node id -> advertised address (live members only: the keys are leased) |
| ``<P>/shards/<collection>/<id>`` | the published shards: collection -> shard id -> ShardEntry |
| ``<P>/holders/<collection>/<node>`` | nodes that may hold rows of the collection not yet published (and ``clean``) |
| ``<P>/serving/<node>`` | what each node can search now and its copies' deleted rows (leased; cache.py) |
| ``<P>/writers/<collection>`` | collection -> writer node id |
| ``<P>/deletes/<collection>/<id>`` | a published shard's delete log since its publish (extras.py) |
| ``<P>/indexes/<collection>/<id>`` | a published shard's index files (extras.py) |
| ``<P>/reports/<node>`` | each node's report (report.py), apart from the routing state: :meth:`ClusterMirror.reports` |

A node writes ``holders/<collection>/<node>`` (no lease: it outlives the
node) when it takes the collection's writer role, before any write under
that tenure is acknowledged, and deletes it once it is no longer the writer
and every row it holds of the collection is published. So a collection's
rows are always in its published shards or on a holder. While it holds the
role, the key says ``"clean": true`` whenever every row it holds is
published and no write is under way, and it is set back to false before
the next write is let through (node.py). A holder that is not a live member
and not clean is what makes a search ``partial``.

:meth:`ClusterMirror.state` returns an immutable :class:`ClusterState`,
rebuilt only after a change (a search takes it at no cost). Keys that do
not decode are logged once and ignored: one bad key never stops routing.

A report changes every few seconds on a busy node and routes nothing, so a
change of one neither rebuilds the state nor calls the listeners.

Threads: the watch thread applies events under ``_lock``; any thread reads
``state()``; listeners run on the watch thread and must be quick.

**Revisions.** ``ClusterState.applied`` is the newest mod_revision the
state reflects; a node's report and its search replies carry it, so that
another node can wait until its own mirror reflects as much
(:meth:`ClusterMirror.caught_up`) before it counts or routes by it
(query.py, cluster_client.py).

**Fresh copies.** A published shard's delete log grows (extras.py), so a
node may serve a copy older than the newest deletes key. Each node's
serving key says how many deleted rows each copy it serves holds, and a
copy is *fresh* (:meth:`ClusterState.fresh`) if it holds at least as many
as the deletes key in this state, or if its node published that key (it
holds its own log, a superset). Published logs of a shard only grow as
sets (deletes_merger.py), so a fresh copy holds every row of that key.
The state also keeps the most rows each node was seen to publish for a
shard (``deletes_by``), so no key is missed between two snapshots
(acked_deletes.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.extras import DeletesEntry, IndexEntry
from shardmgr.cluster.state.kv import Entry, Kv
from shardmgr.cluster.state.report import NodeReport
from shardmgr.cluster.state.shard_map import ShardEntry
from shardmgr.cluster.state.watch import PrefixWatch, WatchEvent

log = logging.getLogger(__name__)

CATCH_UP_POLL_S = 0.005
"""How often ``caught_up`` looks at the watched revision (events arrive within milliseconds)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterState:
    """The routing state at one point of this node's watch (never mutated)."""

    revision: int
    members: Mapping[str, str]
    published: Mapping[str, Mapping[int, ShardEntry]]
    #: collection -> holder node -> clean (every row it holds is published)
    holders: Mapping[str, Mapping[str, bool]]
    serving: Mapping[str, Mapping[str, frozenset[int]]]
    writers: Mapping[str, str]
    #: collection -> shard id -> the extras keys (extras.py)
    deletes: Mapping[str, Mapping[int, DeletesEntry]] = dataclasses.field(default_factory=dict)
    indexes: Mapping[str, Mapping[int, IndexEntry]] = dataclasses.field(default_factory=dict)
    #: node -> collection -> shard id -> deleted rows of the copy it serves (from its serving key; absent: 0)
    copies: Mapping[str, Mapping[str, Mapping[int, int]]] = dataclasses.field(default_factory=dict)
    #: collection -> shard id -> node -> the most deleted rows a deletes key that node published held
    deletes_by: Mapping[str, Mapping[int, Mapping[str, int]]] = dataclasses.field(default_factory=dict)
    #: the newest mod_revision among the changes this state reflects: another node's mirror that has
    #: caught up to it (``ClusterMirror.caught_up``) reflects them too (``revision`` may be a read's header
    #: revision, which another node's watch need not reach)
    applied: int = 0

    def ready(self, node: str, collection: str) -> frozenset[int]:
        """The published shards of ``collection`` that ``node`` says it can search now."""
        return self.serving.get(node, {}).get(collection, frozenset())

    def fresh(self, node: str, collection: str, shard_id: int) -> bool:
        """Whether ``node``'s copy of a published shard holds every row of its
        deletes key in this state (module docstring)."""
        key = self.deletes.get(collection, {}).get(shard_id)
        return key is None or key.node == node \
            or self.copies.get(node, {}).get(collection, {}).get(shard_id, 0) >= key.deleted


EMPTY = ClusterState(0, {}, {}, {}, {}, {})


def holder_value(node: str, *, clean: bool) -> bytes:
    """The JSON of a node's ``holders`` key."""
    return json.dumps({"node": node, "clean": clean}, separators=(",", ":")).encode()


def serving_value(node: str, address: str, collections: Mapping[str, frozenset[int] | set[int]],
                  deleted: Mapping[str, Mapping[int, int]] | None = None) -> bytes:
    """The JSON of a node's ``serving`` key; ``deleted``: the deleted rows of
    each copy served (copies without any are left out)."""
    counts = {c: {str(s): n for s, n in sorted(shards.items()) if n} for c, shards in sorted((deleted or {}).items())}
    return json.dumps({"node": node, "address": address,
                       "collections": {c: sorted(ids) for c, ids in sorted(collections.items()) if ids},
                       "deleted": {c: shards for c, shards in counts.items() if shards}},
                      separators=(",", ":")).encode()


class ClusterMirror:
    """Members, published shards, holders, serving sets and writers, kept current by a watch."""

    def __init__(self, config: ClusterConfig, kv: Kv) -> None:
        self.config = config
        self._kv = kv
        self._root = config.key("")
        self._lock = threading.Lock()
        self._members: dict[str, str] = {}
        self._published: dict[str, dict[int, ShardEntry]] = {}
        self._holders: dict[str, dict[str, bool]] = {}
        self._serving: dict[str, dict[str, frozenset[int]]] = {}
        self._writers: dict[str, str] = {}
        self._deletes: dict[str, dict[int, DeletesEntry]] = {}
        self._indexes: dict[str, dict[int, IndexEntry]] = {}
        self._reports: dict[str, tuple[NodeReport, int]] = {}  # node -> (report, its key's mod_revision)
        self._copies: dict[str, dict[str, dict[int, int]]] = {}
        self._deletes_by: dict[str, dict[int, dict[str, int]]] = {}
        self._revision = 0
        self._applied = 0
        self._state: ClusterState | None = EMPTY
        self._listeners: list[Callable[[], None]] = []
        self._watch: PrefixWatch | None = None

    def start(self) -> ClusterMirror:
        revision = self._reread()
        self._watch = PrefixWatch(self.config, self._root, self._event, start_revision=revision + 1,
                                  on_reset=self._reset, name="mirror").start()
        return self

    def read(self) -> ClusterState:
        """Read the state from etcd now, without a watch (tools, tests)."""
        self._reread()
        return self.state()

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (on the watch thread) after each change."""
        self._listeners.append(listener)

    def state(self) -> ClusterState:
        state = self._state
        if state is not None:
            return state
        with self._lock:
            if self._state is None:
                self._state = ClusterState(
                    self._revision, dict(self._members), {c: dict(m) for c, m in self._published.items()},
                    {c: dict(n) for c, n in self._holders.items() if n},
                    {n: dict(s) for n, s in self._serving.items()}, dict(self._writers),
                    {c: dict(m) for c, m in self._deletes.items()}, {c: dict(m) for c, m in self._indexes.items()},
                    dict(self._copies), {c: {s: dict(n) for s, n in m.items()} for c, m in self._deletes_by.items()},
                    self._applied)
            return self._state

    def reports(self) -> dict[str, tuple[NodeReport, int]]:
        """Every node's report (report.py), with its key's mod_revision: a copy."""
        with self._lock:
            return dict(self._reports)

    def caught_up(self, revision: int, timeout: float) -> bool:
        """Whether this mirror has applied every change of the prefix up to
        ``revision`` (a mod_revision, or another mirror's ``applied``),
        waiting up to ``timeout`` seconds for its watch."""
        deadline = time.monotonic() + timeout
        while self._revision < revision:
            if time.monotonic() >= deadline:
                return False
            time.sleep(CATCH_UP_POLL_S)
        return True

    def _reset(self) -> None:
        self._reread()

    def _reread(self) -> int:
        entries, revision = self._kv.get_prefix(self._root)
        with self._lock:
            for table in (self._members, self._published, self._holders, self._serving, self._writers,
                          self._deletes, self._indexes, self._reports, self._copies, self._deletes_by):
                table.clear()
            for e in entries:
                self._apply(e.key, e, deleted=False)
            self._revision, self._state = revision, None
            self._applied = max([self._applied, *(e.mod_revision for e in entries)])
        self._notify()
        return revision

    def _event(self, event: WatchEvent) -> None:
        routes = not event.entry.key.startswith(self._root + "reports/")
        with self._lock:
            self._apply(event.entry.key, event.entry, deleted=event.kind == "DELETE")
            self._revision = self._applied = event.entry.mod_revision
            if routes:
                self._state = None
        if routes:
            self._notify()

    def _notify(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:  # a listener's bug must not stop the watch
                log.exception("cluster mirror: a listener failed")

    def _apply(self, key: str, e: Entry, *, deleted: bool) -> None:
        parts = key[len(self._root):].split("/")
        try:
            self._apply_parts(parts, None if deleted else e.value, e.mod_revision)
        except (ValueError, KeyError, TypeError) as exc:
            log.error("cluster mirror: key %s does not decode (ignored): %s", key, exc)

    def _apply_parts(self, parts: list[str], value: bytes | None, revision: int) -> None:
        kind = parts[0]
        if kind == "members" and len(parts) == 2:
            _set(self._members, parts[1], None if value is None else str(json.loads(value).get("address", "")))
        elif kind == "writers" and len(parts) == 2:
            _set(self._writers, parts[1], None if value is None else str(json.loads(value)["node"]))
        elif kind == "shards" and len(parts) == 3:
            entries = self._published.setdefault(parts[1], {})
            _set(entries, int(parts[2]), None if value is None else ShardEntry.decode(value))
        elif kind == "holders" and len(parts) == 3:
            nodes = self._holders.setdefault(parts[1], {})
            _set(nodes, parts[2], None if value is None else bool(json.loads(value).get("clean", False)))
        elif kind == "deletes" and len(parts) == 3:
            shard_id = int(parts[2])
            entry = None if value is None else DeletesEntry.decode(parts[1], shard_id, value)
            _set(self._deletes.setdefault(parts[1], {}), shard_id, entry)
            if entry is not None:
                seen = self._deletes_by.setdefault(parts[1], {}).setdefault(shard_id, {})
                seen[entry.node] = max(seen.get(entry.node, 0), entry.deleted)
        elif kind == "indexes" and len(parts) == 3:
            shard_id = int(parts[2])
            _set(self._indexes.setdefault(parts[1], {}), shard_id,
                 None if value is None else IndexEntry.decode(parts[1], shard_id, value))
        elif kind == "serving" and len(parts) == 2:
            raw = None if value is None else json.loads(value)
            _set(self._serving, parts[1], None if raw is None else _serving(raw))
            _set(self._copies, parts[1], None if raw is None else _copies(raw))
        elif kind == "reports" and len(parts) == 2:
            _set(self._reports, parts[1], None if value is None else (NodeReport.decode(parts[1], value), revision))


def _set(table: dict[Any, Any], key: Any, value: Any) -> None:
    if value is None:
        table.pop(key, None)
    else:
        table[key] = value


def _serving(raw: dict[str, Any]) -> dict[str, frozenset[int]]:
    return {str(c): frozenset(int(i) for i in ids) for c, ids in raw["collections"].items()}


def _copies(raw: dict[str, Any]) -> dict[str, dict[int, int]]:
    return {str(c): {int(s): int(n) for s, n in shards.items()} for c, shards in raw.get("deleted", {}).items()}
