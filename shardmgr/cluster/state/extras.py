"""A published shard's extras: its deletes since it was published, and its
approximate index, as etcd keys beside the shard map (docs/cluster.md,
"Deletes and indexes after publish").

Keys and values (JSON), one per published shard that has them:

- ``<key_prefix>/deletes/<collection>/<shard id, 20 digits>``:
  :class:`DeletesEntry`, ``{"object": {"key", "size", "crc32c"}, "deleted":
  <deleted rows in it>, "node", "writer_revision"}``. The object is a copy of
  the shard's delete log (store/deletes.py), uploaded to ``.../<shard
  id>/<writer revision>/deletes.<deleted>``. The key is replaced when the
  writer has more deletes; ``deleted`` only grows.
- ``<key_prefix>/indexes/<collection>/<shard id, 20 digits>``:
  :class:`IndexEntry`, ``{"files": {name: {"key", "size", "crc32c"}}, "node",
  "writer_revision"}``: the index files the writer built (``index.faiss``,
  ``index.meta``: store/index.py), uploaded to ``.../<shard id>/<writer
  revision>/<name>``. Written once, never replaced.

Guarantees of :meth:`ShardExtras.publish_deletes` and
:meth:`ShardExtras.publish_index`, each one etcd transaction:

- fenced exactly like ``ShardMap.publish``: the collection's writer key
  still has the token's create_revision and lease (else ``NotWriter``,
  nothing changed);
- only for a published shard (its shard-map key exists), so an extras key
  never names a shard a reader cannot find;
- deletes only move forward: the transaction also compares the deletes
  key's mod_revision with the one just read (or its absence), and nothing is
  published over a key that holds as many deleted rows or more;
- an index is write-once (create if absent): the first one published stays.

Which delete log a reader uses for shard ``s`` (:func:`deletes_object`): the
deletes key's object if the key exists; else the shard entry's own
``deletes`` file (a shard that had deletes when it was first published);
else none. A reader that finds a deletes object gone (ObjectMissing) reads
the key again: that object was replaced, and swept once its successor was
older than the sweep's grace period (sweep.py).

Readers: :meth:`ShardExtras.read` (both kinds of one collection at one
revision), :meth:`~ShardExtras.deletes`, :meth:`~ShardExtras.indexes`, and
:meth:`~ShardExtras.watch` from the revision after a read.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable
from typing import Any, Literal

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import CoordinationError, NotWriter
from shardmgr.cluster.state.election import Writer
from shardmgr.cluster.state.kv import (
    Entry,
    Kv,
    present,
    put_op,
    range_op,
    range_prefix_op,
    same_create,
    same_lease,
    same_mod,
)
from shardmgr.cluster.state.shard_map import ShardEntry, ShardMap, ShardObject
from shardmgr.cluster.state.watch import PrefixWatch, WatchEvent
from shardmgr.store import check_name, layout

#: attempts of a deletes publish whose compare on the deletes key failed (our own lost answer: re-read)
PUBLISH_ATTEMPTS = 5
Kind = Literal["deletes", "indexes"]


def _object(o: ShardObject) -> dict[str, Any]:
    return {"key": o.key, "size": o.size, "crc32c": o.crc32c}


def _dumps(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


@dataclasses.dataclass(frozen=True, slots=True)
class DeletesEntry:
    """A published shard's delete log as uploaded after its publish; ``object.name`` is ``deletes``
    (the file name to fetch it to), ``deleted`` the deleted rows it holds."""

    collection: str
    shard_id: int
    object: ShardObject
    deleted: int
    #: the node that published it, and the writer tenure (fencing revision) it was published under
    node: str = ""
    writer_revision: int = 0

    def encode(self) -> bytes:
        return _dumps({"object": _object(self.object), "deleted": self.deleted, "node": self.node,
                       "writer_revision": self.writer_revision})

    @classmethod
    def decode(cls, collection: str, shard_id: int, data: bytes) -> DeletesEntry:
        raw: dict[str, Any] = json.loads(data)
        return cls(collection, shard_id, ShardObject(name=layout.DELETES, **raw["object"]), int(raw["deleted"]),
                   str(raw["node"]), int(raw["writer_revision"]))


@dataclasses.dataclass(frozen=True, slots=True)
class IndexEntry:
    """A published shard's index files (``files``: by name, sorted), as the writer built them."""

    collection: str
    shard_id: int
    files: tuple[ShardObject, ...]
    node: str = ""
    writer_revision: int = 0

    def encode(self) -> bytes:
        return _dumps({"files": {o.name: _object(o) for o in self.files}, "node": self.node,
                       "writer_revision": self.writer_revision})

    @classmethod
    def decode(cls, collection: str, shard_id: int, data: bytes) -> IndexEntry:
        raw: dict[str, Any] = json.loads(data)
        files = tuple(ShardObject(name=name, **o) for name, o in sorted(raw["files"].items()))
        return cls(collection, shard_id, files, str(raw["node"]), int(raw["writer_revision"]))


