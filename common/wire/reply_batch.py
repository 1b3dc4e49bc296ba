"""Replies made by one thread during a batch of work, sent together at its end.

A component's owner thread answers many requests per wake-up (a pipelining
client's enqueues, many producers' at once). Sent one by one, each reply
costs its own syscall; queued for the connection's writer thread, a thread
switch. Inside :func:`batched_replies`, a connection holds the replies the
current thread makes and sends each connection's share with one
non-blocking ``sendmsg`` when the batch ends (see
``shardmgr/server/connection.py``).

Threads: the batch belongs to the thread that opened it (thread-local);
replies made on other threads are not held.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

_local = threading.local()


def batched_replies() -> _Batch:
    """Hold this thread's replies until the block ends, then send them (nested blocks join the outer one)."""
    return _Batch()


class _Batch:
    """The context manager of :func:`batched_replies` (a class: a generator-based one costs more per wake-up)."""

    __slots__ = ("_flushes",)
    _flushes: dict[int, Callable[[], None]] | None

    def __enter__(self) -> None:
        if getattr(_local, "flushes", None) is not None:
            self._flushes = None  # nested: the outer block sends
            return
        self._flushes = {}
        _local.flushes = self._flushes

    def __exit__(self, *exc: object) -> None:
        flushes = self._flushes
        if flushes is None:
            return
        _local.flushes = None
        for flush in flushes.values():
            flush()


def hold(owner: Any, flush: Callable[[], None]) -> bool:
    """Inside a batch on this thread: make sure ``flush`` runs once at its
    end for ``owner`` (a connection holding replies) and return True;
    outside one, return False (the caller sends at once)."""
    flushes: dict[int, Callable[[], None]] | None = getattr(_local, "flushes", None)
    if flushes is None:
        return False
    flushes.setdefault(id(owner), flush)
    return True
