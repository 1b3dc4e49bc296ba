"""What each node tells the cluster about itself: its rows not yet
published, the uploads failing on it, and that it is still there.

Only a node knows the rows in its own data directory that the shard map
does not hold yet (its growing shard, sealed shards whose upload has not
gone through, deletes of published shards not published), and why an
upload keeps failing. Each node's reporter (thread ``cluster-report``)
puts them in ``<P>/reports/<node-id>`` as one JSON :class:`NodeReport`:

- **when**: every ``report_interval_s`` (1 s) it builds the report; it is
  written when it differs from the last one written, and at least every
  :data:`REFRESH_S` anyway (so a healthy node's report is never older than
  that, and a report's age tells whether its reporter is alive);
- **what**: per collection, each local shard the node's watched shard map
  does not hold (rows, deleted rows, sealed or growing), and each published
  shard here with more deleted rows than are published; the uploads and
  publishes failing now (what, how many tries, since when, the last error);
- **no lease**: a node that dies keeps its last report, so ``cluster
  status`` shows it as *gone* (not a member, with what it held) instead of
  letting it vanish, and ``collection_info`` still counts its unpublished
  rows from it (saying so). A clean stop deletes the key; the next start
  writes it again. Any live node deletes the report of a node that has not
  been a member for ``gone_keep_s`` (its ``at`` older than that).

The counts are as of the report's ``at`` (the node's wall clock): behind
the node's own state by at most ``report_interval_s`` plus one etcd write.
A reader compares ``at`` with its own clock, so node clocks should agree
within a second or so (NTP), as the sweep's grace already assumes.
Readers: the mirror (mirror.py) for ``collection_info`` (counts.py), and
``read_status`` (status.py) for ``cluster status`` and the page.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from shardmgr.cluster.backoff import Failure
from shardmgr.cluster.config import ClusterConfig, NodeConfig, check_node_id
from shardmgr.cluster.errors import ClusterError
from shardmgr.cluster.passes import run_passes
from shardmgr.cluster.state.kv import Kv, delete_op, same_mod
from shardmgr.cluster.state.shard_map import ShardEntry
from shardmgr.errors import UnknownCollection
from shardmgr.store import Store, check_name

log = logging.getLogger(__name__)
T = TypeVar("T")

REFRESH_S = 30.0
"""A report that did not change is written again this often."""
STALE_S = 2 * REFRESH_S + 5.0
"""A member's report older than this (two refreshes missed, plus clock skew) marks the node suspect."""
PRUNE_EVERY_S = REFRESH_S
"""How often a reporter looks for reports of nodes gone longer than ``gone_keep_s``."""
MAX_ERROR_CHARS = 300
"""A failing upload's error as reported (the rest is in the node's log)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ShardCount:
    """A shard in a node's data directory: its rows, deleted rows, and whether it is sealed."""

    rows: int
    deleted: int
    sealed: bool


@dataclasses.dataclass(frozen=True, slots=True)
class FailingUpload:
    """A shard (``what`` "shard"), or its "deletes" or "indexes", whose
    upload or publish is failing on the node (backoff.Failure)."""

    collection: str
    shard_id: int
    what: str
    tries: int
    since: float
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class CollectionReport:
    """One collection on one node: ``unpublished``, its local shards the
    shard map does not hold; ``deleted_here``, the deleted rows of published
    shards here that hold more deletes than are published, by shard id."""

    unpublished: Mapping[int, ShardCount]
    deleted_here: Mapping[int, int]


