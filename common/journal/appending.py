"""Appends: adding records at a journal's end.

A batch of records is laid out by record.py and written with one ``pwrite``
(measured faster than copying into the mapping; see docs/benchmarks.md)
into space the file grows to first (mapping.py: preallocated extents). A
batch survives a crash whole or not at all: recovery drops a torn one. Like
a marker change, an append returns a ticket and is durable once a flush
round covers it.

Threads: the journal's owner (the thread that writes), under ``_lock``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .config import JournalConfig
from .errors import JournalFull, JournalSealed, WriteFailed
from .flusher import Ticket
from .marker import MARKER_INDEX, Marker
from .marking import MarkerWriter
from .record import Body, Prefix, encode_batch


class Appended(NamedTuple):
    """Where a batch went (absolute offsets, one per record) and its ticket."""

    offsets: np.ndarray
    ticket: Ticket


class RecordAppender(MarkerWriter):
    """The appending side of :class:`~common.journal.Journal` (a layer over its state; marking.py's
    below it only because a compiled class has one base: appends use nothing of it)."""

    config: JournalConfig
    _sealed: bool
    _count: int

    def _fail(self, exc: OSError, during: str) -> None:
        """Durability is lost for good (syncer.py)."""
        raise NotImplementedError

    def append(self, body: Body, marker: Marker = Marker.LIVE) -> tuple[int, Ticket]:
        """Append one record; return its offset and ticket."""
        offsets, ticket = self.append_batch([body], marker)
        return int(offsets[0]), ticket

    def append_batch(self, bodies: Sequence[Body] | np.ndarray, marker: Marker = Marker.LIVE,
                     prefix: Prefix | None = None) -> Appended:
        """Append records with one write; all of them survive a crash or none.

        ``bodies`` is a sequence of bytes-like objects or a 2-D uint8 array
        of equal-length bodies; ``prefix`` (uint8 [n, width], or those rows as bytes) is prepended to
        each body. Raises RecordTooLarge, JournalSealed, JournalFull or
        WriteFailed; in each case nothing was appended.
        """
        marker = marker if type(marker) is Marker else Marker(marker)
        self._check_writable()
        with self._lock:
            if self._sealed:
                raise JournalSealed(f"{self.path} is sealed: appends are refused")
            start = self._end
            batch = encode_batch(bodies, first_seq=self._count, alignment=self.alignment,
                                 max_record_bytes=self.identity.max_record_bytes, marker=marker, prefix=prefix,
                                 start=start)
            self._check_capacity(len(batch.data))
            self._write(batch.data, start)
            offsets = batch.offsets
            self._ensure_anchors().extend(offsets, self._count)
            self._end = start + len(batch.data)
            self._count += len(offsets)
            self._counters[MARKER_INDEX[marker]] += len(offsets)
            self._seq += 1
            # tuple.__new__: the NamedTuple's own constructor is exec'd Python code, run interpreted
            # in the compiled build on every append (the same object either way)
            return tuple.__new__(Appended, (offsets, self._ticket()))

    def _check_capacity(self, total: int) -> None:
        """JournalFull if ``total`` more bytes would pass the configured capacity."""
        cap = self.config.capacity_bytes
        if cap is not None and self._end + total > cap:
            raise JournalFull(f"{self.path}: appending {total} bytes at {self._end} would pass "
                              f"the capacity of {cap} bytes")

    def _write(self, data: bytearray, start: int) -> None:
        """pwrite ``data`` at ``start``, growing the file; roll back on error."""
        try:
            self._file.grow_to(start + len(data), extent=self.config.extent_bytes,
                               mode=self.config.preallocate, capacity=self.config.capacity_bytes)
            view, pos = memoryview(data), start
            while view:
                written = os.pwrite(self._file.fd, view, pos)
                view, pos = view[written:], pos + written
        except OSError as exc:
            try:  # drop partly written bytes, durably: a flush may already have synced some of them
                self._file.truncate(start)
                os.fdatasync(self._file.fd)
            except OSError as again:
                self._fail(again, "rolling back a failed append")
            raise WriteFailed(f"{self.path}: writing {len(data)} bytes at {start} failed: "
                              f"{exc.strerror or exc}", exc.errno, filename=str(self.path), needed=len(data)) from exc
