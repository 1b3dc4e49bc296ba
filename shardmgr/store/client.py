"""The network client of the vector store: ``shardmgr.connect``.

Same methods as the embedded Store; vectors, ids, queries and refs travel
as binary parts (no per-element encoding).

Timeouts: the client's ``timeout`` (default 30 s) bounds each wait for the
server. The server answers a call only once it is done, so a call whose work
grows with its size (append, search, get, ids) waits by default that
timeout plus an allowance for its size: ``SEARCH_SECONDS_PER_VALUE`` per
query value (nq x dim), ``APPEND_BYTES_PER_SECOND`` for the bytes sent,
``GET_SECONDS_PER_ROW`` per ref. Every such call takes its own
``timeout=`` (seconds, or None: no bound) instead. See docs/shardmgr.md.
"""

from __future__ import annotations

from types import EllipsisType
from typing import Any

import numpy as np

from common.wire.client import MAX_CLIENT_SECONDS, Reply, RpcClient

from . import inputs
from .knn import SearchResult

Timeout = float | None | EllipsisType
"""A call's ``timeout``: seconds, None (no bound), or ``...``: the client's, plus the call's allowance."""

SEARCH_SECONDS_PER_VALUE = 1e-3
"""Search allowance per query value: 0.128 s per 128-d query, what exact
search over ~50 M rows takes on the 2-core machine of docs/benchmarks.md
(or over ~5 M rows ten times slower)."""

APPEND_BYTES_PER_SECOND = 20e6
"""Append allowance: the bytes sent at a slow disk's speed (the server
writes them before it answers, and syncs them with ``durable=True``)."""

GET_SECONDS_PER_ROW = 1e-3
"""get/ids allowance per ref: one random read from a slow, cold disk."""


class StoreClient:
    """A connection to a ``shardmgr serve`` process (not thread-safe: one per thread)."""

    def __init__(self, address: str | tuple[str, int], **options: Any) -> None:
        """``options`` go to common.wire.client.RpcClient (timeout, retry_for, token, tls, ca, ...)."""
        self.rpc = RpcClient(address, **options)

    def create_collection(self, name: str, dim: int, metric: str = "l2", index: str = "flat") -> dict[str, Any]:
        return self.rpc.call("shardmgr.create_collection",
                             {"name": name, "dim": dim, "metric": metric, "index": index}).result

    def collections(self) -> list[str]:
        return list(self.rpc.call("shardmgr.collections").result["names"])

    def collection_info(self, name: str) -> dict[str, Any]:
        return self.rpc.call("shardmgr.collection_info", {"name": name}).result

    def append(self, name: str, vectors: Any, ids: Any, durable: bool = False, timeout: Timeout = ...) -> np.ndarray:
        """Append float32 [n, dim] vectors with int64 [n] ids; one ref per row."""
        parts = {"vectors": np.asarray(vectors), "ids": np.asarray(ids)}
        allowance = (parts["vectors"].nbytes + parts["ids"].nbytes) / APPEND_BYTES_PER_SECOND
        reply = self.rpc.call("shardmgr.append", {"name": name, "durable": durable}, parts,
                              timeout=self._timeout(timeout, allowance))
        return reply.parts["refs"]

    def delete(self, name: str, refs: Any, durable: bool = False, timeout: Timeout = ...) -> int:
        """Delete the rows ``refs`` name; how many were not deleted before (see Store.delete)."""
        reply = self.rpc.call("shardmgr.delete", {"name": name, "durable": durable}, {"refs": inputs.refs(refs)},
                              timeout=timeout)
        return int(reply.result["deleted"])

    def delete_ids(self, name: str, ids: Any, durable: bool = False, timeout: Timeout = ...) -> int:
        """Delete every live row carrying one of ``ids``; how many rows (see Store.delete_ids)."""
        reply = self.rpc.call("shardmgr.delete_ids", {"name": name, "durable": durable},
                              {"ids": inputs.ids(ids, None)}, timeout=timeout)
        return int(reply.result["deleted"])

    def compact(self, name: str | None = None, timeout: Timeout = None) -> int:
        """Run the rewrites due now (Store.compact; the admin role); how many
        ran. Waits as long as they take unless ``timeout`` says otherwise."""
        args = {} if name is None else {"name": name}
        return int(self.rpc.call("shardmgr.compact", args, timeout=timeout).result["rewrites"])

    def search(self, name: str, queries: Any, k: int = 10, params: dict[str, int] | None = None,
               timeout: Timeout = ...) -> SearchResult:
        """(scores, ids, refs), each [nq, k]; missing results have ref -1.
        ``params``: ``nprobe``, ``efSearch`` for the collection's index (Store.search).
        From a cluster node, ``partial`` and ``missing`` say what could not be
        searched (docs/cluster.md); from a single node it is always complete."""
        k = int(k) if isinstance(k, np.integer) else k  # the server checks its range
        queries = np.asarray(queries)
        args: dict[str, Any] = {"name": name, "k": k}
        if params:
            args["params"] = {key: int(value) for key, value in params.items()}
        reply = self._read("shardmgr.search", args, {"queries": queries},
                           self._timeout(timeout, queries.size * SEARCH_SECONDS_PER_VALUE))
        parts = reply.parts
        return SearchResult(parts["scores"], parts["ids"], parts["refs"], list(reply.result.get("missing", ())))

    def get(self, name: str, refs: Any, timeout: Timeout = ...) -> np.ndarray:
        return self._rows(name, refs, timeout)[0]

    def ids(self, name: str, refs: Any, timeout: Timeout = ...) -> np.ndarray:
        return self._rows(name, refs, timeout)[1]

    def _rows(self, name: str, refs: Any, timeout: Timeout) -> tuple[np.ndarray, np.ndarray]:
        wanted = inputs.refs(refs)
        parts = self._read("shardmgr.get", {"name": name}, {"refs": wanted},
                           self._timeout(timeout, wanted.size * GET_SECONDS_PER_ROW)).parts
        return parts["vectors"], parts["ids"]

    def _read(self, cmd: str, args: dict[str, Any], parts: dict[str, np.ndarray], timeout: float | None) -> Reply:
        """A search's or get's call: connect_cluster's node clients add to it (shardmgr/cluster/cluster_client.py)."""
        return self.rpc.call(cmd, args, parts, timeout=timeout)

    def _timeout(self, timeout: Timeout, allowance: float) -> float | None:
        """The call's own timeout if given, else the client's plus ``allowance`` (None stays None)."""
        if timeout is not ...:
            return timeout
        base = self.rpc.timeout
        return None if base is None else min(base + allowance, MAX_CLIENT_SECONDS)

    def flush(self) -> None:
        self.rpc.call("shardmgr.flush")

    def close(self) -> None:
        self.rpc.close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