@dataclasses.dataclass(frozen=True, slots=True)
class NodeReport:
    """A node's report (module docstring); ``at`` in wall-clock seconds;
    ``revision``: the ``applied`` revision of the cluster state it was built
    from (mirror.py; 0: not said), so that a reader can wait until its own
    state reflects as much (query.py)."""

    node_id: str
    address: str
    at: float
    collections: Mapping[str, CollectionReport]
    failing: tuple[FailingUpload, ...]
    uploads_failed_total: int
    revision: int = 0

    def content(self) -> dict[str, Any]:
        """The report without its time: what decides whether it is written again."""
        return {"node": self.node_id, "address": self.address, "uploads_failed_total": self.uploads_failed_total,
                "collections": {name: {"unpublished": {str(i): [c.rows, c.deleted, c.sealed]
                                                       for i, c in sorted(r.unpublished.items())},
                                       "deleted_here": {str(i): n for i, n in sorted(r.deleted_here.items())}}
                                for name, r in sorted(self.collections.items())},
                "failing": [dataclasses.asdict(f) for f in self.failing]}

    def as_json(self) -> dict[str, Any]:
        """The report as JSON values (its key's value; ``shardmgr.report``'s answer)."""
        return {**self.content(), "at": self.at, "revision": self.revision}

    def encode(self) -> bytes:
        return json.dumps(self.as_json(), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, node_id: str, data: bytes) -> NodeReport:
        """The report in ``data``, the value of ``node_id``'s key (ValueError,
        KeyError or TypeError if it is not one)."""
        return cls.from_json(node_id, json.loads(data))

    @classmethod
    def from_json(cls, node_id: str, raw: dict[str, Any]) -> NodeReport:
        """The report in ``raw`` (``as_json``), which must name ``node_id``."""
        if raw["node"] != node_id:
            raise ValueError(f"the report names node {raw['node']!r}")
        collections = {check_name(str(name)): CollectionReport(
            {int(i): ShardCount(int(rows), int(deleted), bool(sealed))
             for i, (rows, deleted, sealed) in c["unpublished"].items()},
            {int(i): int(n) for i, n in c["deleted_here"].items()}) for name, c in raw["collections"].items()}
        failing = tuple(FailingUpload(str(f["collection"]), int(f["shard_id"]), str(f["what"]), int(f["tries"]),
                                      float(f["since"]), str(f["error"])) for f in raw["failing"])
        return cls(check_node_id(node_id), str(raw["address"]), float(raw["at"]), collections, failing,
                   int(raw["uploads_failed_total"]), int(raw.get("revision", 0)))

    def unpublished_rows(self) -> int:
        """Live rows here the shard map does not hold, over every collection (as reported)."""
        return sum(c.rows - c.deleted for r in self.collections.values() for c in r.unpublished.values())


def published_deleted(entry: ShardEntry, deletes: int | None) -> int | None:
    """A published shard's deleted rows as etcd records them: its deletes
    key's count (``deletes``) if it has one, else its entry's (None: not
    recorded, an entry published before entries carried it, with a delete log)."""
    if deletes is not None:
        return deletes
    if entry.deleted is None and not any(o.name == "deletes" for o in entry.objects):
        return 0
    return entry.deleted


def build(node_id: str, address: str, store: Store, published: Mapping[str, Mapping[int, ShardEntry]],
          deletes: Mapping[str, Mapping[int, int]], failing: tuple[FailingUpload, ...],
          uploads_failed_total: int, revision: int = 0) -> NodeReport:
    """This node's report now: ``published``/``deletes``, the shard map and
    the deletes keys' counts as this node watches them, at ``revision``."""
    collections = {}
    for name in store.collections():
        try:
            views = store.collection(name).views()  # a snapshot, no lock
        except UnknownCollection:  # dropped meanwhile
            continue
        entries, counts = published.get(name, {}), deletes.get(name, {})
        unpublished = {v.shard: ShardCount(v.rows, v.deleted_count, v.sealed) for v in views if v.shard not in entries}
        here = {}
        for v in views:
            if v.shard in entries and v.deleted_count:
                known = published_deleted(entries[v.shard], counts.get(v.shard))
                if known is None or v.deleted_count > known:
                    here[v.shard] = v.deleted_count
        if unpublished or here:
            collections[name] = CollectionReport(unpublished, here)
    return NodeReport(node_id, address, time.time(), collections, failing, uploads_failed_total, revision)


