"""A flag one thread sets and another sleeps on: ``threading.Event``'s
interface and behaviour, cheap where a request pays for it.

``threading.Event`` is Python code over a ``Condition`` that is Python code
too: a ``set()`` or ``clear()`` is half a dozen interpreted calls, taken on
every request by the flusher's hurry and the queue loop's wake-up, and an
``is_set()`` on every dispatch. Here the flag is guarded by a plain lock
(whose ``with`` is C), ``is_set()`` reads it without one, ``set()`` has
work only when a thread sleeps in :meth:`wait`, and a sleep blocks on a lock
of its own as ``Condition.wait`` does. In the compiled build
(shardmgr/build.py) none of it runs interpreted.

Threads: any thread may call any method; ``_sleepers`` and ``_flag`` are
written under ``_lock``; a sleeper's own lock is released by set() only.
"""

from __future__ import annotations

import threading


class Wakeup:
    """``threading.Event`` without the interpreted calls when nobody sleeps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flag = False
        self._sleepers: list[threading.Lock] = []  # one held lock per thread in wait(): set() releases them

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        """Set the flag and wake every thread in :meth:`wait`."""
        with self._lock:
            self._flag = True
            for sleeper in self._sleepers:
                sleeper.release()
            self._sleepers.clear()

    def clear(self) -> None:
        with self._lock:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until the flag is set or ``timeout`` seconds pass (None: no
        limit); return the flag, as ``threading.Event.wait`` does."""
        # Condition.wait's own scheme, in compiled code: a sleeper blocks on a
        # lock of its own, held already, until set() releases it.
        with self._lock:
            if self._flag:
                return True
            sleeper = threading.Lock()
            sleeper.acquire()
            self._sleepers.append(sleeper)
        if timeout is None:
            sleeper.acquire()
        elif timeout > 0:
            sleeper.acquire(True, timeout)
        with self._lock:
            if sleeper in self._sleepers:  # timed out: set() did not come
                self._sleepers.remove(sleeper)
                return self._flag
            return True  # set() released it: True even if cleared since, as threading.Event says
