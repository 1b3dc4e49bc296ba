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
- :meth:`start` (the store has recovered; the port is bound, not open):
  grant a lease (a wrong etcd address is one line: ``cannot reach etcd at
  HOST:PORT: connection refused``); take the node id, as a member with the
  advertised address (membership.hold_id: refused at once naming the holder
  if another process has it; waited for, and logged, up to
  ``join_timeout_s`` if it is this data directory's previous run's key);
  put and delete a probe object (no credentials, access denied, no such
  bucket or an unreachable endpoint refuse the start, in one line);
  publish the local collections in the catalog, create the catalog's other
  collections locally, and watch it for new ones; start the node's thread.
- :meth:`join` (the port is open; the ready file not yet written): take
  writes (refused as ``unavailable`` until then), announce what it serves,
  start the thread's passes.
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
``WriterRoles.ensure`` (``WriterElsewhere`` if another node writes it);
*deleting* takes the published shards the delete names (taker.py) and
merges what other nodes published of them; *deleted* holds the rows until
they are published (acked_deletes.py).

The node's thread (``cluster-node``), woken by seals and every
``scan_interval_s``: rejoins after a loss; reserves shard ids ahead
(``WriterRoles.maintain``); campaigns for collections that have local sealed
shards not published (after a crash between upload and publish, say), or
deletes or indexes of published shards not published;
uploads and publishes (uploader.py), then the deletes and indexes of
published shards (extras_uploader.py); sweeps orphans of the collections it
writes (sweep.py) at each new tenure and every ``sweep_interval_s``.

Threads: the gate runs on connection threads (the catalog's etcd client
under its lock, node_catalog.py; the roles have their own); the catalog
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

import crc32c
import numpy as np

from shardmgr.cluster.config import ClusterConfig, NodeConfig, check_node_id
from shardmgr.cluster.errors import ClusterError, CoordinationUnavailable, transport_reason
from shardmgr.cluster.passes import run_passes
from shardmgr.cluster.published import acked_deletes
from shardmgr.cluster.published.deletes_merger import DeletesMerger
from shardmgr.cluster.query.query import QueryRouter
from shardmgr.cluster.state.election import Writer
from shardmgr.cluster.state.kv import TLS_PORT_HINT, Kv
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.membership import Membership, data_id, hold_id
from shardmgr.cluster.state.node_catalog import NodeCatalog
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.cluster.state.report import NodeReport, Reporter, build, failing_uploads
from shardmgr.cluster.state.shard_map import ShardMap
from shardmgr.cluster.state.watch import PrefixWatch
from shardmgr.cluster.writer.extras_uploader import ExtrasUploader
from shardmgr.cluster.writer.forwarding import Forwarder
from shardmgr.cluster.writer.holdings import Holdings
from shardmgr.cluster.writer.roles import WriterRoles
from shardmgr.cluster.writer.sweep import sweep_orphans
from shardmgr.cluster.writer.taker import ShardTaker
from shardmgr.cluster.writer.uploader import Uploader
from shardmgr.errors import CollectionConflict, UnknownCollection
from shardmgr.store import Store, StoreConfig

log = logging.getLogger(__name__)

