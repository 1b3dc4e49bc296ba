"""Reading a journal's records: by offset, by scan, with their markers.

Every offset a caller passes in is proven to be a record start (structure,
then the record chain via anchors.py) before anything is read or changed.
Bodies are returned as copies, checksum verified.

Threads: any thread may read; each call takes the journal's lock only to
pin a consistent view (mapping and end) and to prove offsets, so a reader
never sees a body cut short by a concurrent append's remap.
"""

from __future__ import annotations

import functools
import struct
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final, NamedTuple

import crc32c
import numpy as np

from .anchors import Anchors
from .errors import CorruptJournal, RecordNotFound
from .header import HEADER_SIZE, Identity
from .mapping import Mapped, MappedFile
from .marker import Marker
from .record import LENGTH_MASK, RECORD_HEADER_SIZE, SMALL_BATCH, RecordHeader, check_record, locate_few, locate_records
from .scan import END, WINDOW_BYTES, RecordChunk, Walk


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``values`` ascending without repeats (no work if they already are)."""
    if len(values) < 2 or bool((values[1:] > values[:-1]).all()):
        return values
    values = np.sort(values)
    return values[np.concatenate(([True], values[1:] != values[:-1]))]


_CRC_WORD: Final = struct.Struct("<I")
_HEAD_WORDS: Final = struct.Struct("<III")
"""A record's first three words: marker, checksum, length (with the batch flag); record.py."""


@functools.lru_cache(maxsize=16)
def _field_struct(dtype: str) -> struct.Struct:
    """The struct format of one numpy integer dtype (e.g. ``"<u8"``)."""
    kind = np.dtype(dtype)
    code = {"u": "BHIQ", "i": "bhiq"}[kind.kind]["1248".index(str(kind.itemsize))]  # standard sizes
    return struct.Struct((">" if kind.byteorder == ">" else "<") + code)


class Record(NamedTuple):
    """One record: where it is, its state and its body."""

    offset: int
    marker: Marker
    body: bytes


