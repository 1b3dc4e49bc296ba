"""A node's cluster life (docs/cluster.md): joining, the writer rule for its
store, upload on seal, the orphan sweep, and stepping down when its lease
is lost. The server (shardmgr/server/server.py) only calls the four steps
below; without ``--cluster`` none of this exists.

Life:

- **Construction** (before the store recovers): the store is told to start
  shards only under granted ids (``Store.shard_ids_granted``), its write
  check (``Store.gate``) is this node, and a seal wakes the node's thread
  (``Store.on_sealed``). The server gives the store ``cluster_store_config``:
  rewrites off (they would replace published shards).
- :meth:`start` (the store has recovered; the port is not open): grant a
  lease; publish the local collections in the catalog, create the catalog's
  other collections locally, and watch it for new ones; start the node's
  thread.
- :meth:`join` (the port is bound; the ready file not yet written): become a
  member with the advertised address, waiting up to ``join_timeout_s`` for a
  previous run's key of the same node id to expire. Writes are refused
  (``unavailable``) until then.
- :meth:`stop` (clean stop: connections closed, the store still open): stop
  the thread (bounded; an upload in flight is abandoned, its publish would
  be fenced); hand off: seal and publish what it writes (within
  ``hand_off_s``) and drop its holder keys; resign every writer role,
  leave, revoke the lease.

Lease loss (``NodeLease.on_lost``, on whichever thread saw it): step down
from every writer role at once; refuse writes (``unavailable``); wake the
node's thread, which revokes the old lease (best effort: its keys go at
once), takes a new one and joins again.

The write check (``Store.gate``): *creating* publishes the collection in the
catalog (``CollectionConflict`` for other parameters) and, if this call
created it there, campaigns for its writer role; *writing* creates the
collection locally if only the catalog knows it yet, then asks
``WriterRoles.ensure`` (``WriterElsewhere`` if another node writes it).

The node's thread (``cluster-node``), woken by seals and every
``scan_interval_s``: rejoins after a loss; reserves shard ids ahead
(``WriterRoles.maintain``); campaigns for collections that have local sealed
shards not published (after a crash between upload and publish, say);
uploads and publishes (uploader.py); sweeps orphans of the collections it
writes (sweep.py) at each new tenure and every ``sweep_interval_s``.

Threads: the gate runs on connection threads (its etcd client, the
catalog's, under ``_catalog_lock``; the roles have their own); the catalog
watch creates collections on its thread; the node's thread has its own etcd
client; ``start``/``join``/``stop`` run on the server's main thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re
import socket
import threading
import time
from pathlib import Path
from typing import Any

import crc32c
import numpy as np

from shardmgr.cluster.cache import ShardCache
from shardmgr.cluster.catalog import Catalog, CollectionMeta, check_same
from shardmgr.cluster.config import ClusterConfig, NodeConfig, check_node_id
from shardmgr.cluster.election import Writer
from shardmgr.cluster.errors import ClusterError, CoordinationUnavailable, NodeIdTaken
from shardmgr.cluster.fanout import FanOut
from shardmgr.cluster.kv import Kv
from shardmgr.cluster.lease import NodeLease
from shardmgr.cluster.lookup import Lookup
from shardmgr.cluster.membership import Membership
from shardmgr.cluster.mirror import ClusterMirror, holder_value
from shardmgr.cluster.objects import ObjectStore
from shardmgr.cluster.peers import Peers
from shardmgr.cluster.roles import WriterRoles
from shardmgr.cluster.shard_map import ShardMap
from shardmgr.cluster.shard_search import ShardSearch
from shardmgr.cluster.sweep import sweep_orphans
from shardmgr.cluster.uploader import Uploader
from shardmgr.cluster.watch import PrefixWatch
from shardmgr.errors import BadVectors, CollectionConflict, ShardmgrError, UnknownCollection
from shardmgr.store import batch, index
from shardmgr.store.config import StoreConfig
from shardmgr.store.search import Hits, SearchResult
from shardmgr.store.store import Store

log = logging.getLogger(__name__)

STOP_WAIT_S = 5.0
"""How long a clean stop waits for the node's thread (an upload under way) before going on."""
ERROR_PAUSE_S = 1.0
"""The node's thread's pause after a pass failed unexpectedly."""


