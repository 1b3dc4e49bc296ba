"""Cluster membership: who is alive, as etcd's leases say.

A node is a member while ``<key_prefix>/members/<node-id>`` exists. The key
is created attached to the node's :class:`NodeLease`, so it disappears when
the lease ends: revoked on a clean stop, or expired TTL seconds after the
node's last keepalive (crash, pause, partition). Its value is JSON
(``{"node": ..., "address": ...}``): where peers and clients reach the node.

Guarantees: ``join`` is atomic (create-if-absent in one transaction), so two
processes can never both be member ``n1``; ``members()`` is one consistent
read at one revision; ``watch`` delivers joins and leaves after that
revision in order (see watch.py for what happens when the stream drops).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Literal

from shardmgr.cluster.config import ClusterConfig, check_node_id
from shardmgr.cluster.errors import NodeIdTaken
from shardmgr.cluster.kv import Entry, Kv, delete_op, put_op, range_op, same_create, same_lease
from shardmgr.cluster.lease import NodeLease
from shardmgr.cluster.watch import PrefixWatch, WatchEvent


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """A live node: its id, where it is reached, its lease, and the revision it joined at."""

    node_id: str
    address: str
    lease: int
    joined_revision: int

    @classmethod
    def from_entry(cls, e: Entry) -> Member:
        info = json.loads(e.value)
        return cls(node_id=e.key.rsplit("/", 1)[1], address=str(info.get("address", "")), lease=e.lease,
                   joined_revision=e.create_revision)


@dataclasses.dataclass(frozen=True, slots=True)
class MemberEvent:
    """A node joined or left (its key was created or deleted) at ``revision``."""

    kind: Literal["joined", "left"]
    node_id: str
    revision: int
    #: the member that joined; None for a leave
    member: Member | None


class Membership:
    """The members of one cluster (``config.key_prefix``)."""

    def __init__(self, config: ClusterConfig, kv: Kv | None = None) -> None:
        self.config = config
        self.kv = kv if kv is not None else Kv(config)
        self.prefix = config.key("members", "")

    def key(self, node_id: str) -> str:
        return self.prefix + check_node_id(node_id)

    def join(self, node_id: str, lease: NodeLease, address: str = "") -> Member:
        """Register ``node_id`` under ``lease``. Atomic: fails with NodeIdTaken
        if the key exists (another process with this id, or this node's
        previous run until its lease expires); LeaseLost if the lease is no
        longer alive."""
        lease.check()
        key = self.key(node_id)
        value = json.dumps({"node": node_id, "address": address}).encode()
        result = self.kv.txn([same_create(key, 0)], [put_op(key, value, lease.id), range_op(key)], [range_op(key)],
                             f"join as {node_id}")
        current = result.ranges[0][0] if result.ranges and result.ranges[0] else None
        if not result.succeeded or current is None:
            holder = f"lease {current.lease:x}" if current is not None else "a lease that just ended"
            raise NodeIdTaken(f"node id {node_id!r} is already a member on etcd {self.kv.endpoint} ({holder}); "
                              f"a previous run's key expires within {self.config.lease_ttl_s} s")
        return Member.from_entry(current)

    def leave(self, node_id: str, lease: NodeLease) -> bool:
        """Remove ``node_id``'s key if ``lease`` still holds it (never another
        run's); True if it was removed. Revoking the lease does this too."""
        key = self.key(node_id)
        result = self.kv.txn([same_lease(key, lease.id)], [delete_op(key)], [],
                             f"leave as {node_id}")
        return result.succeeded

    def members(self) -> tuple[list[Member], int]:
        """The live members (sorted by id) and the revision they were read at."""
        entries, revision = self.kv.get_prefix(self.prefix)
        return [Member.from_entry(e) for e in entries], revision

    def watch(self, on_change: Callable[[MemberEvent], None], *, start_revision: int | None = None,
              on_reset: Callable[[], None] | None = None) -> PrefixWatch:
        """Start delivering joins and leaves after ``start_revision`` (default:
        from now) to ``on_change``, on the watch's own thread. Pass the
        revision ``members()`` returned to miss nothing after that read.
        ``stop()`` the returned watch when done."""
        if start_revision is None:
            start_revision = self.members()[1]

        def deliver(event: WatchEvent) -> None:
            node_id = event.entry.key[len(self.prefix):]
            if event.kind == "DELETE":
                on_change(MemberEvent("left", node_id, event.entry.mod_revision, None))
            elif event.entry.version == 1:  # created; later PUTs (an address update) are not joins
                on_change(MemberEvent("joined", node_id, event.entry.mod_revision, Member.from_entry(event.entry)))

        return PrefixWatch(self.config, self.prefix, deliver, start_revision=start_revision + 1,
                           on_reset=on_reset, name="members").start()
