"""The GPU worker's client: lease, complete, release, touch.

A Worker remembers the handles it holds. On every (re)connect it first
says ``workq.hello`` with those handles, so after a broker restart (or a
dropped connection) the broker records them as in flight for this worker
before handing it anything new, and tells it which ones to drop (already
completed, or given to someone else). Completing is idempotent per handle,
so a completion cut off by a dropped connection is simply sent again.

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

from common.wire.client import ConnectionLost, RpcClient

from . import errors  # registers the workq.* error codes, so replies raise those classes
from .protocol import Handle, Item, decode_lease, decode_statuses, joined, pack_handles

T = TypeVar("T")


class Worker:
    """A worker connection to a ``shardmgr serve`` process."""

    def __init__(self, address: str | tuple[str, int], worker_id: str, models: Sequence[str] | None = None,
                 shapes: Sequence[str] | None = None, lanes: Sequence[str | int] | None = None,
                 **options: Any) -> None:
        """``models``/``shapes``/``lanes`` restrict what it leases (None: any);
        ``options`` go to common.wire.client.RpcClient (timeout, retry_for, token, tls, ca, ...)."""
        self.worker_id = worker_id
        self._profile = {"worker": worker_id, "session": secrets.token_hex(16), "models": _listed(models),
                         "shapes": _listed(shapes), "lanes": _listed(lanes)}
        self.held: set[int] = set()  # packed handles
        self.rpc = RpcClient(address, on_connect=self._hello, **options)

    def _hello(self, rpc: RpcClient) -> None:
        try:
            reply = rpc.call("workq.hello", {k: v for k, v in self._profile.items() if v is not None},
                             {"held": np.array(sorted(self.held), dtype=np.uint64)})
        except errors.WorkerIdInUse:
            rpc.close()  # unnamed, the connection is no use: the next call connects and says hello again
            raise
        self.held.difference_update(reply.parts["dropped"].tolist())

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
        self.held.update(reply.parts["handles"].tolist())
        return items

    def complete(self, handles: Handle | Sequence[Handle], results: bytes | Sequence[bytes]) -> str | list[str]:
        """Send results; returns, once they are durable, per handle (a single
        status for a single handle) ``'completed'``, or ``'duplicate'`` if
        the item already had a result (from this or another worker: the
        first result is kept, this one dropped). A duplicate is not an
        error: it is what a repeated completion answers, e.g. after a lost
        reply or an expired lease whose item another worker finished::

            worker.complete([a.handle, b.handle], [ra, rb])  # ['completed', 'completed']
            worker.complete([a.handle, c.handle], [ra, rc])  # ['duplicate', 'completed']
            worker.complete(c.handle, rc)                    # 'duplicate'
        """
        single = isinstance(handles, Handle)
        handle_list: list[Handle] = [handles] if single else list(handles)  # type: ignore[list-item, arg-type]
        result_list: list[bytes] = [results] if single else list(results)  # type: ignore[list-item, arg-type]
        packed = pack_handles(handle_list)
        reply = self._retrying(lambda: self.rpc.call("workq.complete", None,
                                                     {"handles": packed, **joined(result_list)}))
        self.held.difference_update(packed.tolist())
        statuses = decode_statuses(reply.parts)
        return statuses[0] if single else statuses

    def release(self, handles: Handle | Sequence[Handle], delay: float = 0.0) -> None:
        """Give items back (pending again after ``delay`` seconds)."""
        packed = pack_handles([handles] if isinstance(handles, Handle) else handles)
        self._retrying(lambda: self.rpc.call("workq.release", {"delay": float(delay)}, {"handles": packed}))
        self.held.difference_update(packed.tolist())

    def touch(self, handles: Handle | Sequence[Handle]) -> None:
        """Extend the leases (another full lease period from now)."""
        packed = pack_handles([handles] if isinstance(handles, Handle) else handles)
        self._retrying(lambda: self.rpc.call("workq.touch", None, {"handles": packed}))

    def close(self) -> None:
        self.rpc.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _listed(values: Sequence[str | int] | None) -> list[str] | None:
    return None if values is None else [str(v) for v in values]
