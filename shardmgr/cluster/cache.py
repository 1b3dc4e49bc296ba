"""The published shards this node serves: fetched from object storage into
a local cache, checked, memory-mapped, and announced.

The cache is a store of its own in ``DATA/cluster-cache`` (the same layout
as ``DATA/shards``: one directory per collection, one per shard), holding
sealed shards only. It is disposable: deleting it loses nothing, the next
start fetches again. A node serves

- the published shards rendezvous hashing gives it (placement.py,
  ``replicas`` owners per shard over the live members), fetched here; and
- the published shards it wrote itself, from its own data directory (no
  fetch: the same bytes).

Fetching one shard: each of its entry's objects goes to ``<id>.tmp/`` with
``ObjectStore.fetch`` (size and crc32c checked against the entry, fsynced),
the directory is renamed into place, and the store opens it with every
check of a reopened shard (header, dimension, sizes, journal). A crash
mid-fetch leaves a ``.tmp`` directory the next start removes. An index
(index.faiss) in the directory is loaded; without one the cache store's
indexer builds it, and the shard is searched exactly meanwhile.

After each change the node's ``serving`` key (mirror.py; leased, so it goes
with the node) lists what it can search now, and coordinators route by it.
A shard no longer given to this node is dropped ``cache_linger_s`` later
(searches routed by an older state still find it) and its files removed.

Threads: one ``cluster-cache`` thread owns the fetching, dropping and the
serving key; it is woken by every change of the cluster state, and by
``scan_interval_s``. Searches read the cache store's views concurrently.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable

from common.journal import Flusher
from common.journal.filesystem import fsync_dir, make_dirs
from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.errors import ClusterError
from shardmgr.cluster.kv import Kv
from shardmgr.cluster.lease import NodeLease
from shardmgr.cluster.mirror import ClusterMirror, ClusterState, serving_value
from shardmgr.cluster.objects import ObjectStore
from shardmgr.cluster.placement import owners
from shardmgr.cluster.shard_map import ShardEntry
from shardmgr.errors import ShardmgrError, UnknownCollection
from shardmgr.store.shard import TMP_SUFFIX
from shardmgr.store.store import Store

log = logging.getLogger(__name__)

CACHE_DIR = "cluster-cache"
"""The cache store's directory inside the node's data directory."""

Key = tuple[str, int]  # (collection, shard id)


class ShardCache:
    """Fetches, serves and announces this node's share of the published shards (module docstring)."""

    def __init__(self, config: ClusterConfig, node: NodeConfig, node_id: str, store: Store, objects: ObjectStore,
                 mirror: ClusterMirror, lease: Callable[[], NodeLease], flusher: Flusher) -> None:
        self.config = config
        self.node = node
        self.node_id = node_id
        self.store = store
        self.objects = objects
        self.mirror = mirror
        self._lease = lease
        self.cache = Store(store.data_dir / CACHE_DIR, store.config, flusher=flusher)
        self.address = ""
        self._kv = Kv(config)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._unwanted: dict[Key, float] = {}  # cached shards no longer ours -> since when
        self._failed: dict[Key, float] = {}  # fetches that failed -> when to try again
        self._announced: tuple[int, bytes] | None = None  # (lease id, value) last put
        self._thread = threading.Thread(target=self._run, name="cluster-cache", daemon=True)
        self.counters = {"shards_fetched_total": 0, "bytes_fetched_total": 0, "fetches_failed_total": 0,
                         "shards_dropped_total": 0, "shards_cached": 0}

    def start(self) -> None:
        self.cache.open()
        self.mirror.on_change(self._wake.set)
        self._thread.start()

    def announce(self, address: str) -> None:
        """Start announcing (the node joined, reached at ``address``)."""
        self.address = address
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(5.0)
        self.cache.close()
        self._kv.close()

    # ---------------------------------------------------------- the thread

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.node.scan_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._pass(self.mirror.state())
            except ClusterError as e:
                log.warning("shard cache: %s (retried)", e)
                self._stop.wait(1.0)
            except Exception:
                log.exception("shard cache: a pass failed (retried)")
                self._stop.wait(1.0)

    def _pass(self, state: ClusterState) -> None:
        if not self.address:
            return
        wanted = self._wanted(state)
        for key in sorted(wanted - self._cached()):
            if self._stop.is_set() or self._wake.is_set():
                break  # the state changed: plan again (and announce what is ready so far)
            if self._failed.get(key, 0.0) <= time.monotonic():
                self._fetch(key, state.published[key[0]][key[1]])
                self._announce(state)
        self._drop_unwanted(wanted)
        self._announce(state)

    def _wanted(self, state: ClusterState) -> set[Key]:
        """The published shards this node should hold in its cache now."""
        live = sorted(state.members)
        if self.node_id not in state.members:
            return set()  # not a member (rejoining): others serve; keep what is cached until it lingers out
        replicas, wanted = self.node.replicas, set[Key]()
        for name, entries in state.published.items():
            local = self._local(name)
            wanted.update((name, shard_id) for shard_id in entries
                          if shard_id not in local and self.node_id in owners(live, name, shard_id, replicas))
        return wanted

    def _local(self, name: str) -> set[int]:
        """The sealed shards of ``name`` in this node's own data directory."""
        try:
            return {v.shard for v in self.store.collection(name).views() if v.sealed}
        except UnknownCollection:
            return set()

    def _cached(self) -> set[Key]:
        found: set[Key] = set()
        for name in self.cache.collections():
            found.update((name, view.shard) for view in self.cache.collection(name).views())
        self.counters["shards_cached"] = len(found)
        return found

    def ready(self, state: ClusterState) -> dict[str, set[int]]:
        """What this node can search now, of the published shards: cached, or its own."""
        ready: dict[str, set[int]] = {}
        for name, shard_id in self._cached():
            ready.setdefault(name, set()).add(shard_id)
        for name, entries in state.published.items():
            ready.setdefault(name, set()).update(self._local(name) & entries.keys())
        return ready

    # ------------------------------------------------------------ fetching

    def _fetch(self, key: Key, entry: ShardEntry) -> None:
        name, shard_id = key
        try:
            self._ensure_collection(name)
            final = self.cache.collection(name).shard_path(shard_id)
            tmp = final.with_name(final.name + TMP_SUFFIX)
            shutil.rmtree(tmp, ignore_errors=True)
            make_dirs(tmp)
            for obj in entry.objects:
                self.objects.fetch(obj.key, tmp / obj.name, size=obj.size, crc=obj.crc32c)
            shutil.rmtree(final, ignore_errors=True)  # a shard dropped earlier, not yet removed
            tmp.rename(final)
            fsync_dir(final.parent)
            rows = self.cache.adopt_shard(name, shard_id)
        except (ClusterError, ShardmgrError, OSError) as e:
            self.counters["fetches_failed_total"] += 1
            self._failed[key] = time.monotonic() + self.node.upload_retry_min_s
            log.warning("shard cache: fetching shard %d of %s failed (retried): %s", shard_id, name, e)
            return
        self._failed.pop(key, None)
        self.counters["shards_fetched_total"] += 1
        self.counters["bytes_fetched_total"] += sum(obj.size for obj in entry.objects)
        log.info("shard cache: serving shard %d of %s (%d rows) fetched from %s", shard_id, name, rows,
                 self.objects.url(entry.objects[0].key.rsplit("/", 1)[0]))

    def _ensure_collection(self, name: str) -> None:
        if name not in self.cache.collections():
            info = self.store.collection_info(name)
            self.cache.create_collection(name, info["dim"], info["metric"], info["index"])

    def _drop_unwanted(self, wanted: set[Key]) -> None:
        now = time.monotonic()
        for key in self._cached() - wanted:
            since = self._unwanted.setdefault(key, now)
            if now - since >= self.node.cache_linger_s:
                directory = self.cache.drop_shard(*key)
                if directory is not None:
                    shutil.rmtree(directory, ignore_errors=True)
                    fsync_dir(directory.parent)
                self._unwanted.pop(key, None)
                self.counters["shards_dropped_total"] += 1
                log.info("shard cache: shard %d of %s dropped (served elsewhere now)", key[1], key[0])
        for key in [k for k in self._unwanted if k in wanted]:
            del self._unwanted[key]

    def _announce(self, state: ClusterState) -> None:
        """Put this node's serving key if what it can search changed (or its lease did)."""
        lease = self._lease()
        if not lease.alive():
            return
        value = serving_value(self.node_id, self.address, self.ready(state))
        if self._announced == (lease.id, value):
            return
        self._kv.put(self.config.key("serving", self.node_id), value, lease=lease.id)
        self._announced = (lease.id, value)

