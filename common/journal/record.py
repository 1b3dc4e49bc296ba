"""Journal records: layout, batch encoding and single-record checks.

Every record starts at a multiple of the journal's alignment (at least 8)::

    offset  size  field
    0       4     marker   state word (see marker.py); outside the checksum
    4       4     crc      crc32c of bytes [8, 16 + length): the length word,
                           the seq word and the body
    8       4     length   bits 0-27: body length in bytes;
                           bit 31: BATCH_CONTINUES, set on every record of an
                           append batch except its last;
                           bits 28-30: zero
    12      4     seq      index of the record in the journal, modulo 2**32
    16      n     body
    16+n    pad   zeros up to the next multiple of the alignment

A batch is all-or-nothing across crashes: recovery keeps a record only if
the batch it belongs to ends (a record without BATCH_CONTINUES) inside the
valid prefix.
"""

from __future__ import annotations

import dataclasses
import mmap
import struct
from collections.abc import Sequence
from typing import Final, TypeAlias

import crc32c
import numpy as np

from .errors import RecordNotFound, RecordTooLarge
from .header import HEADER_SIZE
from .marker import Marker, is_marker

RECORD_HEADER: Final = struct.Struct("<IIII")
RECORD_HEADER_SIZE: Final = 16
LENGTH_MASK: Final = (1 << 28) - 1
BATCH_CONTINUES: Final = 1 << 31
RESERVED_FLAGS: Final = 0x7 << 28
SEQ_MODULUS: Final = 1 << 32
SMALL_BATCH = 8
"""Batches up to this many records are encoded and located with plain
Python ints: numpy's per-call overhead (tens of calls per batch) costs more
than the work below about this size, and one item per request is common.
Both paths give the same bytes and the same errors (tests/common/journal)."""

_WORD_PAIR: Final = struct.Struct("<II")

Body = bytes | bytearray | memoryview
Prefix: TypeAlias = np.ndarray | bytes
"""Fixed-width rows put in front of a batch's bodies: uint8 [n, width], or the same rows as one bytes object."""
ReadableBuffer = bytes | bytearray | memoryview | mmap.mmap


def align_up(value: int, alignment: int) -> int:
    """Round up to a multiple of ``alignment`` (a power of two)."""
    return (value + (alignment - 1)) & ~(alignment - 1)


def align_up_array(values: np.ndarray, alignment: int) -> np.ndarray:
    """:func:`align_up` of each element."""
    return (values + (alignment - 1)) & ~(alignment - 1)


@dataclasses.dataclass(slots=True)
class EncodedBatch:
    """A batch of records laid out exactly as it goes on disk."""

    data: bytearray
    offsets: np.ndarray  # int64 [n]: where each record starts, counted from ``start`` of encode_batch
    marker: int  # every record's

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, data: bytearray, offsets: np.ndarray, marker: int) -> None:
        self.data = data
        self.offsets = offsets
        self.marker = marker

    @property
    def markers(self) -> np.ndarray:
        """The records' marker words (uint32 [n])."""
        return np.full(len(self.offsets), self.marker, dtype=np.uint32)


def encode_batch(bodies: Sequence[Body] | np.ndarray, *, first_seq: int, alignment: int,
                 max_record_bytes: int = LENGTH_MASK, marker: Marker = Marker.LIVE,
                 prefix: Prefix | None = None, start: int = 0) -> EncodedBatch:
    """Lay out ``bodies`` as consecutive records starting at ``first_seq``,
    their offsets counted as if ``data`` were written at ``start`` (a
    journal passes its end: the offsets come out absolute, with no second pass).

    ``bodies`` is a sequence of bytes-like objects, or a 2-D uint8 array of
    equal-length bodies (copied into place with one vectorised assignment).
    ``prefix`` (a 2-D uint8 array, one row per body, or the same rows as
    one bytes object) is placed in front of each body, vectorised: owners
    use it for fixed-width per-record headers.
    Headers are built with numpy; the only per-record Python work is the
    body copy for variable-length bodies and one crc32c call per record.
    Raises RecordTooLarge (naming the first offending body) before any work.
    """
    if not isinstance(bodies, np.ndarray) and len(bodies) <= SMALL_BATCH:
        return _encode_few(bodies, first_seq, alignment, max_record_bytes, marker, prefix, start)
    if isinstance(prefix, bytes):
        prefix = np.frombuffer(prefix, dtype=np.uint8).reshape(len(bodies), _bytes_width(prefix, len(bodies)))
    batch = _encode_many(bodies, first_seq, alignment, max_record_bytes, marker, prefix)
    if start:
        batch.offsets += start
    return batch


