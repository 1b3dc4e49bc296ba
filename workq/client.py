"""The network client for producers and consumers: ``workq.connect``.

Same methods as the embedded Broker. Results are delivered at least once
by the broker (a crash between writing a response and recording it as
delivered can send it again); a QueueClient remembers the handles it returned
per job (the most recent 1,000,000) and drops such repeats, so a consumer
using one QueueClient observes each result once.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

import numpy as np

from common.wire.client import RpcClient

from .broker import Result
from .protocol import OFFSET_UNIT, Handle
from .service import joined, split

REMEMBERED_RESULTS = 1_000_000


class _Seen:
    """A bounded set of recently returned handles."""

    def __init__(self, limit: int) -> None:
        self._order: collections.deque[int] = collections.deque()
        self._set: set[int] = set()
        self._limit = limit

    def add_new(self, handle: int) -> bool:
        if handle in self._set:
            return False
        self._set.add(handle)
        self._order.append(handle)
        if len(self._order) > self._limit:
            self._set.discard(self._order.popleft())
        return True


class QueueClient:
    """A producer/consumer connection to a ``shardmgr serve`` process."""

    def __init__(self, address: str | tuple[str, int], **options: Any) -> None:
        """``options`` go to common.wire.client.RpcClient (timeout, retry_for, ...)."""
        self.rpc = RpcClient(address, **options)
        self._seen: dict[str, _Seen] = {}

    def enqueue(self, job: str, model: str, shape: str, lane: str | int, payloads: Sequence[bytes],
                durable: bool = False) -> list[Handle]:
        """Add tasks; one handle per payload, in order. With ``durable`` this
        returns after the flush that covers them."""
        reply = self.rpc.call("workq.enqueue", {"job": job, "model": model, "shape": shape, "lane": lane,
                                                "durable": durable}, joined(list(payloads)))
        return [Handle.unpack(h) for h in reply.parts["handles"].tolist()]

    def results(self, job: str, max_items: int = 1000, wait: float = 0.0) -> list[Result]:
        """Undelivered results of ``job`` (waits up to ``wait`` s for the first)."""
        reply = self.rpc.call("workq.results", {"job": job, "max_items": max_items, "wait": float(wait)})
        parts = reply.parts
        seen = self._seen.setdefault(job, _Seen(REMEMBERED_RESULTS))
        payloads = split(parts["data"], parts["lengths"])
        return [Result(Handle.unpack(h), bytes(p), pos)
                for h, p, pos in zip(parts["handles"].tolist(), payloads, parts["positions"].tolist())
                if seen.add_new(h)]

    def job_status(self, job: str) -> dict[str, int]:
        return self.rpc.call("workq.job_status", {"job": job}).result

    def kick(self, job: str) -> int:
        """Make the job's buried items pending again; returns how many."""
        return int(self.rpc.call("workq.kick", {"job": job}).result["kicked"])

    def stats(self) -> dict[str, Any]:
        return self.rpc.call("workq.stats").result

    def close(self) -> None:
        self.rpc.close()

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def handles_array(handles: Sequence[Handle]) -> np.ndarray:
    """Packed handles (uint64) for a sequence of (segment, offset) pairs."""
    if not len(handles):
        return np.zeros(0, dtype=np.uint64)
    pairs = np.array(handles, dtype=np.int64).reshape(-1, 2)
    return (pairs[:, 0].astype(np.uint64) << np.uint64(32)) | (pairs[:, 1].astype(np.uint64) // np.uint64(OFFSET_UNIT))
