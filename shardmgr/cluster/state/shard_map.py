"""The shard map: which sealed shards of a collection are published, and
where their bytes are in the object store.

One key per published shard, ``<key_prefix>/shards/<collection>/<shard id,
20 digits>`` (so key order is shard order), whose value is a JSON
:class:`ShardEntry`: rows, and per file its object key, size and crc32c. A
shard's objects live under ``<object_prefix>/<collection>/shards/<shard
id>/<writer revision>/<file>`` (:meth:`ShardMap.object_key`): the writer's
tenure is in the path, so a new writer re-sealing a shard after a crash
never collides with an orphan its predecessor uploaded but did not publish.

Guarantees of :meth:`ShardMap.publish`, one etcd transaction:

- fenced: it applies only if the collection's writer key still has the
  create_revision and lease of the caller's :class:`Writer` token, so a node
  whose lease expired (paused, partitioned, slow to notice) can never
  publish, whatever it believes;
- write-once: it applies only if the shard's key does not exist; a published
  entry is never replaced (publishing the same entry again is a no-op that
  succeeds, so a publish whose answer was lost can be retried);
- all or nothing: the entry appears whole at one revision, or not at all.

Publish only after every object is uploaded and checked (objects.py): a
crash before the publish leaves unpublished objects (a sweep removes them),
never a published shard with missing bytes.

Shard ids: a collection's shards are numbered across the cluster, so two
writers (one after the other, on different nodes) never seal two different
shards under one id. ``<key_prefix>/shard_ids/<collection>`` holds the lowest
id no tenure has reserved; :meth:`ShardMap.reserve_ids` takes a block of ids
for the caller's tenure in one transaction, fenced like a publish. A node
uses only ids it reserved, so the shards a crashed writer left unpublished
keep ids no later writer uses.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import CoordinationError, NotWriter, ShardConflict
from shardmgr.cluster.state.election import Writer
from shardmgr.cluster.state.kv import Kv, put_op, range_op, same_create, same_lease, same_mod
from shardmgr.store import MAX_SHARD, check_name

#: attempts of a reservation whose compare on the ids key failed (a lost answer of our own, re-read)
RESERVE_ATTEMPTS = 5


@dataclasses.dataclass(frozen=True, slots=True)
class ShardObject:
    """One file of a published shard: its role ("payload", "ids", "journal",
    an index), object key, size in bytes and crc32c."""

    name: str
    key: str
    size: int
    crc32c: int


@dataclasses.dataclass(frozen=True, slots=True)
class ShardEntry:
    """A published shard, as its shard-map key holds it."""

    collection: str
    shard_id: int
    rows: int
    objects: tuple[ShardObject, ...]
    #: the node that published it, and the writer tenure (fencing revision) it was published under
    writer: str = ""
    writer_revision: int = 0
    #: deleted rows in the delete log among ``objects`` (0: none); None in entries published before it was
    #: recorded (a reader then knows the shard's deleted rows only from a deletes key: extras.py)
    deleted: int | None = None

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> ShardEntry:
        raw: dict[str, Any] = json.loads(data)
        raw["objects"] = tuple(ShardObject(**o) for o in raw["objects"])
        return cls(**raw)


class ShardMap:
    """The published shards of one collection."""

    def __init__(self, config: ClusterConfig, collection: str, kv: Kv | None = None) -> None:
        self.config = config
        self.collection = check_name(collection)
        self.kv = kv if kv is not None else Kv(config)
        self.prefix = config.key("shards", collection, "")
        self.writer_key = config.key("writers", collection)
        self.ids_key = config.key("shard_ids", collection)

    def key(self, shard_id: int) -> str:
        if not 0 <= shard_id < 10**20:
            raise ValueError(f"shard id must be in 0..10**20, got {shard_id}")
        return f"{self.prefix}{shard_id:020d}"

    def object_key(self, shard_id: int, token: Writer, name: str) -> str:
        """Where ``token``'s writer uploads file ``name`` of shard ``shard_id``."""
        return self.config.object_key(self.collection, "shards", f"{shard_id:020d}", str(token.revision), name)

    def publish(self, token: Writer, entry: ShardEntry) -> int:
        """Publish ``entry`` under ``token`` (module docstring: fenced,
        write-once, atomic); returns the revision it is published at.
        Raises NotWriter if ``token`` is not the current tenure (nothing
        changed), ShardConflict if the shard is published with other
        contents."""
        if entry.collection != self.collection or token.collection != self.collection:
            raise ValueError(f"entry for {entry.collection!r} and token for {token.collection!r} "
                             f"given to the shard map of {self.collection!r}")
        entry = dataclasses.replace(entry, writer=token.node_id, writer_revision=token.revision)
        key = self.key(entry.shard_id)
        result = self.kv.txn(
            [same_create(self.writer_key, token.revision), same_lease(self.writer_key, token.lease),
             same_create(key, 0)],
            [put_op(key, entry.encode())],
            [range_op(key), range_op(self.writer_key)],
            f"publish shard {entry.shard_id} of {self.collection}")
        if result.succeeded:
            return result.revision
        published, writers = result.ranges
        if published and ShardEntry.decode(published[0].value) == entry:
            return published[0].mod_revision  # an earlier attempt of ours went through
        if not writers or (writers[0].create_revision, writers[0].lease) != (token.revision, token.lease):
            now = Writer.from_entry(self.collection, writers[0]) if writers else None
            raise NotWriter(f"{token.node_id} is not the writer of {self.collection!r} any more (its tenure at "
                            f"revision {token.revision} ended; now {_who(now)}): shard {entry.shard_id} not published")
        raise ShardConflict(f"shard {entry.shard_id} of {self.collection!r} is already published with other "
                            f"contents (by {ShardEntry.decode(published[0].value).writer}); not replaced")

    def reserve_ids(self, token: Writer, at_least: int, count: int) -> tuple[int, int]:
        """Reserve ``count`` shard ids for ``token``'s tenure: returns (first,
        limit), first = max(``at_least``, the lowest id not yet reserved).
        Fenced like :meth:`publish` (NotWriter if the tenure is over, nothing
        reserved)."""
        for _ in range(RESERVE_ATTEMPTS):
            current = self.kv.get(self.ids_key)
            first = max(int(json.loads(current.value)["next"]) if current is not None else 1, at_least, 1)
            limit = first + count
            if limit > MAX_SHARD + 1:
                raise CoordinationError(f"collection {self.collection!r} has used all {MAX_SHARD} shard ids")
            value = json.dumps({"next": limit, "writer": token.node_id, "writer_revision": token.revision}).encode()
            result = self.kv.txn(
                [same_create(self.writer_key, token.revision), same_lease(self.writer_key, token.lease),
                 same_mod(self.ids_key, current.mod_revision) if current is not None
                 else same_create(self.ids_key, 0)],
                [put_op(self.ids_key, value)], [range_op(self.writer_key)],
                f"reserve {count} shard ids of {self.collection}")
            if result.succeeded:
                return first, limit
            writers = result.ranges[0] if result.ranges else []
            if not writers or (writers[0].create_revision, writers[0].lease) != (token.revision, token.lease):
                now = Writer.from_entry(self.collection, writers[0]) if writers else None
                raise NotWriter(f"{token.node_id} is not the writer of {self.collection!r} any more (now "
                                f"{_who(now)}): no shard ids reserved")
        raise CoordinationError(f"reserving shard ids of {self.collection!r}: the ids key kept changing")

    def get(self, shard_id: int) -> ShardEntry | None:
        found = self.kv.get(self.key(shard_id))
        return ShardEntry.decode(found.value) if found is not None else None

    def read(self) -> tuple[dict[int, ShardEntry], int]:
        """Every published shard by id, read at one revision (returned too)."""
        entries, revision = self.kv.get_prefix(self.prefix)
        shards = {e.shard_id: e for e in (ShardEntry.decode(kv.value) for kv in entries)}
        return shards, revision


def _who(writer: Writer | None) -> str:
    return f"{writer.node_id} at revision {writer.revision}" if writer is not None else "no writer"
