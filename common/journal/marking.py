"""Marker changes: rewriting records' 4-byte state words in place.

A marker change is a journal write like an append: it returns a ticket and
is durable once a flush round covers it. Only the marker bytes of each
record are written; the record's checksum does not cover them (record.py).

Threads: the journal's owner (the thread that writes), under ``_lock``.
"""

from __future__ import annotations

import operator
import os
import struct
from collections.abc import Sequence
from typing import Final, SupportsIndex

import numpy as np

from .errors import MarkerConflict
from .flusher import Ticket
from .marker import MARKER_INDEX, Marker, marker_index
from .record import LENGTH_MASK, RECORD_HEADER_SIZE, SMALL_BATCH, align_up, align_up_array
from .writing import WritingSide

_MARKER_BYTES = {m: int(m).to_bytes(4, "little") for m in Marker}
_LENGTH_WORD: Final = struct.Struct("<I")


class MarkerWriter(WritingSide):
    """The marker-changing side of :class:`~common.journal.Journal` (a layer over its state)."""

    def set_markers(self, offsets: Sequence[int] | np.ndarray, marker: Marker, *,
                    expect: Marker | None = None, proven: bool = False) -> Ticket:
        """Rewrite the markers of the records at ``offsets`` in place.

        Each offset must be a record start of this journal: structurally
        (alignment, range, marker, length) and by the record chain, so an
        offset inside another record's body is refused even if a record
        image sits there. With ``expect``, every record must currently carry
        that marker. On any failure nothing is changed. Only the 4 marker
        bytes of each record are written. ``proven``: the caller vouches the
        offsets came from this journal (see RecordReader._locate); the chain
        proof is skipped, the structural check is not.
        """
        marker = marker if type(marker) is Marker else Marker(marker)
        self._check_writable()
        with self._lock:
            if len(offsets) <= SMALL_BATCH:
                return self._set_markers_few(_listed(offsets), marker, expect, proven)[1]
            return self._set_markers(offsets, marker, expect, proven)[1]

    def set_markers_sized(self, offsets: Sequence[int] | np.ndarray, marker: Marker, *,
                          expect: Marker | None = None, proven: bool = False) -> tuple[Ticket, int]:
        """:meth:`set_markers`, plus the bytes the records occupy on disk
        (header, body, padding; each record once), read while they are
        located: an owner counting dead space need not locate them again."""
        marker = marker if type(marker) is Marker else Marker(marker)
        self._check_writable()
        with self._lock:
            align = self.alignment
            if len(offsets) <= SMALL_BATCH:
                few, ticket = self._set_markers_few(_listed(offsets), marker, expect, proven)
                mm, word = self._file.mm, _LENGTH_WORD.unpack_from
                return ticket, sum(align_up((word(mm, off + 8)[0] & LENGTH_MASK) + RECORD_HEADER_SIZE, align)
                                   for off in few)
            offs, ticket = self._set_markers(offsets, marker, expect, proven)
            words = self._file.words[offs // 4 + 2] & LENGTH_MASK
        return ticket, int(align_up_array(words.astype(np.int64) + RECORD_HEADER_SIZE, align).sum())

    def _set_markers(self, offsets: Sequence[int] | np.ndarray, marker: Marker, expect: Marker | None,
                     proven: bool) -> tuple[np.ndarray, Ticket]:
        """set_markers under _lock: the located offsets (ascending, unique) and the ticket."""
        offs, current = self._locate(offsets, unique=True, proven=proven)
        if expect is not None and (current != expect).any():
            wrong = np.flatnonzero(current != expect)
            raise MarkerConflict(f"{self.path}: {len(wrong)} of {len(offs)} records are not "
                                 f"{Marker(expect).name} (first: offset {int(offs[wrong[0]])} is "
                                 f"{_marker_name(int(current[wrong[0]]))})",
                                 offs[wrong].tolist(), current[wrong].tolist())
        counters = self._counters
        self._file.words[offs // 4] = np.uint32(marker)
        for i, n in enumerate(np.bincount(marker_index(current), minlength=len(Marker)).tolist()):
            counters[i] -= n
        counters[MARKER_INDEX[marker]] += len(offs)
        self._seq += 1
        return offs, self._ticket()

    def _set_markers_few(self, offsets: list[int], marker: Marker, expect: Marker | None,
                         proven: bool) -> tuple[list[int], Ticket]:
        """_set_markers for a few offsets, with plain ints: numpy's per-call
        cost dominates one-item calls (the same checks, errors and writes)."""
        offs, current = self._locate_few(offsets, unique=True, proven=proven)
        if expect is not None and any(word != expect for word in current):
            wrong = [i for i, word in enumerate(current) if word != expect]
            raise MarkerConflict(f"{self.path}: {len(wrong)} of {len(offs)} records are not "
                                 f"{Marker(expect).name} (first: offset {offs[wrong[0]]} is "
                                 f"{_marker_name(current[wrong[0]])})",
                                 [offs[i] for i in wrong], [current[i] for i in wrong])
        self._store_few(offs, marker)
        counters = self._counters
        for word in current:
            counters[MARKER_INDEX[word]] -= 1
        counters[MARKER_INDEX[marker]] += len(offs)
        self._seq += 1
        return offs, self._ticket()

    def _store_few(self, offsets: list[int], marker: Marker) -> None:
        """Write a few markers with pwrite: the first store into a mapped page
        after an fdatasync takes a write fault (ext4 page_mkwrite), measured
        ~2.5x a 4-byte pwrite, and most marker changes land on a page the
        flusher just synced. The mapping is shared, so it sees the bytes at
        once. Should a pwrite fail, the stores go through the mapping, as
        for a batch (which cannot fail): same result, same (no) errors."""
        word = _MARKER_BYTES[marker]
        try:
            for off in offsets:
                if os.pwrite(self._file.fd, word, off) != 4:
                    raise OSError("short marker write")
        except OSError:
            words = self._file.words
            for off in offsets:
                words[off >> 2] = int(marker)


def _marker_name(word: int) -> str:
    try:
        return Marker(word).name
    except ValueError:
        return f"{word:#010x}"


def _listed(offsets: Sequence[int] | np.ndarray) -> list[int]:
    """A few offsets as plain ints: what ``np.asarray(offsets, np.int64).ravel()`` holds."""
    if isinstance(offsets, np.ndarray):
        return list(offsets.astype(np.int64, copy=False).ravel().tolist())
    items: Sequence[SupportsIndex] = offsets  # numpy integers too (a protocol: the compiled build checks no type)
    return [operator.index(offset) for offset in items]
