"""A download target that checksums the bytes as they arrive (objects.py's fetch).

s3transfer downloads a large object as ranged GETs on several threads and
hands each piece of a range to one writer thread as ``seek(offset)`` then
``write(data)``: in order within a range, ranges in any order. A
:class:`CheckedFile` writes each piece at its offset (``os.pwrite``),
continues the crc32c of the run of bytes it extends (a new run where it
extends none), and hands it to a write-back thread of its own that asks the kernel
to start writing it to the disk (``start_writeback``), so the fsync that
follows the download finds little left to do. That call blocks while the
disk's queue is full; on its own thread it never holds up the writes, so
the download and the disk run side by side (py-spy and timings:
docs/benchmarks.md, "Cluster: publish and cache fill"). :meth:`CheckedFile.checksum` combines the runs' checksums
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
    """A seekable, write-only file-like object over an open descriptor.
    Use as a context manager: leaving it stops its write-back thread (the
    caller then fsyncs and closes the descriptor)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._position = 0
        self._lock = threading.Lock()
        self._runs: dict[int, tuple[int, int]] = {}  # end offset -> (start offset, crc32c of start..end)
        self._written = threading.Condition()
        self._pending: list[tuple[int, int]] = []  # (offset, length) written, not yet handed to the kernel
        self._closed = False
        self._writeback = threading.Thread(target=self._write_back, name="checked-file-writeback", daemon=True)
        self._writeback.start()

    def __enter__(self) -> CheckedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._written:
            self._closed = True
            self._written.notify()
        self._writeback.join()

    def _write_back(self) -> None:
        """The write-back thread: start the write-out of what was written, until closed."""
        while True:
            with self._written:
                while not self._pending and not self._closed:
                    self._written.wait()
                if not self._pending:
                    return
                pending, self._pending = self._pending, []
            for offset, length in pending:
                start_writeback(self.fd, offset, length)

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
        with self._written:
            self._pending.append((offset, done))
            self._written.notify()
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
