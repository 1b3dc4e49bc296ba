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

Fetching one shard: its objects go to ``<id>.tmp/`` with ``ObjectStore.fetch``
(size and crc32c checked against the keys that name them, fsynced), the
directory is renamed into place, and the store opens it with every check of
a reopened shard (header, dimension, sizes, journal). The objects are the
entry's row files, the delete log a reader uses (extras.py: the deletes
key's copy, else the entry's own), and the writer's index files if its
indexes key exists; without them the cache store's indexer builds an index
and the shard is searched exactly meanwhile. A crash mid-fetch leaves a
``.tmp`` directory the next start removes.

When the delete log or the index of a cached shard changes (a later deletes
key, an index published after the shard), the shard is installed again the
same way: the files that did not change are hard-linked from the current
copy, the new ones fetched, and the new directory replaces the old one.

After each change the node's ``serving`` key (mirror.py; leased, so it goes
with the node) lists what it can search now, with the deleted rows of each
copy, and coordinators route by it (to copies that hold the newest
published deletes: routing.py).
A shard no longer given to this node is dropped ``cache_linger_s`` later
(searches routed by an older state still find it) and its files removed.

Each pass first merges the delete logs other nodes published into the
shards of this node's own data directory (deletes_merger.py), so the
published shards it serves from there skip those rows too.

Threads: one ``cluster-cache`` thread owns the fetching, dropping and the
serving key; it is woken by every change of the cluster state, and by
``scan_interval_s``. Searches read the cache store's views concurrently.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from common.journal import Flusher
from common.journal.filesystem import fsync_dir, make_dirs, replace_atomically
from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.errors import ClusterError
from shardmgr.cluster.passes import run_passes
from shardmgr.cluster.published.deletes_merger import DeletesMerger
from shardmgr.cluster.published.mirror import ClusterMirror, ClusterState, serving_value
from shardmgr.cluster.published.placement import owners
from shardmgr.cluster.state.extras import deletes_object
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.cluster.state.shard_map import ShardObject
from shardmgr.errors import ShardmgrError, UnknownCollection
from shardmgr.store import ShardDamaged, Store, layout

log = logging.getLogger(__name__)

CACHE_DIR = "cluster-cache"
"""The cache store's directory inside the node's data directory."""
SOURCES = "sources"
"""Beside the cache store's ``shards/``: per cached shard, the object key each of its files came from."""

Key = tuple[str, int]  # (collection, shard id)


