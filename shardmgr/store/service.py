"""The vector store as a component of ``shardmgr serve``: its commands.

Vectors, ids, queries and refs travel as binary parts; see docs/shardmgr.md.
The service only translates frames to calls of the Store's public API (and
FlushFailed to the wire's DurabilityLost). Requests run on the connection's
thread: searches and gets read snapshots concurrently (faiss releases the
GIL), appends take the store's write lock, and an append with ``durable``
waits on that thread for the flush that covers it (a few milliseconds), so
replies keep their meaning: when the client sees the refs, the rows are on
disk. In cluster mode a ``forwarder`` serves appends and deletes: it sends
those this node may not make to the collection's writer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from common.journal import Flusher
from common.journal.errors import FlushFailed
from common.wire.component import Component, Request
from common.wire.errors import BadRequest, DurabilityLost

from .config import StoreConfig
from .knn import Hits, SearchResult
from .store import Store


class Router(Protocol):
    """Cluster mode's searches (shardmgr/cluster/query/query.py): a whole collection across the nodes, and
    this node's part of another node's search; and ``collection_info``'s counts over the whole cluster.
    A search or get waits until the node's cluster state reaches revision ``after`` (0: no wait) and
    also gives the fields its reply adds (docs/protocol.md, "Cluster fields of searches and gets")."""

    def search(self, name: str, queries: Any, k: int, params: dict[str, int] | None,
               after: int = 0) -> tuple[SearchResult, dict[str, Any]]: ...

    def search_shards(self, name: str, queries: Any, k: int, params: dict[str, int] | None, shards: list[int],
                      unpublished: bool, exclude: Any, deleted: Any = None) -> tuple[Hits, list[int]]: ...

    def rows(self, name: str, refs: Any, after: int = 0) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]: ...

    def info(self, name: str) -> dict[str, Any]: ...

    def report(self) -> dict[str, Any]: ...

    def rows_here(self, name: str, refs: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


class WriteForwarder(Protocol):
    """Cluster mode's forwarding of writes this node may not make (shardmgr/cluster/writer/forwarding.py)."""

    commands: frozenset[str]
    node_id: str

    def handle(self, request: Request, local: Callable[[Request], None]) -> None:
        """Serve ``request`` with ``local``, or send it on to the node that may write it."""

    def deleted_parts(self, request: Request) -> dict[str, Any] | None:
        """What the answer to a delete this node just wrote adds (parts; ``writer`` is set then)."""


