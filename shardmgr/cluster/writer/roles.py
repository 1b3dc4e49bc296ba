"""This node's writer roles: the collections it writes now, each with its
tenure's fencing token and the shard ids reserved for it.

The rule (docs/cluster.md, "One writer per collection"): a node appends to
or deletes from a collection only while it holds the collection's writer
role. :meth:`WriterRoles.ensure` is asked before every such write:

- Held (a tenure under the node's current lease, and the lease alive by its
  local deadline): it returns at once, with no lock and no etcd request.
- Not held: one campaign (:meth:`Election.try_acquire`, one transaction).
  Won: the node reserves a block of shard ids for the tenure (fenced,
  shard_map.py) and grants them to the store. Lost: WriterElsewhere naming
  the holder and its address; nothing is written.

Stepping down (:meth:`step_down`, :meth:`step_down_all`): the tenure is
forgotten and the store's shard ids are revoked, so no new shard starts.
An append that passed the check just before may still land in the growing
shard: it stays local (and publishable by a later tenure of this node, under
its own id); the shard map's fence, not this check, is what keeps a stale
writer from publishing.

Threads: the fast path of ``ensure`` reads a dict (replaced, never
mutated); every change of tenures, and every use of this object's etcd
client, is under ``_lock``. The lock is taken before the store's write lock
(grant, revoke), never after it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable

from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.errors import CoordinationError, CoordinationUnavailable, NotWriter, WriterElsewhere
from shardmgr.cluster.published.mirror import holder_value
from shardmgr.cluster.state.election import Election, Writer
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.membership import Member, Membership
from shardmgr.cluster.state.shard_map import ShardMap
from shardmgr.errors import UnknownCollection
from shardmgr.store import Store

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Tenure:
    """One held writer role: the fencing token and the shard ids [first, limit) reserved for it."""

    token: Writer
    first: int
    limit: int
    #: the ids were granted to the local store (the collection exists there)
    granted: bool = False


class WriterRoles:
    """The writer roles of node ``node_id`` under its current ``lease`` (set by the node on each join)."""

    def __init__(self, config: ClusterConfig, node: NodeConfig, node_id: str, store: Store, lease: NodeLease,
                 wake: Callable[[], None]) -> None:
        self.config = config
        self.block = node.shard_id_block
        self.node_id = node_id
        self.store = store
        self.lease = lease
        self._wake = wake  # asks the node's thread to run maintain()
        #: called with the collection's name when a tenure starts (its holder key just said "not clean")
        self.on_tenure: Callable[[str], None] = lambda name: None
        self._kv = Kv(config)
        self._lock = threading.Lock()
        self._tenures: dict[str, Tenure] = {}
        self.counters = {"tenures_total": 0, "step_downs_total": 0, "writes_refused_total": 0}

    def close(self) -> None:
        self._kv.close()

    # ---------------------------------------------------------- the append path

    def ensure(self, name: str) -> None:
        """Return if this node may write ``name`` now (campaigning if no one
        writes it); WriterElsewhere naming the writer otherwise. The local
        collection must exist (the node makes sure of it)."""
        tenure = self._tenures.get(name)
        if tenure is not None and tenure.token.lease == self.lease.id and self.lease.alive() and tenure.granted:
            next_id, _ = self.store.seam.shard_ids(name)
            if next_id < tenure.limit:
                if tenure.limit - next_id <= self.block // 2:
                    self._wake()  # the node's thread reserves the next block
                return
        with self._lock:
            if not self.lease.alive():
                raise CoordinationUnavailable(f"collection {name!r}: this node's cluster lease is lost; it is "
                                              "rejoining the cluster: retry")
            tenure = self._tenures.get(name)
            if tenure is None or tenure.token.lease != self.lease.id:
                tenure = self._campaign(name, refuse=True)
            assert tenure is not None
            self._grant(name, tenure)

    def campaign(self, name: str) -> bool:
        """One campaign for ``name`` (no error if another node writes it); True if this node writes it now."""
        with self._lock:
            tenure = self._tenures.get(name)
            if tenure is not None and tenure.token.lease == self.lease.id:
                return True
            return self._campaign(name, refuse=False) is not None

    def _campaign(self, name: str, *, refuse: bool) -> Tenure | None:
        lease = self.lease
        _, writer = Election(self.config, name, self._kv).try_acquire(self.node_id, lease)
        if writer is not None and (writer.node_id, writer.lease) == (self.node_id, lease.id):
            # ours: just won, or won earlier by a campaign whose id reservation then failed
            try:
                next_id = self.store.seam.shard_ids(name)[0]
            except UnknownCollection:  # created in the cluster, not here yet: its shards come later
                next_id = 1
            first, limit = ShardMap(self.config, name, self._kv).reserve_ids(writer, next_id, self.block)
            # a holder before any write of the tenure is acknowledged (mirror.py): searches ask it from now on
            self._kv.put(self.config.key("holders", name, self.node_id), holder_value(self.node_id, clean=False))
            self.on_tenure(name)
            tenure = Tenure(writer, first, limit)
            self._tenures = {**self._tenures, name: tenure}
            self.counters["tenures_total"] += 1
            log.info("writer of %s now (tenure at revision %d), shard ids %d..%d", name, writer.revision, first,
                     limit - 1)
            return tenure
        if not refuse:
            return None
        self.counters["writes_refused_total"] += 1
        if writer is None:
            raise CoordinationUnavailable(f"collection {name!r}: its writer's lease just ended; retry")
        if writer.node_id == self.node_id:  # our previous lease's key, not yet expired
            raise CoordinationUnavailable(f"collection {name!r} is still held by this node's previous lease "
                                          f"{writer.lease:x}, which expires within {self.config.lease_ttl_s} s; retry")
        address = self._address(writer.node_id)
        raise WriterElsewhere(f"collection {name!r} is written by node {writer.node_id}, not by this node "
                              f"({self.node_id}); send it to the writer, "
                              f"writer_address={address or 'unknown'}")

    def _address(self, node_id: str) -> str | None:
        """Where member ``node_id`` is reached, or None if it is not a member now."""
        found = self._kv.get(Membership(self.config, self._kv).key(node_id))
        return (Member.from_entry(found).address or None) if found is not None else None

    def _grant(self, name: str, tenure: Tenure) -> None:
        """Give the store the tenure's ids, reserving the next block first if
        they are used up; under ``_lock``."""
        next_id, _ = self.store.seam.shard_ids(name)
        if next_id >= tenure.limit:
            tenure = self._extend(name, tenure)
        if not tenure.granted:
            self.store.seam.grant_shard_ids(name, tenure.first, tenure.limit)
            tenure = dataclasses.replace(tenure, granted=True)
            self._tenures = {**self._tenures, name: tenure}

    def _extend(self, name: str, tenure: Tenure) -> Tenure:
        first, limit = ShardMap(self.config, name, self._kv).reserve_ids(tenure.token, tenure.limit, self.block)
        if first != tenure.limit:  # not contiguous (a lost answer of ours reserved a block): start at the new one
            tenure = dataclasses.replace(tenure, first=first)
        tenure = dataclasses.replace(tenure, limit=limit, granted=False)
        log.info("%s: shard ids reserved up to %d", name, limit - 1)
        return tenure

    # ------------------------------------------------------------ maintenance

    def maintain(self) -> None:
        """Reserve the next block of ids for tenures that have used half of
        theirs (the node's thread; appends need not wait for etcd then)."""
        for name, tenure in list(self._tenures.items()):
            if not tenure.granted or self.store.seam.shard_ids(name)[0] < tenure.limit - self.block // 2:
                continue
            with self._lock:
                if self._tenures.get(name) is not tenure:
                    continue
                try:
                    self._grant(name, self._extend(name, tenure))
                except NotWriter as e:
                    self._step_down(name, str(e))
                except CoordinationError as e:
                    log.warning("%s: reserving more shard ids failed (retried): %s", name, e)

    def held(self) -> dict[str, Writer]:
        """The tenures held under the current lease, by collection."""
        lease = self.lease.id
        return {name: t.token for name, t in self._tenures.items() if t.token.lease == lease}

    def step_down(self, name: str, why: str, token: Writer | None = None) -> None:
        """Stop writing ``name`` (only ``token``'s tenure, if given)."""
        with self._lock:
            tenure = self._tenures.get(name)
            if tenure is not None and (token is None or tenure.token == token):
                self._step_down(name, why)

    def step_down_all(self, why: str) -> None:
        with self._lock:
            for name in list(self._tenures):
                self._step_down(name, why)

    def _step_down(self, name: str, why: str, level: int = logging.WARNING) -> None:
        tenure = self._tenures[name]
        self._tenures = {n: t for n, t in self._tenures.items() if n != name}
        self.counters["step_downs_total"] += 1
        with contextlib.suppress(UnknownCollection):
            self.store.seam.revoke_shard_ids(name)
        log.log(level, "stepped down as writer of %s (tenure at revision %d): %s", name, tenure.token.revision, why)

    def resign_all(self) -> None:
        """A clean stop: end every tenure in etcd (others may campaign at
        once) and stop writing; failures leave the keys to the lease."""
        with self._lock:
            for name, tenure in list(self._tenures.items()):
                try:
                    Election(self.config, name, self._kv).resign(tenure.token)
                except CoordinationError as e:
                    log.warning("resigning as writer of %s failed (the lease ends it): %s", name, e)
                self._step_down(name, "stopping", logging.INFO)
