"""Recovery: find a journal's valid prefix, from its header and records.

Rules, in order:

1. The walk (scan.py) follows the record chain from the header while each
   record is structurally valid (marker, flags, length, seq).
2. Records that end past the newest checkpoint's ``end`` were not known to be
   durable; each one's crc32c is checked and the first failure ends the
   prefix. Records before it were made durable by a completed flush and are
   only checked structurally here (``verify --deep`` checks their bodies).
3. A batch is all-or-nothing: the prefix ends after the last record that
   closes a batch (BATCH_CONTINUES clear).
4. If the prefix ends before the checkpoint's ``end``, or the chain does not
   pass through that offset with the checkpoint's record count, durable data
   is damaged: :class:`~common.errors.CorruptJournal` is raised.

This module only reads. The journal applies the result (truncates the torn
tail, rewrites the checkpoint) when it is opened for writing, so recovering
twice gives the same result as recovering once.
"""

from __future__ import annotations

import dataclasses
import time

import crc32c
import numpy as np

from .anchors import Anchors
from .errors import CorruptJournal
from .header import HEADER_SIZE, Checkpoint
from .marker import Marker, marker_index
from .record import RECORD_HEADER_SIZE
from .scan import INVALID, RecordChunk, Walk

CHECKSUM = "checksum"
"""Stop reason: a record past the checkpoint failed its crc32c."""
ZERO = "zero"
"""Stop reason: zero bytes where the next record would start (preallocated space)."""


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What recovery found. Offsets are file byte offsets."""

    end: int
    """Just past the last record kept: the journal's logical end."""
    count: int
    """Records kept."""
    counters: tuple[int, ...]
    """Records per marker state, in Marker order, recounted from the markers."""
    file_size: int
    checkpoint: Checkpoint
    stop_offset: int
    """Where the walk stopped; past ``end`` if records of a torn batch were dropped."""
    stop_reason: str
    """``end``, ``zero``, ``invalid``, ``seq`` or ``checksum``: why the walk stopped."""
    dropped_records: int
    """Valid records past ``end`` that belonged to an incomplete batch."""
    crc_checked_bytes: int
    """Bytes whose checksum was verified (records past the checkpoint)."""
    tail_dirty: bool
    """Non-zero bytes exist in [end, file_size): a torn or dropped tail."""
    seconds: float

    @property
    def clean(self) -> bool:
        """True if there was nothing to repair (no torn or dropped tail)."""
        return not self.tail_dirty and self.dropped_records == 0


def _counts(markers: np.ndarray) -> np.ndarray:
    return np.bincount(marker_index(markers) + 1, minlength=len(Marker) + 1)[1:]