class StoreService(Component):
    name = "shardmgr"

    def __init__(self, data_dir: Path, config: StoreConfig, flusher: Flusher) -> None:
        self.store = Store(data_dir, config, flusher=flusher, lock=False)
        self._handlers: dict[str, Callable[[Request], None]] = {
            "shardmgr.create_collection": self._create, "shardmgr.collections": self._collections,
            "shardmgr.collection_info": self._info, "shardmgr.append": self._append,
            "shardmgr.search": self._search, "shardmgr.get": self._get, "shardmgr.flush": self._flush,
            "shardmgr.delete": self._delete, "shardmgr.delete_ids": self._delete_ids,
            "shardmgr.compact": self._compact, "shardmgr.search_shards": self._search_shards,
            "shardmgr.get_shards": self._get_shards, "shardmgr.report": self._report,
        }
        #: cluster mode: searches go through the cluster (None: this store alone)
        self.router: Router | None = None
        #: cluster mode: the writes this node is refused go to the collection's writer through it; None otherwise
        self.forwarder: WriteForwarder | None = None

    def commands(self) -> Iterable[str]:
        return self._handlers

    def recover(self) -> None:
        self.store.recover()

    def start(self) -> None:
        self.store.start()

    def stop(self) -> None:
        self.store.close()

    def stats(self) -> dict[str, float | int]:
        return dict(self.store.stats())

    def handle(self, request: Request) -> None:
        if self.forwarder is not None and request.cmd in self.forwarder.commands:
            self.forwarder.handle(request, self._handlers[request.cmd])
            return
        self._handlers[request.cmd](request)

    def _create(self, request: Request) -> None:
        request.reply(self.store.create_collection(request.arg("name", str), request.arg("dim", int),
                                                   request.arg("metric", str, "l2"), request.arg("index", str, "flat")))

    def _collections(self, request: Request) -> None:
        request.reply({"names": self.store.collections()})

    def _info(self, request: Request) -> None:
        name = request.arg("name", str)
        request.reply(self.store.collection_info(name) if self.router is None else self.router.info(name))

    def _append(self, request: Request) -> None:
        name = request.arg("name", str)
        durable = request.arg("durable", bool, False)
        vectors, ids = request.part("vectors"), request.part("ids")
        try:  # dtypes and shapes are checked by the store (shardmgr.bad_vectors), as for embedded callers
            refs = self.store.append(name, vectors, ids, durable=durable)
        except FlushFailed as exc:
            raise DurabilityLost(str(exc)) from exc
        request.reply({"rows": len(refs)}, {"refs": refs})

    def _delete(self, request: Request) -> None:
        self._deleting(request, self.store.delete, "refs")

    def _delete_ids(self, request: Request) -> None:
        self._deleting(request, self.store.delete_ids, "ids")

    def _deleting(self, request: Request, delete: Callable[..., int], part: str) -> None:
        name, durable = request.arg("name", str), request.arg("durable", bool, False)
        try:
            deleted = delete(name, request.part(part), durable=durable)
        except FlushFailed as exc:
            raise DurabilityLost(str(exc)) from exc
        parts = self.forwarder.deleted_parts(request) if self.forwarder is not None else None
        if parts is None or self.forwarder is None:
            request.reply({"deleted": deleted})
        else:
            request.reply({"deleted": deleted, "writer": self.forwarder.node_id}, parts)

    def _compact(self, request: Request) -> None:
        request.reply({"rewrites": self.store.compact(request.arg("name", str, None))})

    def _search(self, request: Request) -> None:
        args = (request.arg("name", str), request.part("queries"), request.arg("k", int, 10),
                request.arg("params", dict, None))
        result: dict[str, Any] = {}
        if self.router is None:
            found = self.store.search(*args)
        else:
            found, result = self.router.search(*args, after=request.arg("after", int, 0))
        if found.partial:
            result = {**result, "partial": True, "missing": list(found.missing)}
        request.reply(result, {"scores": found.scores, "ids": found.ids, "refs": found.refs})

    def _search_shards(self, request: Request) -> None:
        """A node's part of a cluster search (shardmgr/cluster/query/shard_search.py)."""
        if self.router is None:
            raise BadRequest("shardmgr.search_shards is a cluster command: this server is not a cluster node")
        hits, not_here = self.router.search_shards(
            request.arg("name", str), request.part("queries"), request.arg("k", int, 10),
            request.arg("params", dict, None), request.arg("shards", list, []), request.arg("unpublished", bool, False),
            request.part("exclude"), request.parts.get("deleted"))
        request.reply({"not_here": not_here}, {"scores": hits.scores, "ids": hits.ids, "refs": hits.refs})

    def _get(self, request: Request) -> None:
        name, refs = request.arg("name", str), request.part("refs")
        if self.router is None:
            vectors, ids = self.store.rows(name, refs)
            request.reply({}, {"vectors": vectors, "ids": ids})
            return
        vectors, ids, result = self.router.rows(name, refs, after=request.arg("after", int, 0))
        request.reply(result, {"vectors": vectors, "ids": ids})

    def _get_shards(self, request: Request) -> None:
        """A node's part of a cluster get (shardmgr/cluster/query/lookup.py)."""
        if self.router is None:
            raise BadRequest("shardmgr.get_shards is a cluster command: this server is not a cluster node")
        vectors, ids, here = self.router.rows_here(request.arg("name", str), request.part("refs"))
        request.reply({}, {"vectors": vectors, "ids": ids, "here": here.astype(np.uint8)})

    def _report(self, request: Request) -> None:
        """A node's report now (shardmgr/cluster/state/report.py), for another node's collection_info."""
        if self.router is None:
            raise BadRequest("shardmgr.report is a cluster command: this server is not a cluster node")
        request.reply(self.router.report())

    def _flush(self, request: Request) -> None:
        self.store.flush()
        request.reply()
