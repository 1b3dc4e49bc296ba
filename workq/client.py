"""The network client for producers and consumers: ``workq.connect``.

Same methods as the embedded Broker. Results are delivered at least once
by the broker (a crash between writing a response and recording it as
delivered can send it again); a QueueClient remembers the handles it returned
per job (the most recent 1,000,000) and drops such repeats, so a consumer
using one QueueClient observes each result once.

Pipelining (docs/workq.md, "Pipelining"): ``enqueue_async`` sends at once
and returns a :class:`~common.wire.pipeline.Pending`; ``pipeline()`` queues
enqueues and sends them together. At most ``max_in_flight`` requests wait
for answers; :meth:`QueueClient.close` waits for them all first.

Threads: a QueueClient is not thread-safe; use one per thread.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from common.wire.client import Reply, RpcClient
from common.wire.part_views import ints
from common.wire.pipeline import DEFAULT_MAX_IN_FLIGHT, Batch, Pending, Pipe, Request

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

    def __init__(self, address: str | tuple[str, int], *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
                 **options: Any) -> None:
        """``max_in_flight``: pipelined requests that may wait for answers
        (see :meth:`enqueue_async`); ``options`` go to
        common.wire.client.RpcClient (timeout, retry_for, token, tls, ca, ...)."""
        self.rpc = RpcClient(address, **options)
        self.pipe = Pipe(self.rpc, max_in_flight)
        self._seen: dict[str, _Seen] = {}

    def enqueue(self, job: str, model: str, shape: str, lane: str | int, payloads: Sequence[bytes],
                durable: bool = False) -> list[Handle]:
        """Add tasks; one handle per payload, in order. With ``durable`` this
        returns after the flush that covers them."""
        request = _enqueue_request(job, model, shape, lane, payloads, durable)
        return _handles(self.rpc.call(request.cmd, request.args, request.parts))

    def enqueue_async(self, job: str, model: str, shape: str, lane: str | int, payloads: Sequence[bytes],
                      durable: bool = False) -> Pending[list[Handle]]:
        """:meth:`enqueue` without waiting: sends the request now and returns
        a Pending whose ``result()`` waits for the handles (or raises the
        request's error). If ``max_in_flight`` requests are unanswered, first
        waits for the oldest answer."""
        return self.pipe.submit(_enqueue_request(job, model, shape, lane, payloads, durable), _handles)

    def pipeline(self, raise_on_error: bool = True) -> QueuePipeline:
        """Enqueues queued and sent together: ``with client.pipeline() as p:
        p.enqueue(...)``; see :class:`QueuePipeline`."""
        return QueuePipeline(self.pipe, raise_on_error)

    @property
    def in_flight(self) -> int:
        """Pipelined requests sent whose answers were not taken yet (at most ``max_in_flight``)."""
        return self.pipe.in_flight

    def settle(self) -> None:
        """Wait for the answer to every pipelined request in flight (each
        Pending is then done; errors stay in them)."""
        self.pipe.settle_all()

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
        """Wait for the answers to pipelined requests (:meth:`settle`; a
        server that closes the connection before reading them would not
        apply them), then close."""
        try:
            self.pipe.settle_all()
        finally:
            self.rpc.close()

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class QueuePipeline(Batch):
    """Enqueues sent together, answered in order (:class:`common.wire.pipeline.Batch`).

    ``with client.pipeline() as p: for x in xs: p.enqueue(...)`` sends the
    queued enqueues in one write at the end of the block (or whenever half
    of ``max_in_flight`` are queued) and waits for all answers; ``p.execute()``
    does so explicitly and returns the handle lists in order. The first
    error is raised once every answer is read (the other requests were
    applied or not on their own); with ``raise_on_error=False`` execute
    returns errors in place. Each ``p.enqueue`` also returns its Pending.
    """

    def enqueue(self, job: str, model: str, shape: str, lane: str | int, payloads: Sequence[bytes],
                durable: bool = False) -> Pending[list[Handle]]:
        """Queue an enqueue (arguments as :meth:`QueueClient.enqueue`)."""
        return self.add(_enqueue_request(job, model, shape, lane, payloads, durable), _handles)


def _enqueue_request(job: str, model: str, shape: str, lane: str | int, payloads: Sequence[bytes],
                     durable: bool) -> Request:
    return Request("workq.enqueue", {"job": job, "model": model, "shape": shape, "lane": lane, "durable": durable},
                   joined(list(payloads)))


def _handles(reply: Reply) -> list[Handle]:
    return [Handle.unpack(h) for h in ints(reply.parts, "handles")]