def _first_bad_crc(buf: np.ndarray, chunk: RecordChunk) -> int:
    """Index of the first record in ``chunk`` whose checksum fails, or len."""
    view = buf.data
    stored = buf[: len(buf) // 4 * 4].view("<u4")[chunk.offsets // 4 + 1].tolist()
    body_ends = (chunk.offsets + RECORD_HEADER_SIZE + chunk.lengths).tolist()
    for i, (off, end) in enumerate(zip(chunk.offsets.tolist(), body_ends)):
        if crc32c.crc32c(view[off + 8:end]) != stored[i]:
            return i
    return len(chunk)


class _Recovery:
    """Accumulates the walk's chunks into the valid prefix."""

    def __init__(self, buf: np.ndarray, alignment: int, checkpoint: Checkpoint, path: str,
                 anchors: Anchors) -> None:
        self.buf, self.align, self.ckpt, self.path, self.anchors = buf, alignment, checkpoint, path, anchors
        self.closed = np.zeros(len(Marker), dtype=np.int64)  # counts in closed batches
        self.open = np.zeros(len(Marker), dtype=np.int64)  # counts in the open batch
        self.closed_count = self.open_count = 0
        self.end = HEADER_SIZE  # just past the last closed batch
        self.passed_checkpoint = checkpoint.end == HEADER_SIZE
        self.crc_bytes = 0

    def take(self, chunk: RecordChunk) -> int:
        """Add a chunk; return how many of its records are valid."""
        ends = chunk.ends(self.align)
        keep = len(chunk)
        unsure = np.flatnonzero(ends > self.ckpt.end)
        if len(unsure):
            first = int(unsure[0])
            bad = _first_bad_crc(self.buf, chunk[first:])
            keep = first + bad
            self.crc_bytes += int(ends[keep - 1] - chunk.offsets[first]) if bad else 0
        chunk, ends = chunk[:keep], ends[:keep]
        self._note_checkpoint(ends)
        self.anchors.extend(chunk.offsets, self.closed_count + self.open_count)
        counts = _counts(chunk.markers)
        closers = np.flatnonzero(~chunk.continues)
        if len(closers) == 0:
            self.open += counts
            self.open_count += len(chunk)
            return keep
        cut = int(closers[-1]) + 1
        tail = _counts(chunk.markers[cut:])
        self.closed += self.open + counts - tail
        self.closed_count += self.open_count + cut
        self.open, self.open_count = tail, len(chunk) - cut
        self.end = int(ends[cut - 1])
        return keep

    def _note_checkpoint(self, ends: np.ndarray) -> None:
        if self.passed_checkpoint or not len(ends) or ends[-1] < self.ckpt.end:
            return
        hit = np.flatnonzero(ends == self.ckpt.end)
        seen = self.closed_count + self.open_count + (int(hit[0]) + 1 if len(hit) else -1)
        if not len(hit) or seen != self.ckpt.count:
            raise CorruptJournal(self.path, self.ckpt.end,
                                 f"the checkpoint records {self.ckpt.count} records ending at byte "
                                 f"{self.ckpt.end}, but the record chain does not agree "
                                 f"({'no record ends there' if not len(hit) else f'{seen} records'})")
        self.passed_checkpoint = True


def recover(buf: np.ndarray, *, file_size: int, alignment: int, max_record_bytes: int,
            checkpoint: Checkpoint, path: str = "", anchors: Anchors | None = None) -> RecoveryReport:
    """Compute the valid prefix of the journal in ``buf`` (read-only). If
    given, ``anchors`` (empty) is filled for the records kept."""
    started = time.perf_counter()
    walk = Walk(buf, start=HEADER_SIZE, stop=file_size, alignment=alignment, first_seq=0,
                max_record_bytes=max_record_bytes)
    anchors = Anchors() if anchors is None else anchors
    state = _Recovery(buf, alignment, checkpoint, path, anchors)
    checksum_stop: int | None = None
    for chunk in walk:
        keep = state.take(chunk)
        if keep < len(chunk):
            checksum_stop = int(chunk.offsets[keep])
            break
    if checksum_stop is not None:
        reason, stop_offset = CHECKSUM, checksum_stop
    else:
        reason, stop_offset = walk.reason, walk.position
        if reason == INVALID and not np.any(buf[stop_offset:stop_offset + RECORD_HEADER_SIZE]):
            reason = ZERO
    if state.end < checkpoint.end or not state.passed_checkpoint:
        raise CorruptJournal(path, stop_offset,
                             f"records up to byte {checkpoint.end} ({checkpoint.count} records) were "
                             f"flushed durable, but the valid chain ends at byte {state.end} "
                             f"({state.closed_count} records; the walk stopped at byte {stop_offset}: "
                             f"{reason})")
    end = state.end
    anchors.truncate(end)
    return RecoveryReport(
        end=end, count=state.closed_count, counters=tuple(int(c) for c in state.closed),
        file_size=file_size, checkpoint=checkpoint, stop_offset=stop_offset, stop_reason=reason,
        dropped_records=state.open_count, crc_checked_bytes=state.crc_bytes,
        tail_dirty=bool(end < file_size and np.any(buf[end:file_size])),
        seconds=time.perf_counter() - started)