class RecordReader:
    """The read side of :class:`~common.journal.Journal` (the first layer over its state)."""

    path: Path
    identity: Identity
    _lock: threading.Lock
    _file: MappedFile
    _end: int
    _anchors: Anchors | None

    def _check_open(self) -> None:
        raise NotImplementedError

    @property
    def alignment(self) -> int:
        return self.identity.alignment

    def read(self, offset: int) -> bytes:
        """The body of the record at ``offset``, checksum verified."""
        return self.read_batch([offset])[0]

    def read_batch(self, offsets: Sequence[int] | np.ndarray) -> list[bytes]:
        """Bodies of the records at ``offsets``, in that order, each checksum
        verified; RecordNotFound if any offset is not a record start."""
        self._check_open()
        with self._lock:
            offs, _ = self._locate(offsets)
            mm, end = self._file.mm, self._end
            return [self._body(mm, int(off), end) for off in offs]

    def peek(self, offset: int, size: int) -> bytes:
        """Bytes [offset, offset + size) of the records, as they are: no
        record or checksum check. For an owner that finds a record from its
        own layout (e.g. a trailer that ends the journal) and then reads it
        with :meth:`bodies`, which checks it. ValueError outside the records."""
        self._check_open()
        with self._lock:
            if not HEADER_SIZE <= offset <= offset + size <= self._end:
                raise ValueError(f"{self.path}: bytes {offset}..{offset + size} are not within the records "
                                 f"({HEADER_SIZE}..{self._end})")
            return bytes(self._file.mm[offset:offset + size])

    def bodies(self, chunk: RecordChunk, skip: int = 0) -> list[memoryview]:
        """Bodies of the records of a chunk from this journal's scan(),
        checksum verified (no chain proof needed: the walk found them),
        without their first ``skip`` bytes (an owner's fixed head).

        The bodies are read-only views into one copy of the span they
        occupy when the records lie close together (one memcpy), else into
        one copy each. CorruptJournal if a checksum fails.
        """
        if not len(chunk):
            return []
        if len(chunk) <= SMALL_BATCH:
            return self._few_bodies(chunk, skip)
        span, starts, ends, stored, computed = self._checksummed(chunk)
        bad = np.flatnonzero(computed != stored)
        if len(bad):
            i = int(bad[0])
            raise CorruptJournal(self.path, int(chunk.offsets[i]), f"record damaged since it was written: "
                                 f"checksum stored {int(stored[i]):#010x}, computed {int(computed[i]):#010x}")
        head = RECORD_HEADER_SIZE + skip
        return [span[s + head:e] for s, e in zip(starts, ends)]

    def _few_bodies(self, chunk: RecordChunk, skip: int) -> list[memoryview]:
        """bodies() for a few records: a copy and a checksum each, with plain ints."""
        self._check_open()
        crc, out = crc32c.crc32c, []
        with self._lock:
            mm = self._file.mm
            records = [memoryview(mm[off:off + RECORD_HEADER_SIZE + length])
                       for off, length in zip(chunk.offsets.tolist(), chunk.lengths.tolist())]
        for off, record in zip(chunk.offsets.tolist(), records):
            stored, computed = _CRC_WORD.unpack_from(record, 4)[0], crc(record[8:])
            if computed != stored:
                raise CorruptJournal(self.path, off, f"record damaged since it was written: "
                                     f"checksum stored {stored:#010x}, computed {computed:#010x}")
            out.append(record[RECORD_HEADER_SIZE + skip:])
        return out

    def record_at(self, offset: int, marker: Marker) -> memoryview | None:
        """The body (checksum verified; a read-only view of one copy) of the
        record at ``offset`` if its marker is ``marker``, else None (the
        marker is read first: a record buried for damage is not read again).
        ``offset`` must be a proven record start: one this journal's scan or
        append gave, or the end of one such record; None at the end of the
        records. For an owner that takes one record at a time from a cursor
        (no scan, no arrays). CorruptJournal if the checksum fails."""
        self._check_open()
        with self._lock:
            if offset >= self._end:
                return None
            mm = self._file.mm
            found, stored, word = _HEAD_WORDS.unpack_from(mm, offset)
            if found != marker:
                return None
            record = memoryview(mm[offset:offset + RECORD_HEADER_SIZE + (word & LENGTH_MASK)])
        computed = crc32c.crc32c(record[8:])
        if computed != stored:
            raise CorruptJournal(self.path, offset, f"record damaged since it was written: "
                                 f"checksum stored {stored:#010x}, computed {computed:#010x}")
        return record[RECORD_HEADER_SIZE:]

    def head_at(self, offset: int, size: int) -> tuple[int, bytes]:
        """The marker word and the first ``size`` body bytes (as they are:
        no checksum check) of the record at ``offset``, a proven record start
        whose body has at least ``size`` bytes (an owner's fixed head).
        ValueError outside the records."""
        self._check_open()
        with self._lock:
            end = offset + RECORD_HEADER_SIZE + size
            if not HEADER_SIZE <= offset < end <= self._end:
                raise ValueError(f"{self.path}: bytes {offset}..{end} are not within the records "
                                 f"({HEADER_SIZE}..{self._end})")
            mm = self._file.mm
            return _HEAD_WORDS.unpack_from(mm, offset)[0], bytes(mm[offset + RECORD_HEADER_SIZE:end])

    def bad_checksums(self, chunk: RecordChunk) -> np.ndarray:
        """Offsets of the records of a chunk from this journal's scan() whose
        checksum fails (verify: every one, not just the first)."""
        if not len(chunk):
            return np.zeros(0, dtype=np.int64)
        _, _, _, stored, computed = self._checksummed(chunk)
        bad: np.ndarray = chunk.offsets[computed != stored]
        return bad

    def _checksummed(self, chunk: RecordChunk) -> tuple[memoryview, list[int], list[int], np.ndarray, np.ndarray]:
        """The chunk's bytes (one copy), each record's start and end in
        them, and its stored and computed checksums."""
        self._check_open()
        offsets, lengths = chunk.offsets, chunk.lengths
        with self._lock:
            mm, words = self._file.mm, self._file.words
            stored = words[offsets // 4 + 1]
            lo, hi = int(offsets[0]), int(offsets[-1] + RECORD_HEADER_SIZE + lengths[-1])
            if hi - lo <= 2 * int((lengths + RECORD_HEADER_SIZE).sum()) + 4096:
                span, starts = memoryview(mm[lo:hi]), (offsets - lo).tolist()
            else:  # scattered records: one copy each, laid end to end
                span, starts = self._copy_scattered(mm, offsets, lengths)
        ends = (np.array(starts, dtype=np.int64) + RECORD_HEADER_SIZE + lengths).tolist()
        crc = crc32c.crc32c
        computed = np.fromiter((crc(span[s + 8:e]) for s, e in zip(starts, ends)), dtype=np.uint32, count=len(ends))
        return span, starts, ends, stored, computed

    def dirty_padding(self, chunk: RecordChunk) -> np.ndarray:
        """Offsets of the records of a chunk whose alignment padding is not
        all zeros (the format says zeros; the checksum does not cover them)."""
        self._check_open()
        starts = chunk.offsets + RECORD_HEADER_SIZE + chunk.lengths
        pads = chunk.ends(self.alignment) - starts
        if not len(pads) or not pads.any():
            return np.zeros(0, dtype=np.int64)
        total = int(pads.sum())
        before = np.zeros(len(pads), dtype=np.int64)
        np.cumsum(pads[:-1], out=before[1:])
        at = np.arange(total, dtype=np.int64) + np.repeat(starts - before, pads)  # every padding byte
        with self._lock:
            dirty = self._file.bytes[np.minimum(at, self._end - 1)] != 0
        owner = np.repeat(np.arange(len(pads)), pads)
        found: np.ndarray = chunk.offsets[np.unique(owner[dirty])]
        return found

    @staticmethod
    def _copy_scattered(mm: Mapped, offsets: np.ndarray, lengths: np.ndarray) -> tuple[memoryview, list[int]]:
        sizes = (lengths + RECORD_HEADER_SIZE).tolist()
        span = memoryview(b"".join(mm[o:o + n] for o, n in zip(offsets.tolist(), sizes)))
        starts = np.zeros(len(sizes), dtype=np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        return span, starts.tolist()

    def sizes(self, offsets: Sequence[int] | np.ndarray, *, proven: bool = False) -> np.ndarray:
        """Bytes each record at ``offsets`` occupies on disk (header, body,
        padding). ``proven``: see :meth:`_locate`."""
        self._check_open()
        with self._lock:
            offs, _ = self._locate(offsets, proven=proven)
            lengths = self._file.words[offs // 4 + 2] & LENGTH_MASK
        align = self.alignment
        sizes: np.ndarray = (lengths.astype(np.int64) + RECORD_HEADER_SIZE + align - 1) & ~(align - 1)
        return sizes

    def fields(self, chunk: RecordChunk, at: int, dtype: str) -> np.ndarray:
        """One fixed-width field of every record of a chunk from this
        journal's scan(): the ``dtype`` value at body byte ``at``, gathered
        with numpy (owners keep fixed per-record headers at the start of
        their bodies). Records shorter than the field give 0."""
        self._check_open()
        if len(chunk) <= SMALL_BATCH:
            return self._few_fields(chunk, at, dtype)
        size = np.dtype(dtype).itemsize
        starts = chunk.offsets + RECORD_HEADER_SIZE + at
        fits = chunk.lengths >= at + size
        values: np.ndarray
        with self._lock:
            buf = self._file.bytes
            if (RECORD_HEADER_SIZE + at) % size == 0:  # aligned (record starts are 8-aligned): one typed gather
                typed = buf[: len(buf) // size * size].view(dtype)
                values = typed[np.where(fits, starts, 0) // size]
            else:
                raw = buf[np.where(fits[:, None], starts[:, None] + np.arange(size), 0)]
                values = raw.copy().view(dtype).ravel()
        values[~fits] = 0
        return values

    def _few_fields(self, chunk: RecordChunk, at: int, dtype: str) -> np.ndarray:
        """fields() for a few records: one struct read each."""
        field = _field_struct(dtype)
        with self._lock:
            mm = self._file.mm
            values = [field.unpack_from(mm, off + RECORD_HEADER_SIZE + at)[0] if length >= at + field.size else 0
                      for off, length in zip(chunk.offsets.tolist(), chunk.lengths.tolist())]
        return np.array(values, dtype=dtype)

    def _body(self, mm: Mapped, offset: int, end: int) -> bytes:
        try:
            header = check_record(mm, offset, end, self.alignment)
        except RecordNotFound as exc:
            raise CorruptJournal(self.path, offset, f"record damaged since it was written: {exc}") from None
        start = offset + RECORD_HEADER_SIZE
        return mm[start:start + header.length]

    def markers(self, offsets: Sequence[int] | np.ndarray, *, proven: bool = False) -> np.ndarray:
        """Current marker words (uint32) of the records at ``offsets``.
        ``proven``: see :meth:`_locate`."""
        self._check_open()
        with self._lock:
            return self._locate(offsets, proven=proven)[1]

    def refreshed(self, chunk: RecordChunk) -> RecordChunk:
        """A chunk from this journal's scan() with its markers read again
        (markers change in place; offsets, lengths and bodies never do).
        Owners that keep a scanned chunk to serve later requests from it
        use this instead of scanning the same records again."""
        self._check_open()
        with self._lock:
            markers = self._file.words[chunk.offsets // 4]
        return RecordChunk(chunk.offsets, markers, chunk.lengths, chunk.continues, chunk.first_seq)

    def scan(self, start: int | None = None, stop: int | None = None,
             window: int = WINDOW_BYTES, *, proven: bool = False) -> Iterator[RecordChunk]:
        """Yield the records in [start, stop) as vectorised chunks.

        ``start`` must be a record start (default: the first record) and
        ``stop`` a record boundary (default: the end). Each chunk covers at
        most about ``window`` bytes (small windows suit callers that stop
        early). Markers are read as they are when each chunk is produced.
        ``proven``: the caller found ``start`` itself (a record start or the
        end from an earlier scan of this journal, e.g. a cursor), so it is
        not proven again (see :meth:`_locate`).
        """
        self._check_open()
        with self._lock:
            buf, end = self._file.bytes, self._end
            start = HEADER_SIZE if start is None else int(start)
            stop = end if stop is None else min(int(stop), end)
            first_seq = 0
            if start < stop and proven:  # the structural check alone, with plain ints
                try:
                    first_seq = check_record(self._file.mm, start, end, self.alignment, verify_crc=False).seq
                except RecordNotFound as exc:
                    raise RecordNotFound(f"{self.path}: {exc}") from None
            elif start < stop:
                self._locate([start])
                first_seq = RecordHeader.unpack(self._file.mm, start).seq
        walk = Walk(buf, start=start, stop=stop, alignment=self.alignment, first_seq=first_seq,
                    max_record_bytes=self.identity.max_record_bytes, window=window)
        for chunk in walk:
            with self._lock:
                self._ensure_anchors().learn(chunk.offsets, walk.position, self._end)
            yield chunk
        if walk.reason != END:
            raise CorruptJournal(self.path, walk.position,
                                 f"record chain broken below the end ({walk.reason}); verify the journal")

    def records(self, start: int | None = None) -> Iterator[Record]:
        """Each record with its marker and body (a convenience over scan())."""
        for chunk in self.scan(start):
            bodies = self.bodies(chunk)
            for off, mark, body in zip(chunk.offsets.tolist(), chunk.markers.tolist(), bodies):
                yield Record(off, Marker(mark), bytes(body))

    def _locate(self, offsets: Sequence[int] | np.ndarray, unique: bool = False,
                proven: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Prove ``offsets`` are record starts; return them (sorted without
        repeats if ``unique``) and their markers. Caller holds _lock.

        With ``proven`` the caller vouches that every offset came from this
        journal itself (its scan or its append, in this process: e.g. an
        item its owner dispatched and still holds), so the record-chain
        proof is skipped; the structural check (alignment, range, marker,
        length) still runs. Owners use it on per-request hot paths, where
        re-walking a region for one offset costs more than the request."""
        if proven and not unique:  # the caller's own offsets, in its order: nothing to sort
            try:
                return locate_records(self._file.words, np.asarray(offsets, dtype=np.int64).ravel(), self._end,
                                      self.alignment)
            except RecordNotFound as exc:
                raise RecordNotFound(f"{self.path}: {exc}") from None
        offs = sorted_unique(np.asarray(offsets, dtype=np.int64).ravel())
        try:
            offs_checked, current = locate_records(self._file.words, offs, self._end, self.alignment)
        except RecordNotFound as exc:
            raise RecordNotFound(f"{self.path}: {exc}") from None
        if len(offs) and not proven:
            self._ensure_anchors().prove(self._file.bytes, offs_checked, self._end, self.alignment,
                                         self.identity.max_record_bytes, self.path)
        if unique:
            return offs_checked, current
        asked = np.asarray(offsets, dtype=np.int64).ravel()
        return asked, self._file.words[asked // 4]

    def _locate_few(self, offsets: list[int], unique: bool = False,
                    proven: bool = False) -> tuple[list[int], list[int]]:
        """:meth:`_locate` for a few offsets, as plain ints (the same rules and errors, no arrays)."""
        offs = sorted(set(offsets)) if unique else offsets
        try:
            current = locate_few(self._file.mm, offs, self._end, self.alignment)
        except RecordNotFound as exc:
            raise RecordNotFound(f"{self.path}: {exc}") from None
        if offs and not proven:
            ascending = offs if unique else sorted(set(offs))
            self._ensure_anchors().prove(self._file.bytes, np.array(ascending, dtype=np.int64), self._end,
                                         self.alignment, self.identity.max_record_bytes, self.path)
        return offs, current

    def _ensure_anchors(self) -> Anchors:
        """The anchors, built by one walk if this open skipped recovery."""
        if self._anchors is None:
            self._anchors = Anchors.build(self._file.bytes, self._end, self.alignment,
                                          self.identity.max_record_bytes, self.path)
        return self._anchors


