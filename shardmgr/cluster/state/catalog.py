"""The catalog: every collection of the cluster and its parameters, in etcd.

One key per collection, ``<key_prefix>/collections/<name>``, whose value is
JSON :class:`CollectionMeta` (name, dim, metric, index; the index string as
the store normalised it). No lease: a collection outlives the node that
created it.

Guarantees: :meth:`Catalog.publish` is one transaction (create if absent,
read in the same round trip), so of two nodes creating one name with
different parameters exactly one wins and the other gets
``CollectionConflict`` naming both; the same parameters again succeed
(create is idempotent across nodes). An entry is never changed or removed.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.kv import Entry, Kv, put_op, range_op, same_create
from shardmgr.cluster.state.watch import PrefixWatch, WatchEvent
from shardmgr.errors import CollectionConflict


@dataclasses.dataclass(frozen=True, slots=True)
class CollectionMeta:
    """A collection's parameters, as every node must create it."""

    name: str
    dim: int
    metric: str
    index: str

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_entry(cls, e: Entry) -> CollectionMeta:
        raw = json.loads(e.value)
        return cls(name=str(raw["name"]), dim=int(raw["dim"]), metric=str(raw["metric"]), index=str(raw["index"]))


class Catalog:
    """The collections of one cluster (``config.key_prefix``). One ``Kv``: use from one thread at a time."""

    def __init__(self, config: ClusterConfig, kv: Kv | None = None) -> None:
        self.config = config
        self.kv = kv if kv is not None else Kv(config)
        self.prefix = config.key("collections", "")

    def publish(self, meta: CollectionMeta) -> bool:
        """Record ``meta`` unless its name is taken; True if this call created
        it, False if it was there with the same parameters. CollectionConflict
        if it was there with others (nothing changed)."""
        key = self.prefix + meta.name
        result = self.kv.txn([same_create(key, 0)], [put_op(key, meta.encode())], [range_op(key)],
                             f"create collection {meta.name}")
        if result.succeeded:
            return True
        if not result.ranges or not result.ranges[0]:  # never removed, so it cannot vanish: etcd is broken
            raise CollectionConflict(f"collection {meta.name!r}: etcd refused its creation and has no entry")
        existing = CollectionMeta.from_entry(result.ranges[0][0])
        check_same(existing, meta)
        return False

    def get(self, name: str) -> CollectionMeta | None:
        found = self.kv.get(self.prefix + name)
        return CollectionMeta.from_entry(found) if found is not None else None

    def read(self) -> tuple[dict[str, CollectionMeta], int]:
        """Every collection by name, and the revision they were read at."""
        entries, revision = self.kv.get_prefix(self.prefix)
        return {m.name: m for m in (CollectionMeta.from_entry(e) for e in entries)}, revision

    def watch(self, on_created: Callable[[CollectionMeta], None], *, start_revision: int,
              on_reset: Callable[[], None] | None = None) -> PrefixWatch:
        """Deliver every collection created after ``start_revision`` to
        ``on_created``, on the watch's own thread; ``stop()`` it when done."""

        def deliver(event: WatchEvent) -> None:
            if event.kind == "PUT":
                on_created(CollectionMeta.from_entry(event.entry))

        return PrefixWatch(self.config, self.prefix, deliver, start_revision=start_revision + 1,
                           on_reset=on_reset, name="collections").start()


def check_same(existing: CollectionMeta, wanted: CollectionMeta) -> None:
    """CollectionConflict unless the two agree."""
    if existing != wanted:
        raise CollectionConflict(f"collection {wanted.name!r} exists in the cluster with dim {existing.dim}, "
                                 f"metric {existing.metric}, index {existing.index}; asked for dim {wanted.dim}, "
                                 f"metric {wanted.metric}, index {wanted.index}")
