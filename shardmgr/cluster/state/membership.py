"""Cluster membership: who is alive, as etcd's leases say.

A node is a member while ``<key_prefix>/members/<node-id>`` exists. The key
is created attached to the node's :class:`NodeLease`, so it disappears when
the lease ends: revoked on a clean stop, or expired TTL seconds after the
node's last keepalive (crash, pause, partition). Its value is JSON
(``{"node", "address", "data", "since"}``): where peers and clients reach
the node, the id of its data directory (:func:`data_id`) and when it joined
(seconds since the epoch, by its clock).

A node id taken by another key is refused with NodeIdTaken carrying that
member (``holder``), so a starting node can tell its own previous run (the
same data directory, whose lock it now holds: that process is gone and its
key expires within the TTL) from another live process with its id.

Guarantees: ``join`` is atomic (create-if-absent in one transaction), so two
processes can never both be member ``n1``; ``members()`` is one consistent
read at one revision; ``watch`` delivers joins and leaves after that
revision in order (see watch.py for what happens when the stream drops).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from common.journal.filesystem import replace_atomically
from common.wire.errors import Conflict
from shardmgr.cluster.config import ClusterConfig, check_node_id
from shardmgr.cluster.errors import CoordinationError
from shardmgr.cluster.state.kv import Entry, Kv, delete_op, put_op, range_op, same_create, same_lease
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.watch import PrefixWatch, WatchEvent

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Member:
    """A live node: its id, where it is reached, its lease, the revision it
    joined at, its data directory's id and when it joined ("" and 0.0 from a
    node that does not say)."""

    node_id: str
    address: str
    lease: int
    joined_revision: int
    data_id: str = ""
    since: float = 0.0

    @classmethod
    def from_entry(cls, e: Entry) -> Member:
        info = json.loads(e.value)
        return cls(node_id=e.key.rsplit("/", 1)[1], address=str(info.get("address", "")), lease=e.lease,
                   joined_revision=e.create_revision, data_id=str(info.get("data", "")),
                   since=float(info.get("since", 0.0)))


class NodeIdTaken(CoordinationError, Conflict):
    """Another live member (another process, or this node's previous run whose
    lease has not expired yet) holds this node id; ``holder`` is that member
    (:class:`Member`) when it is known. Defined here, beside the member it
    names, so that errors.py imports no room of the cluster."""

    code = "shardmgr.cluster.node_id_taken"

    def __init__(self, message: str, *, holder: Member | None = None) -> None:
        super().__init__(message)
        self.holder = holder


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

    def join(self, node_id: str, lease: NodeLease, address: str = "", data: str = "") -> Member:
        """Register ``node_id`` under ``lease``, reached at ``address``, with
        data directory ``data`` (:func:`data_id`). Atomic: fails with
        NodeIdTaken (``holder``: the member holding it, None if its key just
        ended) if the key exists (another process with this id, or this
        node's previous run until its lease expires); LeaseLost if the lease
        is no longer alive."""
        lease.check()
        key = self.key(node_id)
        value = json.dumps({"node": node_id, "address": address, "data": data, "since": round(time.time(), 3)})
        result = self.kv.txn([same_create(key, 0)], [put_op(key, value.encode(), lease.id), range_op(key)],
                             [range_op(key)], f"join as {node_id}")
        current = result.ranges[0][0] if result.ranges and result.ranges[0] else None
        if not result.succeeded or current is None:
            holder = Member.from_entry(current) if current is not None else None
            said = holder_text(holder) if holder is not None else "a lease that just ended"
            raise NodeIdTaken(f"node id {node_id!r} is already a member on etcd {self.kv.endpoint} ({said})",
                              holder=holder)
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


def holder_text(member: Member) -> str:
    """How a refusal names the member holding a node id: its address, lease and how long it has been a member."""
    held = f", a member for {max(0.0, time.time() - member.since):.0f} s" if member.since else ""
    return f"at {member.address or 'an unknown address'}, lease {member.lease:x}{held}"


UNKNOWN_HOLDER_PAUSE_S = 0.1
"""The pause before a join is tried again after a refusal whose holder could not be read."""

DATA_ID_FILE = "cluster-node.json"
"""In a node's data directory: ``{"data_id": hex}``, the directory's id in its member key (created once)."""


def data_id(directory: Path) -> str:
    """The id of the data directory ``directory`` (its lock held by the caller): read, or made once."""
    path = directory / DATA_ID_FILE
    try:
        return str(json.loads(path.read_bytes())["data_id"])
    except FileNotFoundError:
        made = uuid.uuid4().hex
        replace_atomically(path, json.dumps({"data_id": made}).encode())
        return made


def hold_id(members: Membership, node_id: str, lease: NodeLease, address: str, data: str, wait_s: float,
            stopping: threading.Event) -> Member:
    """Join as ``node_id`` (``data``: this node's :func:`data_id`, its
    directory's lock held). Refused at once, NodeIdTaken naming the holder,
    if a member of another data directory (or of one that does not say)
    holds the id: another live process. A key of this data directory is
    its previous run's (that process is gone: it held the lock), whose lease
    expires within the TTL: waited for, saying so in the log, up to
    ``wait_s``, then NodeIdTaken. A holder that cannot be read (its key
    ended as the join was refused) is tried again after a pause, within the
    same ``wait_s``."""
    deadline = time.monotonic() + wait_s
    logged = False
    while True:
        try:
            return members.join(node_id, lease, address, data)
        except NodeIdTaken as e:
            holder = e.holder
            if holder is None:  # its key ended between the two reads of the transaction: try again shortly
                if time.monotonic() >= deadline or stopping.is_set():
                    raise NodeIdTaken(f"node id {node_id!r} could not be joined on etcd {members.kv.endpoint} "
                                      f"within {wait_s:g} s (join_timeout_s): its key kept ending as each join "
                                      "was refused") from e
                time.sleep(min(UNKNOWN_HOLDER_PAUSE_S, members.config.lease_ttl_s / 4))
                continue
            if holder.data_id != data or not data:
                raise NodeIdTaken(f"node id {node_id!r} is held by another live process ({holder_text(holder)}) on "
                                  f"etcd {members.kv.endpoint}: start this one with another --node-id, or stop that "
                                  f"one", holder=holder) from e
            if time.monotonic() >= deadline or stopping.is_set():
                raise NodeIdTaken(f"node id {node_id!r} is still held by this data directory's previous run "
                                  f"({holder_text(holder)}) after {wait_s:g} s (join_timeout_s); its lease should "
                                  f"have expired within {members.config.lease_ttl_s} s: is another process using "
                                  f"a copy of this directory?", holder=holder) from e
            if not logged:
                log.info("node id %s is still held by this data directory's previous run (%s): waiting for its "
                         "lease to expire, up to %g s (join_timeout_s)", node_id, holder_text(holder), wait_s)
                logged = True
            time.sleep(min(0.5, members.config.lease_ttl_s / 4))