def failing_uploads(shards: Mapping[tuple[str, int], Failure],
                    extras: Mapping[tuple[str, int, str], Failure]) -> tuple[FailingUpload, ...]:
    """The uploader's and the extras uploader's failures as report entries, in shard order."""
    found = [FailingUpload(c, i, "shard", f.tries, f.since, f.error[:MAX_ERROR_CHARS])
             for (c, i), f in shards.items()]
    found += [FailingUpload(c, i, kind, f.tries, f.since, f.error[:MAX_ERROR_CHARS])
              for (c, i, kind), f in extras.items()]
    return tuple(sorted(found, key=lambda f: (f.collection, f.shard_id, f.what)))


class Reporter:
    """The node's reporter thread (module docstring). ``make``: this node's
    report now, or None before it joined; ``reports``: every node's report
    and its key's mod_revision, and ``members``: the live members, as the
    node watches them (for the pruning of gone nodes)."""

    def __init__(self, config: ClusterConfig, node: NodeConfig, node_id: str,
                 make: Callable[[], NodeReport | None],
                 reports: Callable[[], Mapping[str, tuple[NodeReport, int]]],
                 members: Callable[[], Mapping[str, str]]) -> None:
        self.config = config
        self.node = node
        self.key = config.key("reports", node_id)
        self._make = make
        self._reports = reports
        self._members = members
        self._kv = Kv(config)
        self._kv_lock = threading.Lock()  # the Kv's one user at a time: the thread, then stop()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._written: dict[str, Any] | None = None
        self._written_at = -float("inf")
        self._pruned_at = -float("inf")
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="cluster-report", daemon=True)
        self.counters = {"reports_written_total": 0}

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        """Report now rather than at the next interval (the node joined, say)."""
        self._wake.set()

    def stop(self, *, remove: bool) -> None:
        """Stop the thread, then (once; best effort) delete this node's report
        if ``remove`` (a clean stop that leaves nothing unpublished), else write
        it one last time. Before the node ever reported, nothing is written or
        deleted: a previous run's report stays until this run replaces it.
        The thread is waited for as long as one etcd request may last; a
        request of its still under way ends before the last write, and it
        makes none after (:meth:`_request`), so the last write is the last."""
        if self._stopped:
            return
        self._stopped = True
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(self.config.etcd_timeout_s)
        with self._kv_lock:
            try:
                report = self._make() if self._written is not None else None
                if report is not None and remove:
                    self._kv.delete(self.key)
                elif report is not None:
                    self._kv.put(self.key, report.encode())
            except ClusterError as e:
                log.warning("the last report of this node (%s) failed: %s", self.key, e)
            self._kv.close()

    def _request(self, call: Callable[[Kv], T]) -> T | None:
        """``call(kv)`` for the thread, unless :meth:`stop` began (None then)."""
        with self._kv_lock:
            return None if self._stop.is_set() else call(self._kv)

    def _run(self) -> None:
        run_passes(self._stop, self._wake, self.node.report_interval_s, self.report_once, "cluster report")

    def report_once(self) -> None:
        """Write the report if it changed or is due; prune gone nodes' reports when due."""
        report = self._make()
        if report is None:
            return
        content = report.content()
        now = time.monotonic()
        if content != self._written or now - self._written_at >= REFRESH_S:
            if self._request(lambda kv: kv.put(self.key, report.encode())) is None:
                return  # stopping: stop() writes the last one
            self._written, self._written_at = content, now
            self.counters["reports_written_total"] += 1
        if now - self._pruned_at >= PRUNE_EVERY_S:
            self._pruned_at = now
            self._prune()

    def _prune(self) -> None:
        members, cutoff = self._members(), time.time() - self.node.gone_keep_s
        for node_id, (report, revision) in self._reports().items():
            if node_id not in members and report.at < cutoff:
                key = self.config.key("reports", node_id)
                # only the report read: a node that came back meanwhile has written a newer one
                done = self._request(functools.partial(_delete_if_same, key, revision))
                if done:
                    log.info("node %s has not been a member for %.0f s: its report is removed", node_id,
                             self.node.gone_keep_s)


def _delete_if_same(key: str, revision: int, kv: Kv) -> bool:
    """Delete ``key`` if its mod_revision is still ``revision``; whether it did."""
    return kv.txn([same_mod(key, revision)], [delete_op(key)], [], f"delete {key}").succeeded
