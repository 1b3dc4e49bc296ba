"""A download target that checksums the bytes as they arrive (objects.py's fetch).

s3transfer downloads a large object as ranged GETs on several threads and
hands each piece of a range to one writer thread as ``seek(offset)`` then
``write(data)``: in order within a range, ranges in any order. A
:class:`CheckedFile` writes each piece at its offset (``os.pwrite``),
continues the crc32c of the run of bytes it extends (a new run where it
extends none), and asks the kernel to start writing it back
(``start_writeback``), so the fsync that follows the download finds little
left to do. :meth:`CheckedFile.checksum` combines the runs' checksums
(common/crc.py): the crc32c and size of the file, without reading it again.

What it guarantees: the checksum is of the bytes written, exactly; if the
pieces did not tile the file once from offset 0 (a retried range wrote
bytes twice, say), it returns None and the caller reads the file to
checksum it. It never claims a checksum it did not compute.
"""

from __future__ import annotations

import os
import threading

import crc32c

from common.crc import combine
from common.journal.filesystem import start_writeback


class CheckedFile:
    """A seekable, write-only file-like object over an open descriptor (the caller closes it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._position = 0
        self._lock = threading.Lock()
        self._runs: dict[int, tuple[int, int]] = {}  # end offset -> (start offset, crc32c of start..end)

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        if whence != os.SEEK_SET or offset < 0:
            raise OSError(f"CheckedFile seeks to absolute offsets only, not ({offset}, {whence})")
        self._position = offset
        return offset

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Write ``data`` at the position, whole (a short write is continued), and fold in its crc32c."""
        view = memoryview(data).cast("B")
        offset = self._position
        done = 0
        while done < len(view):
            done += os.pwrite(self.fd, view[done:], offset + done)
        with self._lock:
            start, before = self._runs.pop(offset, (offset, 0))
        crc = crc32c.crc32c(view, value=before)  # continues the run's crc32c (releases the GIL)
        with self._lock:
            self._runs[offset + done] = (start, crc)
        start_writeback(self.fd, offset, done)
        self._position = offset + done
        return done

    def checksum(self) -> tuple[int, int] | None:
        """(crc32c, size) of the file as written, or None if the pieces did not tile it once from offset 0."""
        with self._lock:
            runs = sorted((start, end, crc) for end, (start, crc) in self._runs.items())
        total, size = 0, 0
        for start, end, crc in runs:
            if start != size:
                return None  # a gap or an overlap: bytes written twice, or not at all
            total = crc if size == 0 else combine(total, crc, end - start)
            size = end
        return (total, size) if os.fstat(self.fd).st_size == size else None