@dataclasses.dataclass(frozen=True, slots=True)
class ExtrasView:
    """The extras of one collection read at one etcd revision (watch from ``revision + 1``)."""

    collection: str
    deletes: dict[int, DeletesEntry]
    indexes: dict[int, IndexEntry]
    revision: int


@dataclasses.dataclass(frozen=True, slots=True)
class ExtrasChange:
    """One change seen by a watch: ``entry`` is None if the key was deleted;
    ``revision`` is the etcd revision of the change."""

    kind: Kind
    collection: str
    shard_id: int
    entry: DeletesEntry | IndexEntry | None
    revision: int


def deletes_object(shard: ShardEntry, deletes: DeletesEntry | None) -> ShardObject | None:
    """The delete log a reader of ``shard`` uses (module docstring): the
    deletes key's object, else the entry's own ``deletes`` file, else None."""
    if deletes is not None:
        return deletes.object
    return next((o for o in shard.objects if o.name == layout.DELETES), None)


class ShardExtras:
    """The extras keys of every collection (module docstring). One etcd client: one thread at a time."""

    def __init__(self, config: ClusterConfig, kv: Kv | None = None) -> None:
        self.config = config
        self.kv = kv if kv is not None else Kv(config)

    def prefix(self, kind: Kind, collection: str | None = None) -> str:
        """The key prefix of ``kind`` (of one collection, or of all)."""
        return self.config.key(kind, "") if collection is None else self.config.key(kind, check_name(collection), "")

    def key(self, kind: Kind, collection: str, shard_id: int) -> str:
        """The key of shard ``shard_id``'s extras of ``kind`` (id in 20 digits, like the shard map's)."""
        if not 0 <= shard_id < 10**20:
            raise ValueError(f"shard id must be in 0..10**20, got {shard_id}")
        return self.config.key(kind, check_name(collection), f"{shard_id:020d}")

    # ------------------------------------------------------------ readers

    def read(self, collection: str) -> ExtrasView:
        """Both kinds of extras of ``collection``, read at one revision."""
        result = self.kv.txn([], [range_prefix_op(self.prefix("deletes", collection)),
                                  range_prefix_op(self.prefix("indexes", collection))], [],
                             f"read the deletes and indexes of {collection}")
        deletes, indexes = result.ranges
        return ExtrasView(collection, {e.shard_id: e for e in (self._deletes(d) for d in deletes)},
                          {e.shard_id: e for e in (self._index(i) for i in indexes)}, result.revision)

    def deletes(self, collection: str) -> dict[int, DeletesEntry]:
        """The published deletes of ``collection``'s shards, by shard id."""
        return self.read(collection).deletes

    def deletes_of(self, collection: str, shard_id: int) -> DeletesEntry | None:
        """The published deletes of one shard (one key read), or None."""
        found = self.kv.get(self.key("deletes", collection, shard_id))
        return self._deletes(found) if found is not None else None

    def indexes(self, collection: str) -> dict[int, IndexEntry]:
        """The published indexes of ``collection``'s shards, by shard id."""
        return self.read(collection).indexes

    def watch(self, on_change: Callable[[ExtrasChange], None], start_revision: int, *,
              collection: str | None = None, on_reset: Callable[[], None] | None = None) -> ExtrasWatch:
        """Call ``on_change`` for every change of an extras key (of
        ``collection``, or of all) from ``start_revision`` on: a started
        :class:`ExtrasWatch` (two PrefixWatch streams, watch.py; stop() it)."""
        return ExtrasWatch(self, on_change, start_revision, collection, on_reset).start()

    def _parse(self, kind: Kind, key: str) -> tuple[str, int]:
        collection, shard = key[len(self.prefix(kind)):].split("/")
        return collection, int(shard)

    def _deletes(self, entry: Entry) -> DeletesEntry:
        return DeletesEntry.decode(*self._parse("deletes", entry.key), entry.value)

    def _index(self, entry: Entry) -> IndexEntry:
        return IndexEntry.decode(*self._parse("indexes", entry.key), entry.value)

    # ------------------------------------------------------------ the writer

    def publish_deletes(self, token: Writer, entry: DeletesEntry) -> DeletesEntry:
        """Publish ``entry`` under ``token`` unless the key already holds as
        many deleted rows or more (module docstring); returns what the key
        holds now (``entry``, stamped with the token, or the one already
        there). NotWriter if the tenure is over, CoordinationError if the
        shard is not published; nothing changed then."""
        entry = dataclasses.replace(entry, node=token.node_id, writer_revision=token.revision)
        key = self.key("deletes", entry.collection, entry.shard_id)
        for _ in range(PUBLISH_ATTEMPTS):
            current = self.kv.get(key)
            there = self._deletes(current) if current is not None else None
            if there is not None and there.deleted >= entry.deleted:
                return there  # never backwards (an equal count is the same rows: a delete log only grows)
            result = self.kv.txn(
                self._fence(token, entry.collection, entry.shard_id)
                + [same_mod(key, current.mod_revision) if current is not None else same_create(key, 0)],
                [put_op(key, entry.encode())], self._why_not(entry.collection, entry.shard_id),
                f"publish the deletes of shard {entry.shard_id} of {entry.collection}")
            if result.succeeded:
                return entry
            self._refused(token, entry.collection, entry.shard_id, result.ranges, "deletes")
        raise CoordinationError(f"publishing the deletes of shard {entry.shard_id} of {entry.collection!r}: "
                                "the key kept changing")

    def publish_index(self, token: Writer, entry: IndexEntry) -> IndexEntry:
        """Publish ``entry`` under ``token`` if the shard has no index
        published (write-once); returns what the key holds now (``entry``,
        stamped, or the one published first). Errors as publish_deletes."""
        entry = dataclasses.replace(entry, node=token.node_id, writer_revision=token.revision)
        key = self.key("indexes", entry.collection, entry.shard_id)
        result = self.kv.txn(self._fence(token, entry.collection, entry.shard_id) + [same_create(key, 0)],
                             [put_op(key, entry.encode())],
                             [*self._why_not(entry.collection, entry.shard_id), range_op(key)],
                             f"publish the index of shard {entry.shard_id} of {entry.collection}")
        if result.succeeded:
            return entry
        self._refused(token, entry.collection, entry.shard_id, result.ranges[:2], "index")
        return self._index(result.ranges[2][0])

    def _fence(self, token: Writer, collection: str, shard_id: int) -> list[dict[str, Any]]:
        """Compares: ``token`` is the writer's tenure, and the shard is published."""
        if token.collection != collection:
            raise ValueError(f"a token for {token.collection!r} given for {collection!r}")
        writer_key = self.config.key("writers", collection)
        return [same_create(writer_key, token.revision), same_lease(writer_key, token.lease),
                present(ShardMap(self.config, collection, self.kv).key(shard_id))]

    def _why_not(self, collection: str, shard_id: int) -> list[dict[str, Any]]:
        return [range_op(self.config.key("writers", collection)),
                range_op(ShardMap(self.config, collection, self.kv).key(shard_id))]

    def _refused(self, token: Writer, collection: str, shard_id: int, ranges: list[list[Entry]], what: str) -> None:
        """Raise for a failed fence (NotWriter) or an unpublished shard; return if only the key moved."""
        writers, shards = ranges
        if not writers or (writers[0].create_revision, writers[0].lease) != (token.revision, token.lease):
            now = Writer.from_entry(collection, writers[0]) if writers else None
            who = f"{now.node_id} at revision {now.revision}" if now is not None else "no writer"
            raise NotWriter(f"{token.node_id} is not the writer of {collection!r} any more (its tenure at revision "
                            f"{token.revision} ended; now {who}): the {what} of shard {shard_id} not published")
        if not shards:
            raise CoordinationError(f"shard {shard_id} of {collection!r} is not published: its {what} is not either")


