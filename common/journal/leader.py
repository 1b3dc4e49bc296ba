"""Flush rounds led by the thread that answers: a lone durable call on one thread.

A connection's reader thread reads a request, runs it (the owner loop runs
it on this thread when its lock is free: workq/loop.py), and would then
hand the write's sync to the flusher thread, whose round makes the reply
due on yet another thread: two thread switches per durable call, more
than the call's own work. Instead, the reader opens a *window* for each
request (:func:`begin`) before dispatching it; the journals that code on
the thread asks to be made durable inside it (:func:`hurry`) wait in the
thread's list, and after the request the thread closes the window: it

* :func:`lead`\\ s, when no other request is waiting to be read: one round
  for those journals runs here (``Flusher.sync_here``), and the replies it
  makes due are made on this thread, before it blocks on its socket; or
* :func:`hand_off`\\ s, when another request is already buffered: the
  flusher thread syncs them while this thread reads on, so a pipelining
  client's writes still share rounds (group commit), as before.

Outside a window (before the first, between one's close and the next's
opening, on the owner and flusher threads) :func:`hurry` is
``Flusher.hurry``: nothing is kept that no close would settle (what a led
round's listeners, a sent reply's callback or a closing connection hurry
goes to the flusher thread at once). While a round runs elsewhere, ``lead``
hands off too. A caller about to block for one durable call (the embedded
broker's plain calls) makes it inside :func:`leading`, a window that leads
at its end. The thread may block inside a window (a reply's send to a
client that does not read): what it keeps waits for it, at most until the
flusher's next timed round.

Threads: the list is thread-local; only its thread reads or empties it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from .flusher import Flusher, Journal

_local = threading.local()


def begin() -> None:
    """Open this thread's window for one request: what it hurries waits for
    :func:`lead` or :func:`hand_off` (see the module docstring)."""
    _local.pending = {}


def leading() -> _Leading:
    """A window that leads at its end (inside an open window it changes
    nothing: that window's close settles)."""
    return _Leading()


class _Leading:
    """The context manager of :func:`leading` (a class: a generator-based one costs more per call)."""

    __slots__ = ("_mine",)

    def __init__(self) -> None:
        self._mine = False

    def __enter__(self) -> None:
        if getattr(_local, "pending", None) is None:
            _local.pending = {}
            self._mine = True

    def __exit__(self, *exc: object) -> None:
        if self._mine:
            lead()


def hurry(flusher: Flusher, journals: Iterable[Journal]) -> None:
    """``journals`` are waited for: kept for this thread's :func:`lead` or
    :func:`hand_off` inside a window, else ``flusher.hurry`` at once."""
    pending: dict[Flusher, dict[int, Journal]] | None = getattr(_local, "pending", None)
    if pending is None:
        flusher.hurry(journals)
        return
    mine = pending.get(flusher)
    if mine is None:
        mine = pending[flusher] = {}
    for journal in journals:
        mine[id(journal)] = journal


def lead() -> bool:
    """Close the window: sync what it kept, here and now where no round is
    running (else hand it off); True if anything was kept."""
    return _settle(here=True)


def hand_off() -> bool:
    """Close the window: hand what it kept to the flusher thread; True if anything was kept."""
    return _settle(here=False)


def _settle(here: bool) -> bool:
    pending: dict[Flusher, dict[int, Journal]] | None = getattr(_local, "pending", None)
    # Closed first: what the round's listeners hurry (a continuation's next write) goes to the
    # flusher thread at once; kept, it would wait for a next request that may never come.
    _local.pending = None
    if not pending:
        return False
    for flusher, journals in pending.items():
        waited = list(journals.values())
        if not (here and flusher.sync_here(waited)):
            flusher.hurry(waited)
    return True
