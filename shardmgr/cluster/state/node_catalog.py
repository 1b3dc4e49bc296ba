"""A node's side of the catalog of collections (catalog.py): what it has
published there, what it has learnt from it, and the collections whose
parameters here differ from the cluster's.

At start the node publishes its local collections (a conflict marks the
collection, it does not stop the node), creates locally every other
collection the catalog holds, and watches the catalog for new ones. Before
a create the node publishes it (``creating``; CollectionConflict for other
parameters); before a write, a collection only the catalog knows yet is
created locally (``ensure_local``). A collection marked conflicting is
refused every write here, with the reason (``conflict``).

Threads: ``creating`` and ``ensure_local`` run on connection threads, the
watch's callbacks on its thread; the catalog's etcd client is used under
``_lock``, and ``_known``/``_conflicting`` are dicts whose single-key
updates need no lock (a racing adopt creates the same collection twice,
which the store answers as already there).
"""

from __future__ import annotations

import logging
import threading

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.catalog import Catalog, CollectionMeta, check_same
from shardmgr.cluster.state.watch import PrefixWatch
from shardmgr.errors import CollectionConflict, ShardmgrError, UnknownCollection
from shardmgr.store import Store

log = logging.getLogger(__name__)


class NodeCatalog:
    """The catalog as one node sees it (module docstring)."""

    def __init__(self, config: ClusterConfig, store: Store) -> None:
        self.store = store
        self._catalog = Catalog(config)
        self._lock = threading.Lock()
        self._known: dict[str, CollectionMeta] = {}  # the catalog as this node has seen it
        self._conflicting: dict[str, str] = {}  # local collections whose parameters differ from the catalog's

    def __len__(self) -> int:
        """Collections known (from the catalog, or published by this node)."""
        return len(self._known)

    def start(self) -> PrefixWatch:
        """Publish the local collections, adopt the catalog's others, and watch it (the watch is returned)."""
        with self._lock:
            for name in self.store.collections():
                info = self.store.collection_info(name)
                try:
                    self._catalog.publish(CollectionMeta(name, info["dim"], info["metric"], info["index"]))
                except CollectionConflict as e:
                    self._conflict(name, str(e))
            known, revision = self._catalog.read()
        for meta in known.values():
            self.adopt(meta)
        return self._catalog.watch(self.adopt, start_revision=revision, on_reset=self._reread)

    def creating(self, name: str, dim: int, metric: str, index: str) -> bool:
        """Before a create: publish it in the catalog. True if this call created it there
        (CollectionConflict if the catalog holds it with other parameters)."""
        meta = CollectionMeta(name, dim, metric, index)
        known = self._known.get(name)
        if known is not None:
            check_same(known, meta)
            return False
        with self._lock:
            created = self._catalog.publish(meta)
        self._known[name] = meta
        return created

    def conflict(self, name: str) -> str | None:
        """Why writes to ``name`` are refused here, if its parameters differ from the catalog's."""
        return self._conflicting.get(name)

    def conflicting(self) -> set[str]:
        return set(self._conflicting)

    def ensure_local(self, name: str) -> bool:
        """Before a write: create ``name`` here if only the catalog knows it. False if neither knows it
        (the store then answers unknown_collection)."""
        try:
            self.store.collection(name)
        except UnknownCollection:
            with self._lock:
                meta = self._catalog.get(name)
            if meta is None:
                return False
            self.adopt(meta)
        return True

    def adopt(self, meta: CollectionMeta) -> None:
        """Know ``meta`` and have the collection locally (the watch's thread, or a writer's)."""
        self._known[meta.name] = meta
        try:
            self.store.create_collection(meta.name, meta.dim, meta.metric, meta.index)
        except ShardmgrError as e:  # other parameters here, or an index this node's faiss refuses
            self._conflict(meta.name, str(e))

    def close(self) -> None:
        self._catalog.kv.close()

    def _conflict(self, name: str, why: str) -> None:
        self._conflicting[name] = (f"collection {name!r} on this node differs from the cluster's: {why}; "
                                   f"writes to it are refused here")
        log.error("%s", self._conflicting[name])

    def _reread(self) -> None:
        """The watch missed events (compaction): read the catalog again."""
        with self._lock:
            known, _ = self._catalog.read()
        for meta in known.values():
            self.adopt(meta)