class ShardCache:
    """Fetches, serves and announces this node's share of the published shards (module docstring)."""

    def __init__(self, config: ClusterConfig, node: NodeConfig, node_id: str, store: Store, objects: ObjectStore,
                 mirror: ClusterMirror, lease: Callable[[], NodeLease], flusher: Flusher,
                 merger: DeletesMerger | None = None) -> None:
        self.config = config
        self.node = node
        self.node_id = node_id
        self.store = store
        self.objects = objects
        self.mirror = mirror
        self._lease = lease
        self.merger = merger  # merges newer published deletes into the shards of the node's own store
        self.cache = Store(store.data_dir / CACHE_DIR, store.config, flusher=flusher)
        self.address = ""
        self._kv = Kv(config)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._unwanted: dict[Key, float] = {}  # cached shards no longer ours -> since when
        self._installed: dict[Key, dict[str, str]] = {}  # cached shard -> file name -> object key it came from
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
        run_passes(self._stop, self._wake, self.node.scan_interval_s, lambda: self._pass(self.mirror.state()),
                   "shard cache")

    def _pass(self, state: ClusterState) -> None:
        if not self.address:
            return
        if self.merger is not None:
            self.merger.catch_up(state)
        wanted = self._wanted(state)
        cached = self._cached()
        for key in sorted(wanted):
            if self._stop.is_set() or self._wake.is_set():
                break  # the state changed: plan again (and announce what is ready so far)
            objects = shard_objects(state, *key)
            current = key in cached and self._installed_of(key) == {f: o.key for f, o in objects.items()}
            if not current and self._failed.get(key, 0.0) <= time.monotonic():
                self._fetch(key, objects)
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
            local = self.store.seam.sealed_ids(name)
            wanted.update((name, shard_id) for shard_id in entries
                          if shard_id not in local and self.node_id in owners(live, name, shard_id, replicas))
        return wanted

    def _cached(self) -> set[Key]:
        found: set[Key] = set()
        for name in self.cache.collections():
            found.update((name, view.shard) for view in self.cache.collection(name).views())
        self.counters["shards_cached"] = len(found)
        return found

    def ready(self, state: ClusterState) -> dict[str, set[int]]:
        """What this node can search now, of the published shards: cached, or its own."""
        return self._ready(state)[0]

    def _ready(self, state: ClusterState) -> tuple[dict[str, set[int]], dict[str, dict[int, int]]]:
        """(what this node can search now, the deleted rows of each copy): a
        cached copy holds its installed log's rows; an own copy (not behind
        a log another node published: deletes_merger.py) holds at least the
        rows of the deletes key in ``state``, which is what it reports."""
        ready: dict[str, set[int]] = {}
        deleted: dict[str, dict[int, int]] = {}
        for name in self.cache.collections():
            for view in self.cache.collection(name).views():
                ready.setdefault(name, set()).add(view.shard)
                deleted.setdefault(name, {})[view.shard] = view.deleted_count
        self.counters["shards_cached"] = sum(len(ids) for ids in ready.values())
        late = self.merger.behind(state) if self.merger is not None else set()
        for name, entries in state.published.items():
            ours = {s for s in self.store.seam.sealed_ids(name) & entries.keys() if (name, s) not in late}
            keys = state.deletes.get(name, {})
            cached = deleted.setdefault(name, {})
            cached.update((s, keys[s].deleted) for s in ours - cached.keys() if s in keys)
            ready.setdefault(name, set()).update(ours)
        return ready, deleted

    # ------------------------------------------------------------ fetching

    def _fetch(self, key: Key, objects: dict[str, ShardObject]) -> None:
        """Install the shard from ``objects`` (the files a reader uses now), reusing unchanged files."""
        name, shard_id = key
        have = self._installed_of(key)
        try:
            self._ensure_collection(name)
            final = self.cache.collection(name).shard_path(shard_id)
            tmp = final.with_name(final.name + layout.TMP_SUFFIX)
            fetched = gather_files(self.objects, tmp, objects,
                                   lambda file, obj: final / file if have.get(file) == obj.key else None)
            self.cache.seam.drop_shard(name, shard_id)  # searches ask elsewhere for this instant (not_here)
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            fsync_dir(final.parent)
            rows = self.cache.seam.adopt_shard(name, shard_id)
        except (ClusterError, ShardmgrError, ShardDamaged, OSError) as e:
            self.counters["fetches_failed_total"] += 1
            self._failed[key] = time.monotonic() + self.node.upload_retry_min_s
            log.warning("shard cache: fetching shard %d of %s failed (retried): %s", shard_id, name, e)
            return
        self._failed.pop(key, None)
        self._installed[key] = {file: obj.key for file, obj in objects.items()}
        try:
            make_dirs(self._source(key).parent)
            replace_atomically(self._source(key), json.dumps(self._installed[key], sort_keys=True).encode())
        except OSError as e:  # only costs a download at the next start
            log.warning("shard cache: recording where shard %d of %s came from failed: %s", key[1], key[0], e)
        self.counters["shards_fetched_total"] += 0 if have else 1
        self.counters["bytes_fetched_total"] += sum(objects[file].size for file in fetched)
        log.info("shard cache: serving shard %d of %s (%d rows; fetched %s)", shard_id, name, rows,
                 ", ".join(sorted(fetched)) or "nothing")

    def installed_file(self, name: str, shard_id: int, file: str, object_key: str) -> Path | None:
        """Where the cache holds ``file`` of a shard as fetched from
        ``object_key`` (None if it does not); it may be dropped at any time."""
        if self._installed_of((name, shard_id)).get(file) != object_key:
            return None
        try:
            return self.cache.collection(name).shard_path(shard_id) / file
        except UnknownCollection:
            return None

    def _source(self, key: Key) -> Path:
        """Where the object keys a cached shard's files came from are kept (JSON), across restarts."""
        return self.cache.data_dir / SOURCES / key[0] / f"{key[1]:08d}.json"

    def _installed_of(self, key: Key) -> dict[str, str]:
        """The object key each file of a cached shard came from ({} if unknown: fetched again)."""
        found = self._installed.get(key)
        if found is None:
            try:
                found = {str(f): str(k) for f, k in json.loads(self._source(key).read_bytes()).items()}
            except (OSError, ValueError, AttributeError):
                found = {}
            self._installed[key] = found
        return found

    def _ensure_collection(self, name: str) -> None:
        if name not in self.cache.collections():
            info = self.store.collection_info(name)
            self.cache.create_collection(name, info["dim"], info["metric"], info["index"])

    def _drop_unwanted(self, wanted: set[Key]) -> None:
        now = time.monotonic()
        for key in self._cached() - wanted:
            since = self._unwanted.setdefault(key, now)
            if now - since >= self.node.cache_linger_s:
                directory = self.cache.seam.drop_shard(*key)
                if directory is not None:
                    shutil.rmtree(directory, ignore_errors=True)
                    fsync_dir(directory.parent)
                self._unwanted.pop(key, None)
                self._installed.pop(key, None)
                self._source(key).unlink(missing_ok=True)
                self.counters["shards_dropped_total"] += 1
                log.info("shard cache: shard %d of %s dropped (served elsewhere now)", key[1], key[0])
        for key in [k for k in self._unwanted if k in wanted]:
            del self._unwanted[key]

    def _announce(self, state: ClusterState) -> None:
        """Put this node's serving key if what it can search changed (or its lease did)."""
        lease = self._lease()
        if not lease.alive():
            return
        value = serving_value(self.node_id, self.address, *self._ready(state))
        if self._announced == (lease.id, value):
            return
        self._kv.put(self.config.key("serving", self.node_id), value, lease=lease.id)
        self._announced = (lease.id, value)


