"""The GPU worker's client: lease, complete, release, touch.

A Worker remembers the handles it holds. On every (re)connect it first
says ``workq.hello`` with those handles, so after a broker restart (or a
dropped connection) the broker records them as in flight for this worker
before handing it anything new, and tells it which ones to drop (already
completed, or given to someone else). Completing is idempotent per handle,
so a completion cut off by a dropped connection is simply sent again.

Pipelining (docs/workq.md, "Pipelining"): ``complete_async``,
``release_async`` and ``touch_async`` send at once and return a
:class:`~common.wire.pipeline.Pending`; ``pipeline()`` queues them and
sends them together. ``held`` changes when a Pending settles, as for the
plain calls when they return; :meth:`Worker.close` waits for the answers first.

A worker id belongs to one Worker at a time. Each Worker sends a random
session token with its hello: reconnecting, it takes its id over from its
old connection even if the server has not noticed that one died yet; a
second Worker (another process) saying hello with an id that a live
connection holds gets :class:`~workq.errors.WorkerIdInUse` from the call
that connected (after the server waited a moment for that connection to
close), and says hello again at its next call.

Threads: a Worker is not thread-safe; use one per thread.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from common.wire.client import ConnectionLost, Reply, RpcClient
from common.wire.part_views import ints
from common.wire.pipeline import DEFAULT_MAX_IN_FLIGHT, Batch, Pending, Pipe, Request

from . import errors  # registers the workq.* error codes, so replies raise those classes
from .protocol import Handle, Item, decode_lease, decode_statuses, joined, pack_handles

T = TypeVar("T")


class Worker:
    """A worker connection to a ``shardmgr serve`` process."""

    def __init__(self, address: str | tuple[str, int], worker_id: str, models: Sequence[str] | None = None,
                 shapes: Sequence[str] | None = None, lanes: Sequence[str | int] | None = None,
                 *, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, **options: Any) -> None:
        """``models``/``shapes``/``lanes`` restrict what it leases (None: any);
        ``max_in_flight``: pipelined requests that may wait for answers;
        ``options`` go to common.wire.client.RpcClient (timeout, retry_for, token, tls, ca, ...)."""
        self.worker_id = worker_id
        self._profile = {"worker": worker_id, "session": secrets.token_hex(16), "models": _listed(models),
                         "shapes": _listed(shapes), "lanes": _listed(lanes)}
        self.held: set[int] = set()  # packed handles
        self.rpc = RpcClient(address, on_connect=self._hello, **options)
        self.pipe = Pipe(self.rpc, max_in_flight)

    def _hello(self, rpc: RpcClient) -> None:
        try:
            reply = rpc.call("workq.hello", {k: v for k, v in self._profile.items() if v is not None},
                             {"held": np.array(sorted(self.held), dtype=np.uint64)})
        except errors.WorkerIdInUse:
            rpc.close()  # unnamed, the connection is no use: the next call connects and says hello again
            raise
        self.held.difference_update(ints(reply.parts, "dropped"))

    def _retrying(self, call: Callable[[], T]) -> T:
        """Run ``call``; if the connection drops, reconnect (saying hello) and run it once more."""
        try:
            return call()
        except ConnectionLost:
            return call()

    def lease(self, max_items: int = 1, wait: float = 0.0) -> list[Item]:
        """Lease up to ``max_items`` tasks, waiting up to ``wait`` s for the first."""
        reply = self._retrying(lambda: self.rpc.call("workq.lease", {"max_items": max_items, "wait": float(wait)},
                                                     wait=float(wait)))
        items = decode_lease(reply.result, reply.parts)
        self.held.update(ints(reply.parts, "handles"))
        return items

    def complete(self, handles: Handle | Sequence[Handle], results: bytes | Sequence[bytes],
                 durable: bool = True) -> str | list[str]:
        """Send results; returns, once they are durable, per handle (a single
        status for a single handle) ``'completed'``, or ``'duplicate'`` if
        the item already had a result (from this or another worker: the
        first result is kept, this one dropped). A duplicate is not an
        error: it is what a repeated completion answers, e.g. after a lost
        reply or an expired lease whose item another worker finished::

            worker.complete([a.handle, b.handle], [ra, rb])  # ['completed', 'completed']
            worker.complete([a.handle, c.handle], [ra, rc])  # ['duplicate', 'completed']
            worker.complete(c.handle, rc)                    # 'duplicate'

        With ``durable=False`` it returns without waiting for the flush
        (group commit: durable at the next flush round, as an enqueue); if
        the server loses the results first, their items run again.
        """
        return self._call(*self._complete(handles, results, durable))

    def complete_and_lease(self, handles: Handle | Sequence[Handle], results: bytes | Sequence[bytes],
                           max_items: int = 1, wait: float = 0.0,
                           durable: bool = True) -> tuple[str | list[str], list[Item]]:
        """:meth:`complete`, then :meth:`lease` (``max_items``, ``wait``), in
        one round trip: the statuses (as complete returns them) and the new
        items. The lease happens once the results are durable (at once with
        ``durable=False``: see :meth:`complete`); if the completion fails,
        nothing is leased and the error is raised. The loop of a worker that
        takes one item at a time::

            items = worker.lease(1, wait=30)
            while items:
                result = run_model(items[0].payload)
                _, items = worker.complete_and_lease(items[0].handle, result, wait=30)
        """
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items} (complete() leases nothing)")
        request, decode = self._complete(handles, results, durable)
        args = {**(request.args or {}), "lease": max_items, "wait": float(wait)}
        reply = self._retrying(lambda: self.rpc.call(request.cmd, args, request.parts, wait=float(wait)))
        statuses = decode(reply)
        items = decode_lease(reply.result, reply.parts)
        self.held.update(ints(reply.parts, "handles"))
        return statuses, items

    def release(self, handles: Handle | Sequence[Handle], delay: float = 0.0) -> None:
        """Give items back (pending again after ``delay`` seconds)."""
        self._call(*self._release(handles, delay))

    def touch(self, handles: Handle | Sequence[Handle]) -> None:
        """Extend the leases (another full lease period from now)."""
        self._call(*self._touch(handles))

    def complete_async(self, handles: Handle | Sequence[Handle], results: bytes | Sequence[bytes],
                       durable: bool = True) -> Pending[str | list[str]]:
        """:meth:`complete` without waiting: sends now, returns a Pending for
        the statuses. The handles leave ``held`` when the Pending settles (its
        ``result()`` is asked, the ``max_in_flight`` bound makes room, or
        :meth:`settle`/:meth:`close`); a connection lost before the answer
        sends it once more, as complete does."""
        return self.pipe.submit(*self._complete(handles, results, durable))

    def release_async(self, handles: Handle | Sequence[Handle], delay: float = 0.0) -> Pending[None]:
        """:meth:`release` without waiting; the handles leave ``held`` when the Pending settles."""
        return self.pipe.submit(*self._release(handles, delay))

    def touch_async(self, handles: Handle | Sequence[Handle]) -> Pending[None]:
        """:meth:`touch` without waiting."""
        return self.pipe.submit(*self._touch(handles))

    def pipeline(self, raise_on_error: bool = True) -> WorkerPipeline:
        """Completes, releases and touches queued and sent together; see :class:`WorkerPipeline`."""
        return WorkerPipeline(self, raise_on_error)

    @property
    def in_flight(self) -> int:
        """Pipelined requests sent whose answers were not taken yet (at most ``max_in_flight``)."""
        return self.pipe.in_flight

    def settle(self) -> None:
        """Wait for the answer to every pipelined request in flight."""
        self.pipe.settle_all()

    def _call(self, request: Request, decode: Callable[[Reply], T]) -> T:
        return decode(self._retrying(lambda: self.rpc.call(request.cmd, request.args, request.parts)))

    # Each request with the decoder of its answer, which also keeps ``held``
    # right: handles leave it only once the server answered (any status).

    def _complete(self, handles: Handle | Sequence[Handle], results: bytes | Sequence[bytes],
                  durable: bool = True) -> tuple[Request, Callable[[Reply], str | list[str]]]:
        single = isinstance(handles, Handle)
        handle_list: list[Handle] = [handles] if single else list(handles)  # type: ignore[list-item, arg-type]
        result_list: list[bytes] = [results] if single else list(results)  # type: ignore[list-item, arg-type]
        packed = pack_handles(handle_list)

        def decode(reply: Reply) -> str | list[str]:
            self.held.difference_update(packed.tolist())
            statuses = decode_statuses(reply.parts)
            return statuses[0] if single else statuses

        args = None if durable else {"durable": False}
        return Request("workq.complete", args, {"handles": packed, **joined(result_list)}, resend=True), decode

    def _release(self, handles: Handle | Sequence[Handle],
                 delay: float) -> tuple[Request, Callable[[Reply], None]]:
        packed = pack_handles([handles] if isinstance(handles, Handle) else handles)

        def decode(reply: Reply) -> None:
            self.held.difference_update(packed.tolist())

        return Request("workq.release", {"delay": float(delay)}, {"handles": packed}, resend=True), decode

    def _touch(self, handles: Handle | Sequence[Handle]) -> tuple[Request, Callable[[Reply], None]]:
        packed = pack_handles([handles] if isinstance(handles, Handle) else handles)
        return Request("workq.touch", None, {"handles": packed}, resend=True), _nothing

    def close(self) -> None:
        """Wait for the answers to pipelined requests (:meth:`settle`), then close."""
        try:
            self.pipe.settle_all()
        finally:
            self.rpc.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class WorkerPipeline(Batch):
    """A worker's completes, releases and touches sent together, answered
    in order (:class:`common.wire.pipeline.Batch`: ``execute`` returns the
    answers, the first error raised once all are read, or errors in place
    with ``raise_on_error=False``). ``held`` changes as for the plain calls."""

    def __init__(self, worker: Worker, raise_on_error: bool = True) -> None:
        super().__init__(worker.pipe, raise_on_error)
        self._worker = worker

    def complete(self, handles: Handle | Sequence[Handle], results: bytes | Sequence[bytes],
                 durable: bool = True) -> Pending[str | list[str]]:
        """Queue a complete (arguments as :meth:`Worker.complete`)."""
        return self.add(*self._worker._complete(handles, results, durable))

    def release(self, handles: Handle | Sequence[Handle], delay: float = 0.0) -> Pending[None]:
        """Queue a release."""
        return self.add(*self._worker._release(handles, delay))

    def touch(self, handles: Handle | Sequence[Handle]) -> Pending[None]:
        """Queue a touch."""
        return self.add(*self._worker._touch(handles))


def _nothing(reply: Reply) -> None:
    return None


def _listed(values: Sequence[str | int] | None) -> list[str] | None:
    return None if values is None else [str(v) for v in values]
