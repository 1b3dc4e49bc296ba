"""Flush rounds led by the thread that answers: a lone durable call on one thread.

A connection's reader thread reads a request, runs it (the owner loop runs
it on this thread when its lock is free: workq/loop.py), and would then
hand the write's sync to the flusher thread, whose round makes the reply
due on yet another thread: two thread switches per durable call, more
than the call's own work. A thread that serves requests one after another
calls :func:`serve` once instead; from then on the journals that code on
it asks to be made durable (:func:`hurry`) wait in the thread's list, and
after each request the thread either

* :func:`lead`\\ s, when no other request is waiting to be read: one round
  for those journals runs here (``Flusher.sync_here``), and the replies it
  makes due are made on this thread, before it blocks on its socket; or
* :func:`hand_off`\\ s, when another request is already buffered: the
  flusher thread syncs them while this thread reads on, so a pipelining
  client's writes still share rounds (group commit), as before.

Either way nothing waits longer than the request that asked: the list is
emptied after every request. While a round runs elsewhere, ``lead`` hands
off too. A caller that is about to block for one durable call (the
embedded broker's plain calls) makes it inside :func:`leading`, which
leads at its end. On a thread that does neither (the owner and flusher
threads), :func:`hurry` is ``Flusher.hurry``.

Threads: the list is thread-local; only its thread reads or empties it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from .flusher import Flusher, Journal

_local = threading.local()


def serve() -> None:
    """This thread leads the rounds its requests need (see the module docstring)."""
    _local.pending = {}


def leading() -> _Leading:
    """A block whose waits this thread leads at its end (on a thread that
    already serves, the block changes nothing: its request's end leads)."""
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
            try:
                lead()
            finally:
                _local.pending = None


def hurry(flusher: Flusher, journals: Iterable[Journal]) -> None:
    """``journals`` are waited for: kept for this thread's :func:`lead` or
    :func:`hand_off` if it serves, else ``flusher.hurry`` at once."""
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
    """Sync what this thread's requests wait for, here and now where no
    round is running (else hand it off); True if anything was waited for."""
    return _settle(here=True)


def hand_off() -> bool:
    """Hand what this thread's requests wait for to the flusher thread."""
    return _settle(here=False)


def _settle(here: bool) -> bool:
    pending: dict[Flusher, dict[int, Journal]] | None = getattr(_local, "pending", None)
    if not pending:
        return False
    # What the round's listeners hurry (a continuation's next write) goes to the flusher thread at
    # once: kept here, it would wait for this thread's next request, which may never come.
    _local.pending = None
    try:
        for flusher, journals in pending.items():
            waited = list(journals.values())
            if not (here and flusher.sync_here(waited)):
                flusher.hurry(waited)
    finally:
        _local.pending = {}
    return True