STOP_WAIT_S = 5.0
"""How long a clean stop waits for the node's thread (an upload under way) before going on."""


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

    def __init__(self, config: ClusterConfig, node: NodeConfig, store: Store, node_id: str) -> None:
        self.config = config
        self.node = node.validate()
        self.node_id = check_node_id(node_id)
        self.store = store
        self.address: str | None = None  # advertised, once joined
        self._advertised = ""  # the address in the member key start() takes
        self.data_id = ""  # its data directory's (membership.data_id), read by start()
        self.lease = NodeLease(config, name=node_id)  # granted by start()
        self.objects = ObjectStore(config)
        self._kv = Kv(config)  # the main thread's (start, join, stop)
        self._thread_kv = Kv(config)  # the node thread's (rejoin, sweep)
        self.catalog = NodeCatalog(config, store)
        self._joined = threading.Event()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._swept: dict[str, tuple[int, float]] = {}  # collection -> (tenure revision, when) of the last sweep
        self.roles = WriterRoles(config, self.node, self.node_id, store, self.lease, self._wake.set)
        self.uploader = Uploader(config, self.node, store, self.objects, self._fenced)
        self.merger = DeletesMerger(self.node_id, store, self.objects)
        self.extras = ExtrasUploader(config, self.node, store, self.objects, self.uploader, self._fenced,
                                     self._wake.set, self.merger)
        # deletes this node acknowledged, until other nodes' searches skip them; many wake the thread to publish
        self.acked = acked_deletes.AckedDeletes(self.node.max_held_deletes, self._wake.set)
        self.forwarder = Forwarder(self.node, self.node_id, acked=self.acked)  # the server hands it to the service
        self._watch: PrefixWatch | None = None
        self._thread = threading.Thread(target=self._run, name="cluster-node", daemon=True)
        # the query side (the server hands it to the store service) and the holder keys
        # searches and gets of other nodes present the node's credentials, as forwards do
        self.query = QueryRouter(config, self.node, self.node_id, store, self.objects, lambda: self.lease,
                                 {"token": self.forwarder.token, "tls": self.forwarder.tls or False}, self.merger,
                                 self.acked)
        self.taker = ShardTaker(store, self.objects, self.query.mirror, self.query.cache, self.merger)
        self.holdings = Holdings(config, self.node_id, self._all_published)
        self.query.report_here, self.acked.states = self._report, self.query.mirror.state
        self.reporter = Reporter(config, self.node, self.node_id, self._report, self.query.mirror.reports,
                                 lambda: self.query.mirror.state().members)
        self.roles.on_tenure = self.holdings.tenure_started
        self.counters = {"leases_lost_total": 0, "rejoins_total": 0, "orphans_swept_total": 0}
        store.shard_ids_granted = True
        store.gate = self
        store.on_sealed.append(lambda _name, _shard: self._wake.set())

    # ------------------------------------------------------------------- life

    def start(self, address: str) -> None:
        """Lease, node id, object store, catalog, watch, thread (module docstring)."""
        try:
            self.lease.start()
        except CoordinationUnavailable as e:  # the first request to etcd: say what is wrong in one line
            hint = TLS_PORT_HINT if TLS_PORT_HINT in str(e) else ""
            raise type(e)(f"cannot reach etcd at {self.config.etcd_host}:{self.config.etcd_port}: "
                          f"{transport_reason(e, self.config.etcd_timeout_s)}{hint}") from e
        # (a refusal, CoordinationDenied or CoordinationError, already says what etcd refused in one line)
        self.lease.on_lost(self._lost)
        self.data_id = data_id(self.store.data_dir)  # (the server holds the directory's lock)
        self._hold_id(self.lease, address, Membership(self.config, self._kv))
        self._advertised = address
        self.objects.probe(self.node_id)
        self._watch = self.catalog.start()
        self.query.start()
        self._thread.start()
        self.reporter.start()
        log.info("cluster node %s: etcd %s, objects %s, %d collections known", self.node_id, self.config.etcd_url,
                 self.config.s3_url, len(self.catalog))

    def join(self) -> None:
        """The port is open: take writes, announce what this node serves, start the thread's passes."""
        address = self._advertised
        if address.rsplit(":", 1)[0] in ("0.0.0.0", "::", "[::]"):
            log.warning("advertising %s, which no other machine can reach: set --advertise HOST:PORT", address)
        self.address = address
        self._joined.set()
        log.info("joined the cluster as %s at %s (lease %x)", self.node_id, address, self.lease.id)
        self.query.announce(address)
        self.reporter.wake()
        self._wake.set()

    def _hold_id(self, lease: NodeLease, address: str, members: Membership) -> None:
        """Be the member ``node_id`` under ``lease`` (membership.hold_id: NodeIdTaken at once if another
        process holds it, after up to ``join_timeout_s`` if this data directory's previous run does)."""
        hold_id(members, self.node_id, lease, address, self.data_id, self.node.join_timeout_s, self._stop)

    def stop(self) -> None:
        """Clean stop (module docstring); safe after a failed or partial start."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(STOP_WAIT_S)
        if self._watch is not None:
            self._watch.stop()
        self.query.stop()
        self._joined.clear()
        try:
            self._hand_off()
            # a node leaving rows unpublished keeps its report: it shows as gone, with what it holds
            self.reporter.stop(remove=all(self._all_published(name) and not self.extras.unpublished(name)
                                          for name in self.store.collections()))
            self.roles.resign_all()
            if self.address is not None and self.lease.alive():
                Membership(self.config, self._kv).leave(self.node_id, self.lease)
        except ClusterError as e:
            log.warning("leaving the cluster cleanly failed (the lease ends it): %s", e)
        self.reporter.stop(remove=False)  # (no-op after the one above; else only the thread, if that failed)
        self.lease.close(revoke=True)
        for closable in (self.roles, self.uploader, self.extras, self.catalog, self._kv, self._thread_kv,
                         self.objects, self.forwarder):
            closable.close()
        if self._advertised:
            log.info("left the cluster (%s)", self.node_id)

    def _hand_off(self) -> None:
        """A clean stop of a writer: seal the growing shard of each collection it
        writes, publish every sealed shard, then its later deletes and indexes
        (within ``hand_off_s``), and stop
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
            self.extras.run_once(held, deadline)  # deletes since the last pass, and indexes built
        finally:
            timer.cancel()
        self.holdings.hand_off(held, self._kv)

    def stats(self) -> dict[str, float | int]:
        return {"member": int(self._joined.is_set()), "writer_roles": len(self.roles.held()), **self.counters,
                **self.roles.counters, **self.uploader.counters, **self.extras.counters, **self.query.counters,
                **self.merger.counters, **self.taker.counters, **self.reporter.counters, **self.acked.counters,
                "acked_rows_held": self.acked.rows_held(), **self.forwarder.counters}

    # ----------------------------------------------------- the store's gate

    def creating(self, name: str, dim: int, metric: str, index: str) -> None:
        """Before a create: publish it in the catalog; campaign if this call created it there."""
        if self.catalog.creating(name, dim, metric, index) and self._joined.is_set():
            try:
                self.roles.campaign(name)
            except ClusterError as e:  # the first append campaigns again
                log.warning("campaigning for the writer of the new collection %s failed: %s", name, e)

    def writing(self, name: str) -> None:
        """Before an append or delete: the writer rule (module docstring)."""
        if not self._joined.is_set():
            raise CoordinationUnavailable(f"collection {name!r}: this node ({self.node_id}) is not a member of the "
                                          "cluster right now (starting, or rejoining after its lease was lost): retry")
        conflict = self.catalog.conflict(name)
        if conflict is not None:
            raise CollectionConflict(conflict)
        if not self.catalog.ensure_local(name):
            return  # the store says unknown_collection
        self.roles.ensure(name)
        self.holdings.writing(name, self._kv)  # the holder key says "not clean" before the write is acknowledged

    def written(self, name: str) -> None:
        """After a write ``writing`` let through (done or failed)."""
        self.holdings.written(name)

    def deleting(self, name: str, shards: frozenset[int] | None) -> None:
        """Before a delete is written: the published shards it names, taken
        here (taker.py); then the writer rule once more, since a take may
        download for a while."""
        token = self.roles.held().get(name)
        if token is not None:  # (None: the role was lost an instant ago; ensure says so below)
            self.taker.take(name, shards, token.revision, float(self.node.lease_ttl_s))
            self.merger.merge_named(self.query.mirror.state(), name, shards)  # what deleted() says then holds
        self.roles.ensure(name)

    def deleted(self, name: str, refs: np.ndarray) -> None:
        """After a delete of ``refs`` was written (and made durable if asked),
        before it is acknowledged: hold its rows until they are published
        (acked_deletes.py), and promise the deletes keys that will say so."""
        held, promised = acked_deletes.written(name, refs, self.store.collection(name).views(),
                                               self.query.mirror.state(), self.node_id)
        for acked in promised:
            self.extras.promise(name, acked.shard_id, acked.count)
        self.acked.hold(name, held)

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
            self._hold_id(lease, self.address, Membership(self.config, self._thread_kv))
            log.info("joined the cluster again as %s at %s (lease %x)", self.node_id, self.address, lease.id)
            self._joined.set()
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
        run_passes(self._stop, self._wake, self.node.scan_interval_s, self._pass, f"cluster node {self.node_id}")

    def _pass(self) -> None:
        if self.address is None:
            return  # not joined yet
        if not self.lease.alive():  # also notices a deadline passed while the process was paused
            self._rejoin()
        self.roles.maintain()
        conflicting = self.catalog.conflicting()
        for name in self.store.collections():
            if name not in conflicting and name not in self.roles.held() \
                    and (self.uploader.unpublished(name) or self.extras.unpublished(name)) \
                    and self.roles.campaign(name):
                log.info("writer of %s: to publish its sealed shards (or their deletes or indexes) held here", name)
        held = self.roles.held()
        self.uploader.run_once(held, self._stop)
        self.extras.run_once(held, self._stop)
        self.holdings.release(self.query.mirror.state(), held, conflicting, self._thread_kv)
        self.holdings.mark_clean(held, self._thread_kv)
        for name, token in self.roles.held().items():
            if name in held and not self._stop.is_set():
                self._sweep(name, token)

    def _report(self) -> NodeReport | None:
        """This node's report now (report.py), None before it joined."""
        if self.address is None:
            return None
        state = self.query.mirror.state()
        deletes = {name: {i: d.deleted for i, d in shards.items()} for name, shards in state.deletes.items()}
        failing = failing_uploads(self.uploader.failures(), self.extras.failures())
        failed = self.uploader.counters["uploads_failed_total"] + self.extras.counters["extras_failed_total"]
        return build(self.node_id, self.address, self.store, state.published, deletes, failing, failed, state.applied)

    def _all_published(self, name: str) -> bool:
        """No row of ``name`` here that is not published (growing shard empty, every sealed one published)."""
        try:
            growing = self.store.collection(name).active
        except UnknownCollection:
            return True
        return not (growing is not None and growing.rows) and not self.uploader.unpublished(name)

    def _sweep(self, name: str, token: Writer) -> None:
        revision, when = self._swept.get(name, (0, 0.0))
        if revision == token.revision and time.monotonic() - when < self.node.sweep_interval_s:
            return
        shard_map = ShardMap(self.config, name, self._thread_kv)
        swept = sweep_orphans(self.objects, shard_map, token, self.node.sweep_grace_s, self._thread_kv)
        self._swept[name] = (token.revision, time.monotonic())
        self.counters["orphans_swept_total"] += swept