def default_node_id(data_dir: Path) -> str:
    """``<host name>-<crc32c of the data directory's absolute path>``: the
    same for every run on one directory, different for two directories."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0])[:100]
    host = host if host[:1].isalnum() else f"n{host}"
    return check_node_id(f"{host}-{crc32c.crc32c(str(data_dir.resolve()).encode()):08x}")


def cluster_store_config(store: StoreConfig) -> StoreConfig:
    """``store`` with rewrites and merges off: a rewrite replaces sealed
    shards by a new one, and published shards are never replaced (yet)."""
    if store.rewrite_live_fraction or store.merge_below_fraction:
        log.info("cluster mode: shard rewrites and merges are off (published shards are never replaced)")
    return dataclasses.replace(store, rewrite_live_fraction=0.0, merge_below_fraction=0.0)


class ClusterNode:
    """This process as a node of the cluster ``config`` (module docstring)."""

    def __init__(self, config: ClusterConfig, node: NodeConfig, store: Store, node_id: str,
                 peer_options: dict[str, Any] | None = None) -> None:
        self.config = config
        self.node = node.validate()
        self.node_id = check_node_id(node_id)
        self.store = store
        self.address: str | None = None  # advertised, once joined
        self.lease = NodeLease(config, name=node_id)  # granted by start()
        self.objects = ObjectStore(config)
        self._kv = Kv(config)  # the main thread's (start, join, stop)
        self._thread_kv = Kv(config)  # the node thread's (rejoin, sweep)
        self._catalog = Catalog(config)
        self._catalog_lock = threading.Lock()
        self._known: dict[str, CollectionMeta] = {}  # the catalog as this node has seen it
        self._conflicting: dict[str, str] = {}  # local collections whose parameters differ from the catalog's
        self._joined = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._swept: dict[str, tuple[int, float]] = {}  # collection -> (tenure revision, when) of the last sweep
        self.roles = WriterRoles(config, self.node, self.node_id, store, self.lease, self._wake.set)
        self.uploader = Uploader(config, self.node, store, self.objects, self._fenced)
        self._watch: PrefixWatch | None = None
        self._thread = threading.Thread(target=self._run, name="cluster-node", daemon=True)
        # the query side: the state searches are routed by, the shards this node serves, the coordinator
        self.mirror = ClusterMirror(config, Kv(config))
        self.cache = ShardCache(config, self.node, self.node_id, store, self.objects, self.mirror,
                                lambda: self.lease, store.flusher)
        self.shard_search = ShardSearch(store, self.cache.cache)
        self.peers = Peers(**(peer_options or {}))
        self.fanout = FanOut(self.node_id, store, self.mirror, self.shard_search, self.peers)
        self.lookup = Lookup(self.fanout)
        self._released: dict[str, int] = {}  # collection -> passes seen not written here with nothing unpublished
        # holder keys (mirror.py): writes let through and not yet done, and whether the key says "clean"
        self._holding = threading.Lock()
        self._inflight: dict[str, int] = {}
        self._clean: dict[str, bool] = {}
        self.roles.on_tenure = self._tenure_started
        self.counters = {"leases_lost_total": 0, "rejoins_total": 0, "orphans_swept_total": 0}
        store.shard_ids_granted = True
        store.gate = self
        store.on_sealed.append(lambda _name, _shard: self._wake.set())

    # ------------------------------------------------------------------- life

    def start(self) -> None:
        """Lease, catalog, watch, thread (module docstring)."""
        self.lease.start()
        self.lease.on_lost(self._lost)
        with self._catalog_lock:
            for name in self.store.collections():
                info = self.store.collection_info(name)
                meta = CollectionMeta(name, info["dim"], info["metric"], info["index"])
                try:
                    self._catalog.publish(meta)
                except CollectionConflict as e:
                    self._conflict(name, str(e))
            known, revision = self._catalog.read()
        for meta in known.values():
            self._adopt(meta)
        self._watch = self._catalog.watch(self._adopt, start_revision=revision, on_reset=self._reread)
        self.mirror.start()
        self.cache.start()
        self._thread.start()
        log.info("cluster node %s: etcd %s, objects %s, %d collections known", self.node_id, self.config.etcd_url,
                 self.config.s3_url, len(self._known))

    def join(self, address: str) -> None:
        """Become a member reached at ``address`` (NodeIdTaken if a previous
        run's key does not expire within ``join_timeout_s``)."""
        if address.rsplit(":", 1)[0] in ("0.0.0.0", "::", "[::]"):
            log.warning("advertising %s, which no other machine can reach: set --advertise HOST:PORT", address)
        self._join(self.lease, address, Membership(self.config, self._kv))
        self.address = address
        self.cache.announce(address)
        self._wake.set()

    def _join(self, lease: NodeLease, address: str, members: Membership) -> None:
        deadline = time.monotonic() + self.node.join_timeout_s
        while True:
            try:
                members.join(self.node_id, lease, address)
                break
            except NodeIdTaken:
                if time.monotonic() > deadline or self._stop.is_set():
                    raise
                time.sleep(min(0.5, self.config.lease_ttl_s / 4))
        log.info("joined the cluster as %s at %s (lease %x)", self.node_id, address, lease.id)
        self._joined.set()

    def stop(self) -> None:
        """Clean stop (module docstring); safe after a failed or partial start."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(STOP_WAIT_S)
        if self._watch is not None:
            self._watch.stop()
        self.cache.stop()
        self.mirror.stop()
        self.fanout.close()
        self.peers.close()
        self._joined.clear()
        try:
            self._hand_off()
            self.roles.resign_all()
            if self.address is not None and self.lease.alive():
                Membership(self.config, self._kv).leave(self.node_id, self.lease)
        except ClusterError as e:
            log.warning("leaving the cluster cleanly failed (the lease ends it): %s", e)
        self.lease.close(revoke=True)
        for closable in (self.roles, self.uploader, self._catalog.kv, self._kv, self._thread_kv, self.objects):
            closable.close()
        log.info("left the cluster (%s)", self.node_id)

    def _hand_off(self) -> None:
        """A clean stop of a writer: seal the growing shard of each collection it
        writes, publish every sealed shard (within ``hand_off_s``), and stop
        being a holder of each collection whose rows are then all published,
        so searches stay complete while this node is gone."""
        held = self.roles.held()
        if not held or not self.lease.alive():
            return
        for name in held:
            with contextlib.suppress(UnknownCollection), self.store.frozen():
                self.store.collection(name).seal_idle(math.inf)  # every growing shard with rows
        deadline = threading.Event()
        timer = threading.Timer(self.node.hand_off_s, deadline.set)
        timer.start()
        try:
            self.uploader.run_once(held, deadline)
        finally:
            timer.cancel()
        for name in held:
            if self.uploader.unpublished(name):
                log.warning("%s: stopping with sealed shards not published; searches name this node until it "
                            "is back", name)
            else:
                self._kv.delete(self._holder_key(name))

    def stats(self) -> dict[str, float | int]:
        return {"member": int(self._joined.is_set()), "writer_roles": len(self.roles.held()), **self.counters,
                **self.roles.counters, **self.uploader.counters, **self.cache.counters, **self.fanout.counters}

    # ------------------------------------------------------------ searches

    def search(self, name: str, queries: Any, k: int, params: dict[str, int] | None) -> SearchResult:
        """A search of the whole collection across the cluster (fanout.py)."""
        return self.fanout.search(name, queries, k, params)

    def rows(self, name: str, refs: Any) -> tuple[np.ndarray, np.ndarray]:
        """Rows by ref wherever they are in the cluster (lookup.py)."""
        return self.lookup.rows(name, refs)

    def rows_here(self, name: str, refs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """This node's part of another node's get: (vectors, ids, here) (shard_search.py)."""
        return self.shard_search.rows(name, batch.refs(refs, self.store.config.max_batch_rows))

    def search_shards(self, name: str, queries: Any, k: int, params: dict[str, int] | None, shards: list[int],
                      unpublished: bool, exclude: Any) -> tuple[Hits, list[int]]:
        """This node's part of another node's search (shard_search.py), its input checked here."""
        collection = self.store.collection(name)
        checked = batch.vectors(queries, collection.dim, "queries", max_rows=self.store.config.max_queries)
        k = batch.k(k, self.store.config.max_k)
        chosen = index.check_params(params)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in shards):
            raise BadVectors(f"shards must be a list of shard ids (integers), got {shards!r:.200}")
        return self.shard_search.search(name, checked, k, chosen, shards, unpublished, batch.refs(exclude))

    # ----------------------------------------------------- the store's gate

    def creating(self, name: str, dim: int, metric: str, index: str) -> None:
        """Before a create: publish it in the catalog; campaign if this call created it there."""
        meta = CollectionMeta(name, dim, metric, index)
        known = self._known.get(name)
        if known is not None:
            check_same(known, meta)
            return
        with self._catalog_lock:
            created = self._catalog.publish(meta)
        self._known[name] = meta
        if created and self._joined.is_set():
            try:
                self.roles.campaign(name)
            except ClusterError as e:  # the first append campaigns again
                log.warning("campaigning for the writer of the new collection %s failed: %s", name, e)

    def writing(self, name: str) -> None:
        """Before an append or delete: the writer rule (module docstring)."""
        if not self._joined.is_set():
            raise CoordinationUnavailable(f"collection {name!r}: this node ({self.node_id}) is not a member of the "
                                          "cluster right now (starting, or rejoining after its lease was lost): retry")
        if name in self._conflicting:
            raise CollectionConflict(self._conflicting[name])
        try:
            self.store.collection(name)
        except UnknownCollection:
            with self._catalog_lock:
                meta = self._catalog.get(name)
            if meta is None:
                return  # the store says unknown_collection
            self._adopt(meta)
        self.roles.ensure(name)
        with self._holding:  # mark the holder key "not clean" before the write can be acknowledged
            if self._clean.get(name):
                self._kv.put(self._holder_key(name), holder_value(self.node_id, clean=False))
                self._clean[name] = False
            self._inflight[name] = self._inflight.get(name, 0) + 1

    def written(self, name: str) -> None:
        """After a write ``writing`` let through (done or failed)."""
        with self._holding:
            self._inflight[name] -= 1

    # ------------------------------------------------------------- catalog

    def _adopt(self, meta: CollectionMeta) -> None:
        """Know ``meta`` and have the collection locally (the watch's thread, or a writer's)."""
        self._known[meta.name] = meta
        try:
            self.store.create_collection(meta.name, meta.dim, meta.metric, meta.index)
        except ShardmgrError as e:  # other parameters here, or an index this node's faiss refuses
            self._conflict(meta.name, str(e))

    def _conflict(self, name: str, why: str) -> None:
        self._conflicting[name] = (f"collection {name!r} on this node differs from the cluster's: {why}; "
                                   f"writes to it are refused here")
        log.error("%s", self._conflicting[name])

    def _reread(self) -> None:
        """The watch missed events (compaction): read the catalog again."""
        with self._catalog_lock:
            known, _ = self._catalog.read()
        for meta in known.values():
            self._adopt(meta)

    # ---------------------------------------------------------- lease loss

    def _lost(self, lease: NodeLease) -> None:
        if lease is not self.lease or self._stop.is_set():
            return
        self._joined.clear()
        self.counters["leases_lost_total"] += 1
        self.roles.step_down_all(f"this node's lease {lease.id:x} was lost")
        self._wake.set()

    def _fenced(self, name: str, token: Writer, why: str) -> None:
        self.roles.step_down(name, why, token)

    def _rejoin(self) -> None:
        old = self.lease
        with contextlib.suppress(ClusterError):  # best effort: its member and writer keys go at once
            self._thread_kv.revoke(old.id)
        old.close(revoke=False)
        lease = NodeLease(self.config, name=self.node_id).start()
        try:
            assert self.address is not None
            self._join(lease, self.address, Membership(self.config, self._thread_kv))
        except BaseException:
            lease.close()
            raise
        if self._stop.is_set():  # stop() went on without this thread: leave nothing behind
            lease.close()
            return
        self.lease = self.roles.lease = lease
        lease.on_lost(self._lost)
        self.counters["rejoins_total"] += 1

    # ---------------------------------------------------------- the thread

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.node.scan_interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._pass()
            except ClusterError as e:
                log.warning("cluster node %s: %s (retried)", self.node_id, e)
                self._stop.wait(ERROR_PAUSE_S)
            except Exception:
                log.exception("cluster node %s: a pass failed (retried)", self.node_id)
                self._stop.wait(ERROR_PAUSE_S)

    def _pass(self) -> None:
        if self.address is None:
            return  # not joined yet
        if not self.lease.alive():  # also notices a deadline passed while the process was paused
            self._rejoin()
        self.roles.maintain()
        for name in self.store.collections():
            if name not in self._conflicting and name not in self.roles.held() and self.uploader.unpublished(name) \
                    and self.roles.campaign(name):
                log.info("writer of %s: to publish its sealed shards held here", name)
        held = self.roles.held()
        self.uploader.run_once(held, self._stop)
        self._release_holdings(held)
        for name in held:
            self._mark_clean(name)
        for name, token in self.roles.held().items():
            if name in held and not self._stop.is_set():
                self._sweep(name, token)

    def _tenure_started(self, name: str) -> None:
        with self._holding:
            self._clean[name] = False

    def _holder_key(self, name: str) -> str:
        return self.config.key("holders", name, self.node_id)

    def _all_published(self, name: str) -> bool:
        """No row of ``name`` here that is not published (growing shard empty, every sealed one published)."""
        try:
            growing = self.store.collection(name).active
        except UnknownCollection:
            return True
        return not (growing is not None and growing.rows) and not self.uploader.unpublished(name)

    def _mark_clean(self, name: str) -> None:
        """Say in the holder key that every row held here is published, when
        it is and no write is under way: a holder that dies clean makes no
        search partial. Under ``_holding``, so no write can slip in between
        the check and the put (``writing`` marks it back first)."""
        with self._holding:
            if self._clean.get(name) or self._inflight.get(name, 0) or not self._all_published(name):
                return
            self._thread_kv.put(self._holder_key(name), holder_value(self.node_id, clean=True))
            self._clean[name] = True

    def _release_holdings(self, held: dict[str, Writer]) -> None:
        """Delete this node's holder key of each collection it no longer writes
        once every row it holds there is published (mirror.py), seen so on two
        passes in a row: an append that passed the writer check just before a
        step-down has landed by then."""
        state = self.mirror.state()
        for name, nodes in state.holders.items():
            if self.node_id not in nodes or name in held or name in self._conflicting:
                self._released.pop(name, None)
                continue
            if not self._all_published(name):
                self._released.pop(name, None)
                continue
            self._released[name] = self._released.get(name, 0) + 1
            if self._released[name] >= 2:
                self._thread_kv.delete(self._holder_key(name))
                log.info("%s: every row held here is published; no longer a holder", name)

    def _sweep(self, name: str, token: Writer) -> None:
        revision, when = self._swept.get(name, (0, 0.0))
        if revision == token.revision and time.monotonic() - when < self.node.sweep_interval_s:
            return
        shard_map = ShardMap(self.config, name, self._thread_kv)
        swept = sweep_orphans(self.objects, shard_map, token, self.node.sweep_grace_s, self._thread_kv)
        self._swept[name] = (token.revision, time.monotonic())
        self.counters["orphans_swept_total"] += swept
