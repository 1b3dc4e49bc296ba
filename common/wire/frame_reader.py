"""Reading frames from a socket: framing.py's byte layout, read by one thread
per connection, within a shared memory budget (budget.py) and a per-frame
deadline (deadlines.py)."""

from __future__ import annotations

import socket
import time
from typing import Final, Protocol

import numpy as np

from .budget import ByteBudget
from .deadlines import READ_DEADLINES, Deadline
from .errors import BadFrame, FrameTimeout, FrameTooLarge
from .framing import DEFAULT_MAX_FRAME_BYTES, FRAME_HEAD, MAX_HEADER_BYTES, Frame, decode

READ_BUFFER_BYTES: Final = 16 << 10
"""Each reader's own buffer (resident for the connection's life): frames up
to this size are parsed out of it; larger ones get memory of their own."""
FIRST_STEP_BYTES: Final = 8 << 20
"""A larger frame's memory starts at most this big and doubles as its bytes
arrive: frames up to this size are received with no copy."""


class Receiver(Protocol):
    def recv_into(self, buffer: memoryview, nbytes: int = 0, flags: int = 0) -> int: ...


class FrameReader:
    """Reads whole frames from a blocking socket, buffering small ones.

    A frame that fits the reader's own buffer (READ_BUFFER_BYTES) is parsed
    out of it, so many pipelined requests cost one recv, and copied into
    memory of its own. A larger frame is received straight into its own
    memory, allocated as its bytes arrive: at first ``min(size,
    FIRST_STEP_BYTES)``, doubled whenever it is full, so bytes a peer
    declares and never sends cost (almost) nothing.

    With a ``budget`` (shared by all connections), that memory is charged to
    it from allocation until :meth:`release` (while growing, old and new are
    both charged), waiting in turn when the budget is spent. With
    ``frame_timeout_s``, a frame must arrive whole, waits included, within
    that many seconds of its first byte, or FrameTimeout is raised; between
    frames the reader waits for ever. A recv inside a frame is cut short by
    shutting the socket's read side at the deadline (deadlines.py), so
    ``sock`` must then be a real socket (plain or TLS).

    Not thread-safe: one reader per connection, used by one thread.
    """

    def __init__(self, sock: Receiver, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, *,
                 budget: ByteBudget | None = None, frame_timeout_s: float | None = None) -> None:
        self._sock = sock
        self._max = max_frame_bytes
        self._budget = budget
        self._timeout = frame_timeout_s
        self._buf = bytearray(READ_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._start = self._end = 0
        self._deadline: float | None = None  # set while a frame is arriving (with frame_timeout_s)
        self._size = 0  # the arriving frame's size, once its head is read (for error messages)
        self._armed: Deadline | None = None  # the arriving frame's deadline, once a recv needed it
        self._charged = 0  # budget bytes held for the frame being read or the last one read

    def read_exact(self, n: int) -> bytes | None:
        """``n`` bytes, or None on a clean end of stream before the first byte."""
        if not self._fill(n):
            return None
        data = bytes(self._view[self._start:self._start + n])
        self._start += n
        return data

    def read(self) -> Frame | None:
        """The next frame; None if the peer closed cleanly between frames.

        Raises FrameTooLarge or BadFrame for bytes that break the rules,
        FrameTimeout past the frame's deadline, and ConnectionError if the
        stream ends inside a frame. Releases the previous frame's budget first.
        """
        if self._charged:
            self.release()
        if self._start == self._end:
            self._start = self._end = 0
            got = self._recv(self._view)  # between frames: no deadline
            if got == 0:
                return None
            self._end = got
        if self._timeout is not None:
            self._deadline = time.monotonic() + self._timeout
        try:
            frame = self._read_frame()
            if self._armed is not None and not READ_DEADLINES.disarm(self._armed):
                raise self._too_slow()  # it arrived as the read side was being shut
        except BaseException:
            if self._armed is not None:
                READ_DEADLINES.disarm(self._armed)
            self.release()
            self._deadline, self._size, self._armed = None, 0, None
            raise
        self._deadline, self._size, self._armed = None, 0, None
        return frame

    def release(self) -> None:
        """Give back the budget the last frame held: call once the frame has
        been handed on (or the connection ends). Idempotent."""
        if self._charged:
            assert self._budget is not None
            self._budget.release(self._charged)
            self._charged = 0

    @property
    def max_frame_bytes(self) -> int:
        """Frames larger than this are refused (FrameTooLarge); may be changed between frames."""
        return self._max

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        self._max = value

    def frame_buffered(self) -> bool:
        """True if a whole frame is already buffered (the next read won't block)."""
        have = self._end - self._start
        return have >= FRAME_HEAD.size and have >= FRAME_HEAD.size + FRAME_HEAD.unpack_from(self._buf, self._start)[0]

    def _read_frame(self) -> Frame:
        self._fill(FRAME_HEAD.size)  # some bytes are buffered: an end of stream raises
        size, header_size = FRAME_HEAD.unpack_from(self._buf, self._start)
        if size > self._max:
            raise FrameTooLarge(f"frame of {size} bytes exceeds the limit of {self._max}")
        if header_size > size or header_size > MAX_HEADER_BYTES or header_size == 0:
            raise BadFrame(f"frame header size {header_size} is invalid for a frame of {size} bytes")
        self._start += FRAME_HEAD.size
        self._size = size
        if size <= len(self._buf):
            self._fill(size)
            data = memoryview(bytes(self._view[self._start:self._start + size]))
            self._start += size
        else:
            data = self._read_large(size)
        return decode(data, header_size)

    def _read_large(self, size: int) -> memoryview:
        capacity = min(size, FIRST_STEP_BYTES)
        self._charge(capacity)
        view = np.empty(capacity, dtype=np.uint8).data  # no zero-fill: every byte is received
        have = min(size, self._end - self._start)
        view[:have] = self._view[self._start:self._start + have]
        self._start += have
        while have < size:
            if have == len(view):
                view = self._grow(view, have, size)
            got = self._recv(view[have:])
            if got == 0:
                raise ConnectionError("connection closed inside a frame")
            have += got
        return view

    def _grow(self, old: memoryview, have: int, size: int) -> memoryview:
        """Double a large frame's memory (at most to ``size``), keeping ``have`` bytes."""
        capacity = min(size, 2 * len(old))
        self._charge(capacity)  # the old memory stays charged until it is copied
        view = np.empty(capacity, dtype=np.uint8).data
        view[:have] = old[:have]
        self._budget_release(len(old))
        return view

    def _charge(self, n: int) -> None:
        if self._budget is None:
            return
        if not self._budget.acquire(n, self._deadline):
            raise FrameTimeout(f"no memory for a frame of {self._size} bytes within frame_timeout_s="
                               f"{self._timeout:g} s: frames being received hold {self._budget.used} of the "
                               f"{self._budget.limit} bytes allowed (max_inflight_bytes)")
        self._charged += n

    def _budget_release(self, n: int) -> None:
        if self._budget is not None:
            self._budget.release(n)
            self._charged -= n

    def _fill(self, n: int) -> bool:
        """Buffer at least ``n`` unread bytes; False on EOF before any of them."""
        while self._end - self._start < n:
            if self._start and len(self._buf) - self._start < n:
                left = self._end - self._start
                self._view[:left] = self._view[self._start:self._end]
                self._start, self._end = 0, left
            got = self._recv(self._view[self._end:])
            if got == 0:
                if self._end == self._start:
                    return False
                raise ConnectionError("connection closed inside a frame")
            self._end += got
        return True

    def _recv(self, view: memoryview) -> int:
        """One ``recv_into``; while a frame is arriving, cut short at its deadline."""
        if self._deadline is None:
            return self._sock.recv_into(view)
        if self._armed is None:
            if not isinstance(self._sock, socket.socket):
                raise TypeError("frame_timeout_s needs a real socket")
            self._armed = READ_DEADLINES.arm(self._sock, self._deadline)
        try:
            got = self._sock.recv_into(view)
        except OSError as exc:  # a TLS socket reports the shut read side as an error
            if self._armed.fired:
                raise self._too_slow() from exc
            raise
        if not got and self._armed.fired:
            raise self._too_slow()
        return got

    def _too_slow(self) -> FrameTimeout:
        what = f"a frame of {self._size} bytes" if self._size else "a frame's 8-byte head"
        return FrameTimeout(f"{what} did not arrive within frame_timeout_s={self._timeout:g} s")