def _check_prefix(prefix: np.ndarray, n: int) -> int:
    """The prefix's width (ValueError unless it is uint8 [n, width])."""
    if prefix.ndim != 2 or prefix.dtype != np.uint8 or prefix.shape[0] != n:
        raise ValueError(f"prefix must be uint8 [{n}, width], got {prefix.dtype} {prefix.shape}")
    return int(prefix.shape[1])


def _bytes_width(prefix: bytes, n: int) -> int:
    """The width of ``n`` prefix rows given as bytes (ValueError unless they divide evenly)."""
    if (len(prefix) % n if n else len(prefix)):
        raise ValueError(f"a bytes prefix must hold {n} rows of equal width, got {len(prefix)} bytes")
    return len(prefix) // n if n else 0


def _prefix_rows(prefix: Prefix | None, n: int) -> tuple[bytes, int]:
    """The prefix as bytes of ``n`` rows, and their width (ValueError as the vectorised path)."""
    if prefix is None:
        return b"", 0
    if isinstance(prefix, bytes):
        return prefix, _bytes_width(prefix, n)
    width = _check_prefix(prefix, n)
    return prefix.tobytes(), width


def _too_large(index: int, length: int, limit: int) -> RecordTooLarge:
    return RecordTooLarge(f"body {index} of the batch has {length} bytes; the limit is {limit}")


def _encode_few(bodies: Sequence[Body], first_seq: int, alignment: int, max_record_bytes: int, marker: Marker,
                prefix: Prefix | None, base: int = 0) -> EncodedBatch:
    """encode_batch for a few records, with plain bytes and ints: each
    record's checksummed part (length and seq words, prefix row, body) is
    joined once, checksummed, and joined after its marker and crc words."""
    n = len(bodies)
    rows, front = _prefix_rows(prefix, n)
    views = [b if type(b) is bytes else memoryview(b).cast("B") for b in bodies]  # bytes: no view to make
    lengths = [front + len(v) for v in views]
    for i, length in enumerate(lengths):
        if length > max_record_bytes:
            raise _too_large(i, length, max_record_bytes)
    word_marker = int(marker)
    pieces: list[bytes] = []
    offsets: list[int] = []
    total = base
    for i, (length, body) in enumerate(zip(lengths, views)):
        word = length | (BATCH_CONTINUES if i < n - 1 else 0)
        covered = b"".join([_WORD_PAIR.pack(word, (first_seq + i) % SEQ_MODULUS), rows[i * front:(i + 1) * front],
                            body])
        size = align_up(length + RECORD_HEADER_SIZE, alignment)
        pieces += [_WORD_PAIR.pack(word_marker, crc32c.crc32c(covered)), covered,
                   bytes(size - RECORD_HEADER_SIZE - length)]
        offsets.append(total)
        total += size
    return EncodedBatch(bytearray().join(pieces), np.array(offsets, dtype=np.int64), word_marker)


