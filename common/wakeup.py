"""A flag one thread sets and another sleeps on: ``threading.Event``'s
interface and behaviour, cheap where a request pays for it.

``threading.Event`` is Python code over a ``Condition`` that is Python code
too: a ``set()`` or ``clear()`` is half a dozen interpreted calls, taken on
every request by the flusher's hurry and the queue loop's wake-up, and an
``is_set()`` on every dispatch. Here the flag is guarded by a plain lock
(whose ``with`` is C), ``is_set()`` reads it without one, and ``set()``
notifies only when a thread sleeps in :meth:`wait`. In the compiled build
(shardmgr/build.py) none of that runs interpreted; only a sleep itself goes
through ``Condition.wait``.

Threads: any thread may call any method; ``_sleepers`` and ``_flag`` are
written under ``_lock``.
"""

from __future__ import annotations

import threading


class Wakeup:
    """``threading.Event`` without the interpreted calls when nobody sleeps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._flag = False
        self._sleepers = 0  # threads inside wait(): set() notifies only if any

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        """Set the flag and wake every thread in :meth:`wait`."""
        with self._lock:
            self._flag = True
            if self._sleepers:
                self._cond.notify_all()

    def clear(self) -> None:
        with self._lock:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until the flag is set or ``timeout`` seconds pass (None: no
        limit); return the flag, as ``threading.Event.wait`` does."""
        with self._lock:
            if not self._flag:
                self._sleepers += 1
                try:
                    self._cond.wait(timeout)
                finally:
                    self._sleepers -= 1
            return self._flag
