"""A file with a shared memory mapping of all of it, grown in extents.

The mapping always covers the whole file (Python's mmap cannot map past the
end), so growing or truncating the file replaces the mapping. Views taken
from an earlier mapping stay valid for the bytes they cover: the old mapping
lives until its last view is gone.

A *snapshot* (read-only) holds a copy of the file read at open instead of
a mapping: for readers beside another process's live writer, which may
shrink the file (sealing trims it), and touching a mapping past a shrunk end
kills the reader with SIGBUS.

Threads: the owner of the enclosing journal calls grow/truncate (under the
journal's lock); readers may use ``bytes``/``words`` concurrently.
"""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

from . import filesystem
from .config import Preallocate
from .record import align_up

Mapped = mmap.mmap | bytes
"""A journal file's bytes: its mapping, or a snapshot's copy (both slice to bytes)."""


class MappedFile:
    """An open file descriptor plus a uint8 and a uint32 view of its mapping."""

    def __init__(self, fd: int, writable: bool, snapshot: bool = False) -> None:
        if writable and snapshot:
            raise ValueError("a snapshot is read-only")
        self.fd = fd
        self.writable = writable
        self.snapshot = snapshot
        self.size = os.fstat(fd).st_size
        self.mm: Mapped = b""  # set by _remap below
        self.bytes = np.zeros(0, dtype=np.uint8)
        self.words = np.zeros(0, dtype="<u4")
        self._remap()

    def _remap(self) -> None:
        if self.snapshot:
            self._read_all()
            return
        access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ
        self.mm = mmap.mmap(self.fd, self.size, access=access)
        self.bytes = np.frombuffer(self.mm, dtype=np.uint8)
        self.words = self.bytes[: self.size // 4 * 4].view("<u4")

    def _read_all(self) -> None:
        """Copy the whole file, up to its end at the time of reading."""
        chunks, size = [], 0
        while chunk := os.pread(self.fd, 16 << 20, size):
            chunks.append(chunk)
            size += len(chunk)
        # bytes, not a bytearray: a slice of it is bytes, as a slice of a mapping is (the compiled
        # build checks that type where the source says it); a join of one chunk is that chunk
        data = b"".join(chunks)
        self.size = len(data)
        self.mm = data
        self.bytes = np.frombuffer(data, dtype=np.uint8)
        self.words = self.bytes[: self.size // 4 * 4].view("<u4")

    def grow_to(self, need: int, *, extent: int, mode: Preallocate, capacity: int | None) -> None:
        """Make the file at least ``need`` bytes, rounded up to an extent (but
        not past ``capacity``, nor past what the disk has free: then just
        ``need``). Raises OSError (e.g. ENOSPC) unchanged."""
        if need <= self.size:
            return
        size = align_up(need, extent)
        if capacity is not None:
            size = max(need, min(size, capacity))
        self.size = filesystem.grow(self.fd, self.size, size, mode, at_least=need)
        self._remap()

    def truncate(self, size: int) -> None:
        """Cut the file to ``size`` bytes (never below the header)."""
        os.ftruncate(self.fd, size)
        self.size = size
        self._remap()

    def close(self) -> None:
        self.bytes = np.zeros(0, dtype=np.uint8)
        self.words = np.zeros(0, dtype="<u4")
        if isinstance(self.mm, mmap.mmap):
            with contextlib.suppress(BufferError):  # a caller still holds a view; the mapping dies with it
                self.mm.close()
        os.close(self.fd)