def _encode_many(bodies: Sequence[Body] | np.ndarray, first_seq: int, alignment: int, max_record_bytes: int,
                 marker: Marker, prefix: np.ndarray | None) -> EncodedBatch:
    """encode_batch, vectorised: headers built with numpy."""
    lengths = _lengths(bodies)
    n = len(lengths)
    front = 0
    if prefix is not None:
        front = _check_prefix(prefix, n)
        lengths = lengths + front
    too_big = np.flatnonzero(lengths > max_record_bytes)
    if len(too_big):
        i = int(too_big[0])
        raise _too_large(i, int(lengths[i]), max_record_bytes)
    sizes = align_up_array(lengths + RECORD_HEADER_SIZE, alignment)
    offsets = np.zeros(n, dtype=np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    data = bytearray(int(sizes.sum()))
    raw = np.frombuffer(data, dtype=np.uint8)
    if prefix is not None and front:
        raw[(offsets + RECORD_HEADER_SIZE)[:, None] + np.arange(front)] = prefix
    _copy_bodies(data, raw, bodies, offsets + RECORD_HEADER_SIZE + front, lengths - front)
    words = raw.view("<u4")
    base = offsets // 4
    length_words = lengths.astype(np.uint32)
    if n:
        length_words[:-1] |= np.uint32(BATCH_CONTINUES)
    words[base] = np.uint32(marker)
    words[base + 2] = length_words
    words[base + 3] = (first_seq + np.arange(n, dtype=np.int64)) % SEQ_MODULUS
    view = memoryview(data)
    crc = crc32c.crc32c
    ends = (offsets + RECORD_HEADER_SIZE + lengths).tolist()
    words[base + 1] = np.fromiter((crc(view[o + 8:e]) for o, e in zip(offsets.tolist(), ends)),
                                  dtype=np.uint32, count=n)
    return EncodedBatch(data, offsets, int(marker))


def _lengths(bodies: Sequence[Body] | np.ndarray) -> np.ndarray:
    if isinstance(bodies, np.ndarray):
        if bodies.ndim != 2 or bodies.dtype != np.uint8:
            raise ValueError(f"an array of bodies must be 2-D uint8, got {bodies.dtype} {bodies.shape}")
        return np.full(bodies.shape[0], bodies.shape[1], dtype=np.int64)
    return np.fromiter((memoryview(b).nbytes for b in bodies), dtype=np.int64, count=len(bodies))


def _copy_bodies(data: bytearray, raw: np.ndarray, bodies: Sequence[Body] | np.ndarray, starts: np.ndarray,
                 lengths: np.ndarray) -> None:
    """Copy each body to its start: one assignment for an array (equal
    strides), else one per body."""
    if isinstance(bodies, np.ndarray):
        n = len(bodies)
        if n:
            stride = len(raw) // n
            head = int(starts[0])
            raw.reshape(n, stride)[:, head:head + bodies.shape[1]] = bodies
        return
    for off, size, body in zip(starts.tolist(), lengths.tolist(), bodies):
        data[off:off + size] = body  # same length: no resize, a plain copy


_VALID_MARKERS: Final = frozenset(int(m) for m in Marker)
_MARKER_AND_LENGTH: Final = struct.Struct("<I4xI")  # a record header's marker word (byte 0) and length word (byte 8)


@dataclasses.dataclass(frozen=True, slots=True)
class RecordHeader:
    """One decoded record header."""

    marker: int
    crc: int
    length: int
    continues: bool
    seq: int

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, marker: int, crc: int, length: int, continues: bool, seq: int) -> None:
        object.__setattr__(self, "marker", marker)
        object.__setattr__(self, "crc", crc)
        object.__setattr__(self, "length", length)
        object.__setattr__(self, "continues", continues)
        object.__setattr__(self, "seq", seq)

    @classmethod
    def unpack(cls, buf: ReadableBuffer, offset: int) -> RecordHeader:
        marker, crc, length_word, seq = RECORD_HEADER.unpack_from(buf, offset)
        return cls(marker, crc, length_word & LENGTH_MASK, bool(length_word & BATCH_CONTINUES), seq)


