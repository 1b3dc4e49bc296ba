"""Anchors: a sparse map that proves an offset is a real record start.

A record's header can be forged inside another record's body (a payload that
happens to contain an encoded record), and no check of the bytes at an
offset alone can tell the copy from the original. Only the record chain
can: an offset is a record start if the walk from a known start reaches it.

Anchors are the known starts: the first record starting in each
:data:`ANCHOR_BYTES` bucket of the file, with its seq. Proving a set of
offsets walks, for each bucket they fall in, the records from that bucket's
anchor to the next anchor: at most one bucket of records per bucket touched,
never the whole journal. Memory is 16 bytes per 64 KiB of journal; there is
no per-record index.

Threads: owned by the journal and guarded by its lock.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import numpy as np

from .errors import CorruptJournal, RecordNotFound
from .header import HEADER_SIZE
from .scan import END, Walk

ANCHOR_BYTES: Final = 64 * 1024
PROVEN_REGIONS: Final = 256
"""Walked regions whose record starts are remembered (at most ~2 KiB each)."""


def contains(sorted_values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Mask: which ``queries`` occur in ``sorted_values`` (ascending). A
    binary search each: cheaper than np.isin when the values are sorted."""
    if not len(sorted_values):
        return np.zeros(len(queries), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_values, queries), len(sorted_values) - 1)
    found: np.ndarray = sorted_values[at] == queries
    return found


class Anchors:
    """Sorted (offset, seq) pairs of bucket-first records, grown in place."""

    def __init__(self) -> None:
        self._offsets = np.empty(64, dtype=np.int64)
        self._seqs = np.empty(64, dtype=np.int64)
        self._n = 0
        self._proven: collections.OrderedDict[tuple[int, int], np.ndarray] = collections.OrderedDict()

    @classmethod
    def build(cls, buf: np.ndarray, end: int, alignment: int, max_record_bytes: int, path: Path) -> Anchors:
        """Anchors for the records in [HEADER_SIZE, end), by one walk."""
        anchors, count = cls(), 0
        walk = Walk(buf, start=HEADER_SIZE, stop=end, alignment=alignment, first_seq=0,
                    max_record_bytes=max_record_bytes)
        for chunk in walk:
            anchors.extend(chunk.offsets, count)
            count += len(chunk)
        if walk.reason != END:
            raise CorruptJournal(path, walk.position, f"record chain broken ({walk.reason})")
        return anchors

    def __len__(self) -> int:
        return self._n

    def extend(self, offsets: np.ndarray, first_seq: int) -> None:
        """Add consecutive records (ascending ``offsets``, seqs from ``first_seq``)."""
        if not len(offsets):
            return
        last = int(self._offsets[self._n - 1]) // ANCHOR_BYTES if self._n else -1
        if len(offsets) == 1:  # one append of one record: no numpy machinery
            if int(offsets[0]) // ANCHOR_BYTES != last:
                self._add(offsets[:1], np.array([first_seq], dtype=np.int64))
            return
        new = np.flatnonzero(np.diff(offsets // ANCHOR_BYTES, prepend=last) != 0)
        if len(new):
            self._add(offsets[new], first_seq + new)

    def _add(self, offsets: np.ndarray, seqs: np.ndarray) -> None:
        need = self._n + len(offsets)
        if need > len(self._offsets):
            size = max(need, 2 * len(self._offsets))
            self._offsets = np.resize(self._offsets, size)
            self._seqs = np.resize(self._seqs, size)
        self._offsets[self._n:need] = offsets
        self._seqs[self._n:need] = seqs
        self._n = need

    def truncate(self, end: int) -> None:
        """Forget anchors at or past ``end`` (and every walked region)."""
        self._n = int(np.searchsorted(self._offsets[:self._n], end, side="left"))
        self._proven.clear()

    def regions(self, offsets: np.ndarray, end: int) -> Iterator[tuple[int, int, int, np.ndarray]]:
        """For the ascending ``offsets`` (all below ``end``), yield per anchor
        region ``(start, seq, stop, members)``: walking from ``start`` (seq
        ``seq``) to ``stop`` must meet every offset in ``members``."""
        anchors = self._offsets[:self._n]
        index = np.searchsorted(anchors, offsets, side="right") - 1
        if (index < 0).any():
            raise ValueError("an offset lies before the first anchor")
        bounds = np.flatnonzero(np.diff(index)) + 1
        for group in np.split(np.arange(len(offsets)), bounds):
            i = int(index[group[0]])
            stop = int(anchors[i + 1]) if i + 1 < self._n else end
            yield int(anchors[i]), int(self._seqs[i]), stop, offsets[group]

    def learn(self, offsets: np.ndarray, stop: int, end: int) -> None:
        """A walk found the record starts ``offsets`` in [offsets[0], stop):
        remember every anchor region it covered whole, so proving offsets
        there later needs no walk (``end`` is the journal's end)."""
        if not len(offsets) or not self._n or int(offsets[0]) > int(self._offsets[self._n - 1]):
            return  # no region starts inside (a scan of the tail): nothing covered whole
        anchors = self._offsets[:self._n]
        lo = int(np.searchsorted(anchors, offsets[0], side="left"))
        hi = int(np.searchsorted(anchors, stop, side="right"))
        for i in range(lo, hi):
            start = int(anchors[i])
            region_stop = int(anchors[i + 1]) if i + 1 < self._n else end
            if region_stop > stop:
                break
            a, b = np.searchsorted(offsets, [start, region_stop])
            self._remember((start, region_stop), offsets[a:b].copy())

    def _remember(self, region: tuple[int, int], starts: np.ndarray) -> None:
        self._proven[region] = starts
        self._proven.move_to_end(region)
        if len(self._proven) > PROVEN_REGIONS:
            self._proven.popitem(last=False)

    def prove(self, buf: np.ndarray, offsets: np.ndarray, end: int, alignment: int, max_record_bytes: int,
              path: Path) -> None:
        """Raise RecordNotFound unless every offset (sorted, unique, below
        ``end``) is on the record chain; CorruptJournal if the chain breaks.

        The record starts of the most recently walked regions are kept (a
        small LRU, :data:`PROVEN_REGIONS`): records never move, so a region
        walked once need not be walked again while it is unchanged."""
        for start, seq, stop, members in self.regions(offsets, end):
            found = self._proven.get((start, stop))
            if found is None:
                walk = Walk(buf, start=start, stop=stop, alignment=alignment, first_seq=seq,
                            max_record_bytes=max_record_bytes)
                chunks = [chunk.offsets for chunk in walk]
                if walk.reason != END:
                    raise CorruptJournal(path, walk.position, f"record chain broken ({walk.reason})")
                found = np.concatenate(chunks) if chunks else members[:0]
                self._remember((start, stop), found)
            else:
                self._proven.move_to_end((start, stop))
            missing = members[~contains(found, members)]
            if len(missing):
                raise RecordNotFound(f"{path}: no record starts at offset {int(missing[0])}; "
                                     f"it lies inside another record")
