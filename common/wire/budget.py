"""A byte budget shared by many readers: bounds the memory they hold at once.

The server gives one :class:`ByteBudget` to every connection's FrameReader
(frame_reader.py), which charges it for the memory of frames it is still
receiving; the sum over all connections never exceeds ``limit``. A reader
that cannot be served waits, in arrival order, until bytes are released or
its deadline passes.

Threads: any thread may acquire and release; one lock guards the state.
Waiters are served first come, first served, so a large request is not
starved by a stream of small ones (a small one waits behind it).
"""

from __future__ import annotations

import collections
import threading
import time


class ByteBudget:
    """At most ``limit`` bytes handed out at once."""

    def __init__(self, limit: int, name: str = "inflight") -> None:
        """``name`` prefixes its :meth:`stats` keys."""
        if limit <= 0:
            raise ValueError(f"a byte budget's limit must be positive, got {limit}")
        self._limit = limit
        self._name = name
        self._lock = threading.Lock()
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._used = 0
        self._peak = 0
        self._waits = 0
        self._timeouts = 0

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def used(self) -> int:
        """Bytes handed out and not yet released."""
        return self._used

    def acquire(self, n: int, deadline: float | None = None) -> bool:
        """Take ``n`` bytes, waiting (behind earlier waiters) until they are
        free or ``deadline`` (a ``time.monotonic()`` value; None: no limit)
        passes. True if taken; False on timeout, with nothing taken.

        ValueError for ``n`` below 0 or above ``limit`` (it could never be served).
        """
        if not 0 <= n <= self._limit:
            raise ValueError(f"cannot take {n} bytes from a budget of {self._limit}")
        with self._lock:
            if not self._waiters and self._used + n <= self._limit:
                self._take(n)
                return True
            me = _Waiter(n, threading.Condition(self._lock))
            self._waiters.append(me)
            self._waits += 1
            try:
                while self._waiters[0] is not me or self._used + n > self._limit:
                    timeout = None if deadline is None else deadline - time.monotonic()
                    if timeout is not None and timeout <= 0:
                        self._timeouts += 1
                        return False
                    me.cond.wait(timeout)
                self._take(n)
                return True
            finally:
                self._waiters.remove(me)
                self._wake_first()

    def try_acquire(self, n: int) -> bool:
        """Take ``n`` bytes if they are free now and nobody waits; never waits."""
        with self._lock:
            if self._waiters or self._used + n > self._limit:
                return False
            self._take(n)
            return True

    def release(self, n: int) -> None:
        """Give back ``n`` bytes taken earlier."""
        with self._lock:
            if not 0 <= n <= self._used:
                raise ValueError(f"cannot release {n} bytes: {self._used} are taken")
            self._used -= n
            self._wake_first()

    def stats(self) -> dict[str, int]:
        """Gauges and counters for the server's ``stats``."""
        with self._lock:
            name = self._name
            return {f"{name}_bytes": self._used, f"{name}_peak_bytes": self._peak,
                    f"{name}_limit_bytes": self._limit, f"{name}_waits_total": self._waits,
                    f"{name}_wait_timeouts_total": self._timeouts}

    def _take(self, n: int) -> None:
        self._used += n
        self._peak = max(self._peak, self._used)

    def _wake_first(self) -> None:
        """Only the first waiter can be served next (caller holds the lock)."""
        if self._waiters and self._used + self._waiters[0].n <= self._limit:
            self._waiters[0].cond.notify()


class _Waiter:
    """One reader waiting for ``n`` bytes. An object, not a tuple: the queue
    finds its own entry by identity, which a tuple does not keep once compiled
    (mypyc boxes a tuple afresh each time it enters a container)."""

    __slots__ = ("n", "cond")

    def __init__(self, n: int, cond: threading.Condition) -> None:
        self.n = n
        self.cond = cond
