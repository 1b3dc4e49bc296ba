"""The network client of the vector store: ``shardmgr.connect``.

Same methods as the embedded Store; vectors, ids, queries and refs travel
as binary parts (no per-element encoding).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common.wire.client import RpcClient

from . import batch


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

    def append(self, name: str, vectors: Any, ids: Any, durable: bool = False) -> np.ndarray:
        """Append float32 [n, dim] vectors with int64 [n] ids; one ref per row."""
        reply = self.rpc.call("shardmgr.append", {"name": name, "durable": durable},
                              {"vectors": np.asarray(vectors), "ids": np.asarray(ids)})
        return reply.parts["refs"]

    def delete(self, name: str, refs: Any, durable: bool = False) -> int:
        """Delete the rows ``refs`` name; how many were not deleted before (see Store.delete)."""
        reply = self.rpc.call("shardmgr.delete", {"name": name, "durable": durable}, {"refs": batch.refs(refs)})
        return int(reply.result["deleted"])

    def delete_ids(self, name: str, ids: Any, durable: bool = False) -> int:
        """Delete every live row carrying one of ``ids``; how many rows (see Store.delete_ids)."""
        reply = self.rpc.call("shardmgr.delete_ids", {"name": name, "durable": durable},
                              {"ids": batch.ids(ids, None)})
        return int(reply.result["deleted"])

    def search(self, name: str, queries: Any, k: int = 10) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(scores, ids, refs), each [nq, k]; missing results have ref -1."""
        k = int(k) if isinstance(k, np.integer) else k  # the server checks its range
        parts = self.rpc.call("shardmgr.search", {"name": name, "k": k}, {"queries": np.asarray(queries)}).parts
        return parts["scores"], parts["ids"], parts["refs"]

    def get(self, name: str, refs: Any) -> np.ndarray:
        return self._rows(name, refs)[0]

    def ids(self, name: str, refs: Any) -> np.ndarray:
        return self._rows(name, refs)[1]

    def _rows(self, name: str, refs: Any) -> tuple[np.ndarray, np.ndarray]:
        parts = self.rpc.call("shardmgr.get", {"name": name}, {"refs": batch.refs(refs)}).parts
        return parts["vectors"], parts["ids"]

    def flush(self) -> None:
        self.rpc.call("shardmgr.flush")

    def close(self) -> None:
        self.rpc.close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
