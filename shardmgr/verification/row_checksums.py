"""The crc32c of row batches, read as fast as the disk and the cores allow
(``verify --deep``).

A sealed row file never shrinks again, so it is mapped and each batch's
bytes are checksummed in place, batches spread over a thread per core
(crc32c releases the GIL). A file still being written may be trimmed by a
live server at any moment (sealing), which would fault a mapping (SIGBUS),
so it is read with ``pread`` into one reused buffer instead.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import crc32c

from common.crc import combine
from common.journal.errors import CannotCheck

PIECE = 16 << 20  # bytes per read of a file being written, and per task when a batch is large

Span = tuple[int, int]  # (offset, length) of one batch's bytes in its file


def batch_crcs(path: Path, spans: Sequence[Span], sealed: bool) -> list[int | None]:
    """The crc32c of each span's bytes; None where the file is too short to hold them."""
    with open(path, "rb") as f:
        if not sealed:
            buf = memoryview(bytearray(PIECE))
            return [_read_crc(f.fileno(), offset, length, buf) for offset, length in spans]
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return [None] * len(spans)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            mm.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mm)
            try:
                return _parallel(mm, view, spans, size)
            finally:
                view.release()


def _parallel(mm: mmap.mmap, view: memoryview, spans: Sequence[Span], size: int) -> list[int | None]:
    pieces = [(i, lo, min(lo + PIECE, offset + length)) for i, (offset, length) in enumerate(spans)
              if offset + length <= size for lo in range(offset, offset + max(length, 1), PIECE)]

    def checksum(piece: tuple[int, int, int]) -> int:
        _, lo, hi = piece
        if hi > lo:  # cold files: ask for this piece and the next at once (readahead)
            start = lo - lo % mmap.PAGESIZE
            mm.madvise(mmap.MADV_WILLNEED, start, min(hi + PIECE, size) - start)
        return crc32c.crc32c(view[lo:hi])

    try:
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            parts = list(pool.map(checksum, pieces))
    except RuntimeError as exc:  # "can't start new thread": a limit of the moment, not damage
        raise CannotCheck(f"{exc}") from exc
    crcs: list[int | None] = [None] * len(spans)
    for (i, lo, hi), crc in zip(pieces, parts):  # pieces of a batch are in order: combine them
        before = crcs[i]
        crcs[i] = crc if before is None else combine(before, crc, hi - lo)
    return crcs


def _read_crc(fd: int, offset: int, length: int, view: memoryview) -> int | None:
    crc = 0
    done = 0
    while done < length:
        want = min(PIECE, length - done)
        got = os.preadv(fd, [view[:want]], offset + done)
        if got < want:
            return None
        crc = crc32c.crc32c(view[:want], value=crc)
        done += want
    return crc