def gather_files(store: ObjectStore, tmp: Path, objects: dict[str, ShardObject],
                 local: Callable[[str, ShardObject], Path | None]) -> list[str]:
    """Make the directory ``tmp`` anew with the files ``objects`` names: each
    hard-linked from ``local(file, object)`` if that names a copy of the same
    object (such a file never changes; gone since is fine), else fetched and
    checked against the object's size and crc32c; then fsynced. Returns the
    names of the files fetched."""
    shutil.rmtree(tmp, ignore_errors=True)
    make_dirs(tmp)
    fetched = []
    for file, obj in objects.items():
        source = local(file, obj)
        try:
            if source is None:
                raise FileNotFoundError(file)
            os.link(source, tmp / file)
        except FileNotFoundError:
            store.fetch(obj.key, tmp / file, size=obj.size, crc=obj.crc32c)
            fetched.append(file)
    fsync_dir(tmp)
    return fetched


def shard_objects(state: ClusterState, name: str, shard_id: int) -> dict[str, ShardObject]:
    """The files a reader of a published shard uses now, by file name: its row
    files, the delete log (extras.deletes_object) and the writer's index files."""
    entry = state.published[name][shard_id]
    objects = {obj.name: obj for obj in entry.objects if obj.name != layout.DELETES}
    deletes = deletes_object(entry, state.deletes.get(name, {}).get(shard_id))
    if deletes is not None:
        objects[layout.DELETES] = deletes
    index = state.indexes.get(name, {}).get(shard_id)
    objects.update((obj.name, obj) for obj in (index.files if index is not None else ()))
    return objects
