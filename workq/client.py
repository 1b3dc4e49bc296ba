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

from common.wire.client import RpcClient

from . import errors  # noqa: F401 - registers the workq.* error codes, so replies raise those classes
from .protocol import Handle, Result, decode_results, joined

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
        """``options`` go to common.wire.client.RpcClient (timeout, retry_for, token, tls, ca, ...)."""
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
        reply = self.rpc.call("workq.results", {"job": job, "max_items": max_items, "wait": float(wait)},
                              wait=float(wait))
        seen = self._seen.setdefault(job, _Seen(REMEMBERED_RESULTS))
        return [r for r in decode_results(reply.parts) if seen.add_new(r.handle.packed)]

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

