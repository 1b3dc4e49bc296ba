"""Row files: a shard's vectors, ids (and refs), fixed-stride rows after a header.

Layout (little-endian), one file per column of a shard::

    0     8   magic       b"\\x89SMROWS\\n"
    8     2   version     1
    10    2   reserved    0
    12    4   column      b"VECS" (float32 vectors), b"IDS_" (int64 ids) or
                          b"REFS" (int64 refs: rewritten shards only, lineage.py)
    16    4   dtype       numpy dtype string, b"<f4 " or b"<i8 "
    20    4   width       elements per row (the dimension; 1 for ids)
    24    4   row_bytes   width * item size: rows are packed, no padding
    28    4   reserved    0
    32    16  shard uuid  the same in a shard's journal, vectors and ids
    48    12  reserved    0
    60    4   crc         crc32c of bytes [0, 60)
    60..4096  zero
    4096  rows, row i at 4096 + i * row_bytes

Rows are packed so that numpy and faiss read them in place from the
mapping (a C-contiguous [rows, width] array). How many rows are valid is not
stored here: the shard's journal says (a file may be longer: preallocated
space, or a torn tail that recovery truncates).

Threads: the shard's writer appends; any thread may read rows below the
count it got from the shard (rows are never rewritten).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import mmap
import os
import struct
from pathlib import Path

import crc32c
import numpy as np

from common.journal import filesystem
from common.journal.config import Preallocate
from common.journal.errors import FormatError, WriteFailed
from common.journal.fdless import map_readonly
from common.units import MiB

MAGIC = b"\x89SMROWS\n"
VERSION = 1
HEADER_SIZE = 4096
HEADER = struct.Struct("<8sHH4s4sII4x16s12x")  # 60 bytes, then the crc
HEADER_USED = HEADER.size + 4  # the header's bytes in use; zeros follow up to HEADER_SIZE
VECTORS, IDS, REFS = b"VECS", b"IDS_", b"REFS"
DTYPES = (b"<f4 ", b"<i8 ")  # as stored: numpy's dtype string, space padded
EXTENT = 64 * MiB


@dataclasses.dataclass(frozen=True, slots=True)
class RowHeader:
    column: bytes
    dtype: str
    width: int
    uuid: bytes

    @property
    def row_bytes(self) -> int:
        return self.width * np.dtype(self.dtype).itemsize

    def encode(self) -> bytes:
        body = HEADER.pack(MAGIC, VERSION, 0, self.column, self.dtype.ljust(4).encode(), self.width,
                           self.row_bytes, self.uuid)
        return (body + struct.pack("<I", crc32c.crc32c(body))).ljust(HEADER_SIZE, b"\0")

    @classmethod
    def decode(cls, raw: bytes, path: Path) -> RowHeader:
        if len(raw) < HEADER_SIZE:
            raise FormatError(path, len(raw), f"row file is {len(raw)} bytes, shorter than its header")
        magic, version, _, column, dtype, width, row_bytes, uid = HEADER.unpack_from(raw, 0)
        if magic != MAGIC:
            raise FormatError(path, 0, f"bad magic {magic!r}: not a row file")
        (stored,) = struct.unpack_from("<I", raw, HEADER.size)
        computed = crc32c.crc32c(raw[:HEADER.size])
        if stored != computed:
            raise FormatError(path, HEADER.size, f"header checksum mismatch: stored {stored:#010x}, "
                              f"computed {computed:#010x}")
        if version != VERSION:
            raise FormatError(path, 8, f"row file version {version} is not supported")
        if column not in (VECTORS, IDS, REFS) or dtype not in DTYPES or width < 1:
            raise FormatError(path, 12, f"column {column!r} of dtype {dtype!r} and width {width} is not a row "
                              "file's")
        header = cls(column, dtype.decode().strip(), width, uid)
        if header.row_bytes != row_bytes:
            raise FormatError(path, 24, f"row_bytes {row_bytes} does not match width {width} of {header.dtype}")
        return header


class RowFile:
    """One column of a shard, appended by pwrite and read through a mapping."""

    def __init__(self, path: Path, header: RowHeader, fd: int, writable: bool, extent: int = EXTENT,
                 preallocate: Preallocate = "fallocate") -> None:
        self.path = path
        self.extent = extent
        self.preallocate = preallocate
        self.header = header
        self.fd = fd
        self.writable = writable
        self.size = os.fstat(fd).st_size
        self._mm: mmap.mmap | ctypes.Array[ctypes.c_char] | None = None
        self._remap()

    @classmethod
    def create(cls, path: Path, header: RowHeader, extent: int = EXTENT,
               preallocate: Preallocate = "fallocate") -> RowFile:
        """Create the file durably; it grows in ``extent``-byte steps,
        preallocated as ``preallocate`` says (common.filesystem.grow)."""
        filesystem.create_atomically(path, header.encode())
        row_file = cls.open(path, writable=True)
        row_file.extent, row_file.preallocate = extent, preallocate
        return row_file

    @classmethod
    def open(cls, path: Path, writable: bool) -> RowFile:
        fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
        try:
            header = RowHeader.decode(os.pread(fd, HEADER_SIZE, 0), path)
            return cls(path, header, fd, writable)
        except BaseException:
            os.close(fd)
            raise

    def _remap(self, size: int | None = None) -> None:
        """Map ``size`` bytes (default: the current size). The old mapping is
        left to the readers still holding rows of it (they keep it alive)."""
        access = mmap.ACCESS_WRITE if self.writable else mmap.ACCESS_READ
        self._mm = mmap.mmap(self.fd, self.size if size is None else size, access=access)

    def rows_fitting(self) -> int:
        """Whole rows the file can hold (its size, less the header)."""
        return max(0, self.size - HEADER_SIZE) // self.header.row_bytes

    def write(self, first_row: int, data: np.ndarray) -> None:
        """Write rows from ``first_row`` (one pwrite), growing the file."""
        start = HEADER_SIZE + first_row * self.header.row_bytes
        raw = np.ascontiguousarray(data).data.cast("B")
        need = start + len(raw)
        try:
            if need > self.size:  # a whole extent, or what the disk still holds (filesystem.grow)
                size = filesystem.grow(self.fd, self.size, -(-need // self.extent) * self.extent, self.preallocate,
                                       at_least=need)
                self._remap(size)  # may fail (ENOMEM): then size and mapping still agree
                self.size = size
            view, pos = raw, start
            while view:
                written = os.pwrite(self.fd, view, pos)
                view, pos = view[written:], pos + written
        except OSError as exc:
            more = max(0, need - self.size)
            raise WriteFailed(f"{self.path}: writing {len(raw)} bytes at {start} (needing {more} more bytes of disk) "
                              f"failed: {exc.strerror or exc}", exc.errno, filename=str(self.path),
                              needed=more) from exc

    def start_writeback(self, first_row: int, count: int) -> None:
        """Start writing rows to the disk now, without waiting (a hint
        before an fdatasync: common.journal.filesystem.start_writeback)."""
        row_bytes = self.header.row_bytes
        filesystem.start_writeback(self.fd, HEADER_SIZE + first_row * row_bytes, count * row_bytes)

    def sync(self) -> None:
        """Make every write so far durable (fdatasync)."""
        os.fdatasync(self.fd)

    def rows(self, count: int) -> np.ndarray:
        """The first ``count`` rows, read-only, in place: [count, width] (ids: [count])."""
        shape = (count, self.header.width) if self.header.column == VECTORS else (count,)
        array = np.frombuffer(self._mm, dtype=self.header.dtype, count=count * self.header.width,  # type: ignore[arg-type]
                              offset=HEADER_SIZE)
        array = array.reshape(shape)
        array.flags.writeable = False
        return array

    def truncate(self, rows: int) -> None:
        """Cut the file to exactly ``rows`` rows (drops preallocation and torn tails)."""
        size = HEADER_SIZE + rows * self.header.row_bytes
        os.ftruncate(self.fd, size)
        self._remap(size)
        self.size = size

    def detach(self) -> None:
        """Map the file anew without a descriptor (common/journal/fdless.py)
        and close its descriptor; rows are read through that mapping from
        now on (a sealed file: nothing is written, cut or remapped any more,
        and a write would fail with EBADF), so sealed shards hold no
        descriptors however many there are. Views taken before keep the old
        mapping (and its duplicate descriptor) until they are gone."""
        if self.fd < 0:
            return
        if self.size:
            old, self._mm = self._mm, map_readonly(self.fd, self.size)
            if isinstance(old, mmap.mmap):
                with contextlib.suppress(BufferError):  # readers hold rows of it: it dies with them
                    old.close()
        os.close(self.fd)
        self.fd = -1

    def close(self) -> None:
        if isinstance(self._mm, mmap.mmap):
            with contextlib.suppress(BufferError):  # a reader still holds rows; the mapping dies with them
                self._mm.close()
        self._mm = None  # an fd-less mapping is unmapped when its last reader is gone
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
