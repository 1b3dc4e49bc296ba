"""A connection's outbox: the replies waiting for its writer thread, charged
to the connection's cap (``max_outbox_bytes``) and to the server-wide
budget of queued replies (``max_outbox_total_bytes``).

Threads: none of its own; every method runs under the sender's lock
(sending.py), but :meth:`Outbox.release`, which the budget guards itself.
"""

from __future__ import annotations

import collections
import logging

from common.wire.budget import ByteBudget
from common.wire.component import OnSent

log = logging.getLogger(__name__)

Entry = tuple[list[bytes | memoryview], int, OnSent | None]
"""A reply ready to send: its buffers, their size, and what to run once they are written."""


class Outbox:
    """Replies in order, with the bytes they are charged."""

    def __init__(self, peer: str, cap: int, budget: ByteBudget | None) -> None:
        self._peer = peer
        self._cap = cap
        self._budget = budget
        self._entries: collections.deque[Entry] = collections.deque()
        self._bytes = 0

    def empty(self) -> bool:
        return not self._entries

    def add(self, entries: list[Entry], size: int) -> bool:
        """Queue replies of ``size`` bytes at the end; False (nothing queued:
        the caller closes the connection) if the cap or the budget would pass."""
        if self._bytes + size > self._cap:
            log.warning("closing %s: %d bytes of replies queued and not read", self._peer, self._bytes)
            return False
        if self._budget is not None and not self._budget.try_acquire(size):
            log.warning("closing %s: its %d bytes of queued replies would pass the server's max_outbox_total_bytes",
                        self._peer, self._bytes + size)
            return False
        self._entries.extend(entries)
        self._bytes += size
        return True

    def add_first(self, tail: list[Entry], size: int, before: list[Entry]) -> bool:
        """:meth:`add`, but ahead of what is queued (the rest of a batch
        begun: ``tail`` carries its bytes; the ``on_sent`` callbacks of the
        whole replies inside it, ``before``, run once it is written, in order)."""
        if not self.add(tail, size):
            return False
        self._entries.rotate(1)
        if before:
            buffers, rest, last = self._entries[0]
            callbacks = [o for _, _, o in before if o is not None] + ([last] if last is not None else [])
            self._entries[0] = (buffers, rest, _chained(callbacks) if callbacks else None)
        return True

    def take(self) -> tuple[list[Entry], int]:
        """Everything queued, and the bytes it was charged (:meth:`release` them once written)."""
        batch = list(self._entries)
        charged, self._bytes = self._bytes, 0
        self._entries.clear()
        return batch, charged

    def clear(self) -> int:
        """Drop what is queued (their on_sent never runs); the bytes to :meth:`release`."""
        return self.take()[1]

    def release(self, size: int) -> None:
        """Give ``size`` bytes back to the server-wide budget (any thread)."""
        if self._budget is not None and size:
            self._budget.release(size)


def _chained(callbacks: list[OnSent]) -> OnSent:
    """One on_sent that runs several in order."""

    def run() -> None:
        for callback in callbacks:
            callback()

    return run