def check_record(buf: ReadableBuffer, offset: int, end: int, alignment: int,
                 *, verify_crc: bool = True) -> RecordHeader:
    """Check that a valid record starts at ``offset`` of ``buf``.

    The record must be aligned, lie wholly before ``end``, carry a valid
    marker and zero reserved flags, and (with ``verify_crc``) match its
    checksum. Raises RecordNotFound saying which rule failed.
    """
    if offset % alignment or offset < 0 or offset + RECORD_HEADER_SIZE > end:
        raise RecordNotFound(f"offset {offset} is not an aligned record offset below the end {end}")
    header = RecordHeader.unpack(buf, offset)
    if header.marker not in _VALID_MARKERS:
        raise RecordNotFound(f"offset {offset}: marker {header.marker:#010x} is not a valid marker")
    (length_word,) = struct.unpack_from("<I", buf, offset + 8)
    if length_word & RESERVED_FLAGS or offset + RECORD_HEADER_SIZE + header.length > end:
        raise RecordNotFound(f"offset {offset}: length word {length_word:#010x} does not fit before {end}")
    if verify_crc:
        body_end = offset + RECORD_HEADER_SIZE + header.length
        computed = crc32c.crc32c(memoryview(buf)[offset + 8:body_end])
        if computed != header.crc:
            raise RecordNotFound(
                f"offset {offset}: checksum mismatch: stored {header.crc:#010x}, computed {computed:#010x}")
    return header


def locate_records(words: np.ndarray, offsets: Sequence[int] | np.ndarray, end: int,
                   alignment: int) -> tuple[np.ndarray, np.ndarray]:
    """Check many record offsets structurally, vectorised; return them and
    their current marker words.

    ``words`` is a uint32 view of the file. Each offset must be aligned, in
    [HEADER_SIZE, end), carry a valid marker, zero reserved flags and a length
    that fits before ``end``. Checksums are not computed: callers pass only
    offsets this journal gave them. Raises RecordNotFound for the first bad one.
    """
    offs = np.asarray(offsets, dtype=np.int64).ravel()
    if len(offs) <= SMALL_BATCH:
        return offs, np.array(locate_few(words.data, offs.tolist(), end, alignment), dtype=np.uint32)
    bad = (offs % alignment != 0) | (offs < HEADER_SIZE) | (offs + RECORD_HEADER_SIZE > end)
    if bad.any():
        raise RecordNotFound(f"offset {int(offs[np.argmax(bad)])} is not an aligned record offset "
                             f"in [{HEADER_SIZE}, {end})")
    idx = offs // 4
    current, length_words = words[idx], words[idx + 2]
    bad = (~is_marker(current) | ((length_words & RESERVED_FLAGS) != 0)
           | (offs + RECORD_HEADER_SIZE + (length_words & LENGTH_MASK) > end))
    if bad.any():
        i = int(np.argmax(bad))
        raise RecordNotFound(f"no record starts at offset {int(offs[i])} (marker word {int(current[i]):#010x})")
    return offs, current


def locate_few(data: mmap.mmap | bytes | memoryview, offsets: list[int], end: int, alignment: int) -> list[int]:
    """locate_records for a few offsets, with plain ints (same rules, same
    errors), over the file's bytes: their current marker words, in order."""
    current = []
    for off in offsets:
        if off % alignment or off < HEADER_SIZE or off + RECORD_HEADER_SIZE > end:
            raise RecordNotFound(f"offset {off} is not an aligned record offset in [{HEADER_SIZE}, {end})")
    for off in offsets:
        marker, length_word = _MARKER_AND_LENGTH.unpack_from(data, off)  # no numpy scalars
        if (marker not in _VALID_MARKERS or length_word & RESERVED_FLAGS
                or off + RECORD_HEADER_SIZE + (length_word & LENGTH_MASK) > end):
            raise RecordNotFound(f"no record starts at offset {off} (marker word {marker:#010x})")
        current.append(marker)
    return current
