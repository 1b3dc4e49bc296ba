"""Deadlines for blocking socket reads: past one, the socket's read side is shut.

A FrameReader (frame_reader.py) arms a deadline when a frame it is receiving
needs another ``recv``; if the deadline passes first, a watcher thread shuts
the socket for reading, the blocked ``recv`` returns, and the reader raises
FrameTimeout. This works for TLS sockets as well as plain ones, where a
receive timeout (``SO_RCVTIMEO``) does not: CPython's SSL layer retries a
read that timed out on a blocking socket. The shutdown goes to the plain
socket underneath (``socket.socket.shutdown``), leaving the TLS state
intact, so an error frame can still be written.

Threads: one watcher thread per process, started on first use; ``arm`` and
``disarm`` from any thread; one lock guards the heap.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from typing import Final


class Deadline:
    """One armed deadline; ``fired`` once the watcher shut its socket."""

    __slots__ = ("sock", "cancelled", "fired")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.cancelled = False
        self.fired = False


class ReadDeadlines:
    """A heap of deadlines and the thread that enforces them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._heap: list[tuple[float, int, Deadline]] = []
        self._cancelled = 0  # entries in the heap whose deadline was disarmed
        self._order = itertools.count()
        self._watcher: threading.Thread | None = None

    def arm(self, sock: socket.socket, deadline: float) -> Deadline:
        """Shut ``sock`` for reading at ``deadline`` (``time.monotonic()``) unless disarmed first."""
        armed = Deadline(sock)
        with self._lock:
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="read-deadlines", daemon=True)
                self._watcher.start()
            heapq.heappush(self._heap, (deadline, next(self._order), armed))
            if self._heap[0][2] is armed:
                self._wake.notify()
        return armed

    def disarm(self, armed: Deadline) -> bool:
        """Cancel a deadline; False if it had already fired (the read side is shut)."""
        with self._lock:
            if armed.fired:
                return False
            armed.cancelled = True
            self._cancelled += 1
            if self._cancelled > 64 and self._cancelled > len(self._heap) // 2:  # keep the heap small
                self._heap = [entry for entry in self._heap if not entry[2].cancelled]
                heapq.heapify(self._heap)
                self._cancelled = 0
            return True

    def _watch(self) -> None:
        while True:
            with self._lock:
                due = self._next_due()
            if due is not None:
                with contextlib.suppress(OSError):  # already closed: nothing left to cut
                    socket.socket.shutdown(due.sock, socket.SHUT_RD)

    def _next_due(self) -> Deadline | None:
        """Wait for the first deadline to pass and mark it fired (lock held)."""
        while True:
            while self._heap and self._heap[0][2].cancelled:
                heapq.heappop(self._heap)
                self._cancelled -= 1
            if not self._heap:
                self._wake.wait()
                continue
            left = self._heap[0][0] - time.monotonic()
            if left > 0:
                self._wake.wait(left)
                continue
            _, _, due = heapq.heappop(self._heap)
            due.fired = True
            return due


READ_DEADLINES: Final = ReadDeadlines()
"""The process's one watcher, shared by every FrameReader."""
