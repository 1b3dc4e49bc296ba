"""One writer per collection, elected through etcd.

The writer of collection ``c`` is whoever holds ``<key_prefix>/writers/<c>``.
A node campaigns by creating that key attached to its :class:`NodeLease`, in
a transaction that succeeds only if the key does not exist; the same
transaction reads the key, so a loser learns the winner in the same round
trip. The key lives as long as the winner's lease: a node that dies or is
paused past its TTL loses the role without doing anything, and the next
campaign succeeds.

Fencing: the key's ``create_revision`` is etcd's global revision at the
moment it was created, so it differs for every tenure and grows with each
new one. The :class:`Writer` a campaign returns is the fencing token: every
shard-map change compares the writer key's create_revision and lease with it
in the same transaction (shard_map.py). A writer whose lease expired
therefore can never change the map, even if it has not noticed yet: its
key is gone (create_revision 0) or is someone else's.
"""

from __future__ import annotations

import dataclasses
import json
import time

from shardmgr.cluster.config import ClusterConfig, check_node_id
from shardmgr.cluster.state.kv import Entry, Kv, delete_op, put_op, range_op, same_create, same_lease
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.store import check_name


@dataclasses.dataclass(frozen=True, slots=True)
class Writer:
    """A collection's writer for one tenure; also its fencing token."""

    collection: str
    node_id: str
    #: the lease the writer key is attached to
    lease: int
    #: the writer key's create_revision: unique to this tenure
    revision: int

    @classmethod
    def from_entry(cls, collection: str, e: Entry) -> Writer:
        return cls(collection=collection, node_id=str(json.loads(e.value)["node"]), lease=e.lease,
                   revision=e.create_revision)


class Election:
    """The writer election of one collection."""

    def __init__(self, config: ClusterConfig, collection: str, kv: Kv | None = None) -> None:
        self.config = config
        self.collection = check_name(collection)
        self.kv = kv if kv is not None else Kv(config)
        self.key = config.key("writers", collection)

    def try_acquire(self, node_id: str, lease: NodeLease) -> tuple[bool, Writer | None]:
        """One atomic attempt: (True, our Writer) if we created the key, else
        (False, the current writer); (False, None) if the key vanished
        between (its lease just ended: try again). Raises LeaseLost if
        ``lease`` is no longer alive."""
        lease.check()
        value = json.dumps({"node": check_node_id(node_id)}).encode()
        result = self.kv.txn([same_create(self.key, 0)], [put_op(self.key, value, lease.id), range_op(self.key)],
                             [range_op(self.key)], f"campaign for writer of {self.collection} as {node_id}")
        found = result.ranges[0] if result.ranges else []
        writer = Writer.from_entry(self.collection, found[0]) if found else None
        return result.succeeded, writer

    def campaign(self, node_id: str, lease: NodeLease, timeout_s: float) -> Writer | None:
        """Try until we are the writer (returns our Writer: the fencing token)
        or ``timeout_s`` passes (returns None). Polls every quarter TTL (at
        most 0.5 s): a dead writer is replaced within TTL + that."""
        deadline = time.monotonic() + timeout_s
        interval = min(0.5, self.config.lease_ttl_s / 4)
        while True:
            won, writer = self.try_acquire(node_id, lease)
            if won:
                return writer
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(interval, left))

    def current(self) -> Writer | None:
        """The writer now, or None if there is none."""
        found = self.kv.get(self.key)
        return Writer.from_entry(self.collection, found) if found is not None else None

    def holds(self, token: Writer) -> bool:
        """True if ``token``'s tenure is still the current one (etcd's view right now)."""
        current = self.current()
        return current is not None and (current.revision, current.lease) == (token.revision, token.lease)

    def resign(self, token: Writer) -> bool:
        """End ``token``'s tenure (delete the key only if it is still that
        tenure's, in one transaction: never another writer's); True if it
        was ours to end. Others can campaign at once."""
        result = self.kv.txn([same_create(self.key, token.revision), same_lease(self.key, token.lease)],
                             [delete_op(self.key)], [], f"resign as writer of {self.collection}")
        return result.succeeded
