"""The vectorised structural walk over a journal's records.

Records are variable-length, so their starts form a chain: each start plus
its padded size gives the next. Following that chain one record at a time in
Python costs about a microsecond per record. Instead, per window of the file:

1. one strided byte comparison finds every aligned position whose marker tag
   byte (offset +3) is :data:`~common.marker.MARKER_TAG`: the candidates;
2. numpy gathers the candidates' header words and drops those with an
   invalid marker, reserved flag bits set, or a length that overruns;
3. the chain is checked at once: if every candidate's "next" equals the
   following candidate, the candidates are exactly the chain. Where they are
   not (a body that happens to contain a plausible header), the walk jumps
   to the candidate its predecessor points at, skipping the impostor. That
   step runs once per impostor, not once per record;
4. the chain's seq words must count up by one from the expected value.

Before step 1, a step first *gallops*: batches of equal-sized records are
common (fixed-width task payloads, shard journal records), so it predicts
that the next records have the size of the one at the current position and
checks only the predicted headers. Each confirmed header proves the next
prediction, so the run is exact; it ends at the first header that differs.
Galloping touches one cache line per record instead of every byte, and is
used only when a short probe confirms a run.

The first step of a walk follows the chain in plain Python for up to
:data:`~common.journal.record.SMALL_BATCH` records: an owner that scans from
its cursor usually finds one or two new records there, and numpy's per-call
overhead (some twenty calls a step) costs far more than following them. The
rules are the same (tests/common/journal/test_scan.py checks both paths
against each other); a longer chain continues vectorised.

The walk is structural only: it does not compute body checksums (recovery
does that for records past the last checkpoint; ``verify --deep`` for all).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from .marker import MARKER_INDEX, MARKER_TAG, is_marker
from .record import (
    BATCH_CONTINUES,
    LENGTH_MASK,
    RECORD_HEADER,
    RECORD_HEADER_SIZE,
    RESERVED_FLAGS,
    SEQ_MODULUS,
    SMALL_BATCH,
)

WINDOW_BYTES = 64 * 1024 * 1024
"""Bytes of file examined per vectorised step (bounds temporary memory)."""

GALLOP_PROBE = 16
"""Equal-sized records that must follow before a step gallops."""

END = "end"
"""Stop reason: the walk reached ``stop`` exactly on a record boundary."""
INVALID = "invalid"
"""Stop reason: no valid record header at the stop offset (zero, torn, garbage)."""
SEQ = "seq"
"""Stop reason: a structurally valid record carries the wrong seq."""


@dataclasses.dataclass(slots=True)
class RecordChunk:
    """Consecutive records found by one step of a walk (absolute offsets)."""

    offsets: np.ndarray  # int64 [n]
    markers: np.ndarray  # uint32 [n]
    lengths: np.ndarray  # int64 [n], body bytes
    continues: np.ndarray  # bool [n], BATCH_CONTINUES set
    first_seq: int

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, part: slice) -> RecordChunk:
        """The records ``part`` (a slice with step 1) of this chunk."""
        start = range(len(self))[part].start if len(self) else 0
        return RecordChunk(self.offsets[part], self.markers[part], self.lengths[part],
                           self.continues[part], (self.first_seq + start) % SEQ_MODULUS)

    def ends(self, alignment: int) -> np.ndarray:
        """Offset just past each record's padding (the next record's start)."""
        ends: np.ndarray = self.offsets + ((self.lengths + RECORD_HEADER_SIZE + alignment - 1) & ~(alignment - 1))
        return ends


class Walk:
    """Walks the record chain of ``buf`` from ``start`` while it is valid.

    ``buf`` is a uint8 array over the file (offset 0 = file byte 0), at least
    ``stop`` bytes long. ``start`` must be a record start (or ``stop``).
    ``few_first=False`` makes every step vectorised (tests compare the two).
    Iterating yields :class:`RecordChunk` objects; afterwards ``position`` is
    the offset where the walk stopped, ``seq`` the next expected seq and
    ``reason`` one of :data:`END`, :data:`INVALID`, :data:`SEQ`.

    Not thread-safe; the buffer must not shrink below ``stop`` meanwhile.
    """

    def __init__(self, buf: np.ndarray, *, start: int, stop: int, alignment: int, first_seq: int,
                 max_record_bytes: int, window: int = WINDOW_BYTES, few_first: bool = True) -> None:
        if stop > len(buf):
            raise ValueError(f"walk stop {stop} is past the buffer's {len(buf)} bytes")
        self._bytes = buf
        self._words = buf[: len(buf) // 4 * 4].view("<u4")
        self._align = alignment
        self._max = max_record_bytes
        self._stop = stop
        self._window = max(window // alignment * alignment, alignment)
        self.position = start
        self.seq = first_seq % SEQ_MODULUS
        self.reason = ""
        self._first = few_first  # the first step follows up to SMALL_BATCH records in Python

    def __iter__(self) -> Iterator[RecordChunk]:
        while not self.reason:
            chunk = self._step()
            if chunk is not None and len(chunk):
                yield chunk

    def _step(self) -> RecordChunk | None:
        pos, stop = self.position, self._stop
        if pos == stop:
            self.reason = END
            return None
        if stop - pos < RECORD_HEADER_SIZE:
            self.reason = INVALID
            return None
        if self._first:
            self._first = False
            return self._follow_few(pos)
        run = self._gallop(pos)
        if run is not None:
            return run
        hi = min(stop - RECORD_HEADER_SIZE + 1, pos + self._window)
        cand, markers, length_words = self._candidates(pos, hi)
        if len(cand) == 0 or cand[0] != pos:
            self.reason = INVALID
            return None
        lengths = (length_words & LENGTH_MASK).astype(np.int64)
        nxt = cand + ((lengths + RECORD_HEADER_SIZE + self._align - 1) & ~(self._align - 1))
        path, target = _follow(cand, nxt, hi)
        seqs = self._words[cand[path] // 4 + 3]
        expected = (self.seq + np.arange(len(path), dtype=np.int64)) % SEQ_MODULUS
        wrong = np.flatnonzero(seqs != expected)
        if len(wrong):
            path, target = path[: wrong[0]], int(cand[path[wrong[0]]])
            self.reason = SEQ
        elif target < hi:
            self.reason = INVALID  # the chain points at a position with no valid record
        chunk = RecordChunk(cand[path], markers[path], lengths[path],
                            (length_words[path] & BATCH_CONTINUES) != 0, self.seq)
        self.position = target
        self.seq = (self.seq + len(path)) % SEQ_MODULUS
        return chunk

    def _follow_few(self, pos: int) -> RecordChunk:
        """Up to SMALL_BATCH records of the chain from ``pos``, one header at
        a time (the vectorised step's rules: a header that is not a valid
        record ends the walk INVALID, a wrong seq ends it SEQ)."""
        stop, align, seq = self._stop, self._align, self.seq
        offsets: list[int] = []
        markers: list[int] = []
        lengths: list[int] = []
        continues: list[bool] = []
        with self._bytes.data as buf:  # a view released at once: the journal may remap its file later
            while len(offsets) < SMALL_BATCH and pos < stop:
                if stop - pos < RECORD_HEADER_SIZE:
                    self.reason = INVALID
                    break
                marker, _, word, record_seq = RECORD_HEADER.unpack_from(buf, pos)
                length = word & LENGTH_MASK
                size = (length + RECORD_HEADER_SIZE + align - 1) & ~(align - 1)
                if (marker not in MARKER_INDEX or word & RESERVED_FLAGS or length > self._max
                        or pos + size > stop):
                    self.reason = INVALID
                    break
                if record_seq != seq:
                    self.reason = SEQ
                    break
                offsets.append(pos)
                markers.append(marker)
                lengths.append(length)
                continues.append(bool(word & BATCH_CONTINUES))
                pos += size
                seq = (seq + 1) % SEQ_MODULUS
        chunk = RecordChunk(np.array(offsets, dtype=np.int64), np.array(markers, dtype=np.uint32),
                            np.array(lengths, dtype=np.int64), np.array(continues, dtype=bool), self.seq)
        self.position, self.seq = pos, seq
        if pos == stop and not self.reason:
            self.reason = END
        return chunk

    def _gallop(self, pos: int) -> RecordChunk | None:
        """Records from ``pos`` sharing its size, or None if fewer than a probe."""
        words, stop = self._words, self._stop
        length = int(words[pos // 4 + 2]) & LENGTH_MASK
        size = (length + RECORD_HEADER_SIZE + self._align - 1) & ~(self._align - 1)
        fit = (stop - pos) // size  # records of this size (padding included) that fit
        if fit < GALLOP_PROBE or length > self._max:
            return None
        confirmed = self._predict(pos, size, length, GALLOP_PROBE)
        if len(confirmed) < GALLOP_PROBE:
            return None
        confirmed = self._predict(pos, size, length, min(fit, max(self._window // size, GALLOP_PROBE)))
        self.position = pos + size * len(confirmed)
        self.seq = (self.seq + len(confirmed)) % SEQ_MODULUS
        return confirmed

    def _predict(self, pos: int, size: int, length: int, count: int) -> RecordChunk:
        """The leading records at pos, pos+size, ... that are valid and of ``length``."""
        offsets = pos + size * np.arange(count, dtype=np.int64)
        idx = offsets // 4
        markers, length_words, seqs = self._words[idx], self._words[idx + 2], self._words[idx + 3]
        good = (is_marker(markers)
                & ((length_words & (LENGTH_MASK | RESERVED_FLAGS)) == length)
                & (seqs == (self.seq + np.arange(count, dtype=np.int64)) % SEQ_MODULUS))
        n = count if good.all() else int(np.argmin(good))
        return RecordChunk(offsets[:n], markers[:n], np.full(n, length, dtype=np.int64),
                           (length_words[:n] & BATCH_CONTINUES) != 0, self.seq)

    def _candidates(self, pos: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Aligned offsets in [pos, hi) holding a plausible record header."""
        tags = self._bytes[pos + 3: hi + 3: self._align]
        cand = pos + self._align * np.flatnonzero(tags == MARKER_TAG).astype(np.int64)
        idx = cand // 4
        markers = self._words[idx]
        length_words = self._words[idx + 2]
        lengths = (length_words & LENGTH_MASK).astype(np.int64)
        padded = (lengths + RECORD_HEADER_SIZE + self._align - 1) & ~(self._align - 1)
        keep = (is_marker(markers)
                & ((length_words & RESERVED_FLAGS) == 0)
                & (lengths <= self._max)
                & (cand + padded <= self._stop))
        return cand[keep], markers[keep], length_words[keep]


def _follow(cand: np.ndarray, nxt: np.ndarray, hi: int) -> tuple[np.ndarray, int]:
    """Indices of ``cand`` on the chain from ``cand[0]``, and where it leaves.

    The chain leaves either at a position >= ``hi`` (continue in the next
    window) or at a position below ``hi`` that is not a candidate (the end).
    """
    breaks = np.flatnonzero(nxt[:-1] != cand[1:])
    runs: list[np.ndarray] = []
    i = 0
    while True:
        b = np.searchsorted(breaks, i)
        last = int(breaks[b]) if b < len(breaks) else len(cand) - 1
        runs.append(np.arange(i, last + 1))
        target = int(nxt[last])
        if target >= hi:
            break
        k = int(np.searchsorted(cand, target))
        if k == len(cand) or cand[k] != target:
            break
        i = k  # cand[last + 1 .. k - 1] sat inside a body: skip them
    return (runs[0] if len(runs) == 1 else np.concatenate(runs)), target