class ExtrasWatch:
    """A watch on the deletes and indexes keys (:meth:`ShardExtras.watch`).
    ``on_change`` is called one change at a time (the two streams take turns
    under a lock), in revision order per key; ``on_reset`` as PrefixWatch's
    (events were compacted away: read again)."""

    def __init__(self, extras: ShardExtras, on_change: Callable[[ExtrasChange], None], start_revision: int,
                 collection: str | None, on_reset: Callable[[], None] | None) -> None:
        self._extras = extras
        self._on_change = on_change
        self._lock = threading.Lock()
        self.watches = [PrefixWatch(extras.config, extras.prefix(kind, collection), self._handler(kind),
                                    start_revision=start_revision, on_reset=on_reset, name=f"extras-{kind}")
                        for kind in ("deletes", "indexes")]

    def start(self) -> ExtrasWatch:
        for watch in self.watches:
            watch.start()
        return self

    def stop(self) -> None:
        for watch in self.watches:
            watch.stop()

    @property
    def connected(self) -> bool:
        """Both streams are up."""
        return all(w.connected.is_set() for w in self.watches)

    def _handler(self, kind: Kind) -> Callable[[WatchEvent], None]:
        decode = self._extras._deletes if kind == "deletes" else self._extras._index

        def handle(event: WatchEvent) -> None:
            collection, shard_id = self._extras._parse(kind, event.entry.key)
            entry = decode(event.entry) if event.kind == "PUT" else None
            with self._lock:
                self._on_change(ExtrasChange(kind, collection, shard_id, entry, event.entry.mod_revision))

        return handle
