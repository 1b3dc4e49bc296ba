"""A job's completion log: its results, in order, with delivered markers.

One directory per job (``results/<job id hex>/``) holding numbered ``WQCL``
journals; the newest is the active one, older ones are sealed. A result is
appended LIVE and marked DELIVERED once a consumer has it. Results are
handed out in log order from a delivery cursor; results sent but not yet
confirmed flushed to the consumer's socket are "in delivery" and skipped.

When the oldest segment is sealed and fully delivered the collector deletes
it, after appending a *ledger* entry to the active segment that carries the
running totals of everything collected (so job counts survive collection
and restarts) and made durable. Ledger entries are written DELIVERED. A
crash between the ledger entry and the unlink is finished by recovery: a
segment the newest ledger says is collected is deleted then.

Threads: owned by the broker's owner thread.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import msgpack
import numpy as np

from common import Flusher, Journal, JournalConfig, Marker, Ticket
from common.filesystem import make_dirs
from common.header import HEADER_SIZE
from common.scan import RecordChunk

from .records import HANDLE_AT, HEAD_BYTES, LEDGER, POSITION_AT, RESULTS_KIND, heads
from .segment import scan_window

SUFFIX = ".wqcl"
LIVE = np.uint32(Marker.LIVE)


@dataclasses.dataclass(slots=True)
class Ledger:
    """Running totals of collected segments (segments are collected oldest
    first, so one number says which are gone)."""

    collected_below: int = 0  # every segment with a smaller seq was collected
    results: int = 0  # results those segments held (all delivered)
    max_position: int = -1


@dataclasses.dataclass(slots=True)
class Outgoing:
    """Results planned for one consumer response (not yet confirmed sent)."""

    seq: int
    offsets: np.ndarray
    handles: np.ndarray
    positions: np.ndarray
    payloads: list[memoryview]
    cursor: int  # the segment's delivery cursor once these are sent


class JobLog:
    """One job's completion log segments and delivery state."""

    def __init__(self, directory: Path, name: str, job: int, flusher: Flusher, segment_bytes: int) -> None:
        self.directory = directory
        self.name = name
        self.job = job
        self._flusher = flusher
        self._segment_bytes = segment_bytes
        self.segments: dict[int, Journal] = {}  # seq -> journal
        self.ledger = Ledger()
        self.ledger_entries: dict[int, int] = {}  # seq -> ledger records in that segment
        self.max_position = -1
        self.cursors: dict[int, int] = {}  # seq -> no undelivered result outside delivery lies before it
        self.last_append = time.monotonic()
        self.in_delivery: dict[int, set[int]] = {}  # seq -> offsets sent, not yet confirmed

    # ----------------------------------------------------------- lifecycle

    @classmethod
    def create(cls, root: Path, name: str, job: int, flusher: Flusher, segment_bytes: int) -> JobLog:
        directory = root / f"{job:016x}"
        make_dirs(directory)
        log = cls(directory, name, job, flusher, segment_bytes)
        log._new_segment(0)
        return log

    def _new_segment(self, seq: int) -> Journal:
        meta = msgpack.packb({"job": self.name, "job_id": self.job, "seq": seq})
        journal = Journal.create(self.directory / f"{seq:08d}{SUFFIX}", kind=RESULTS_KIND, flusher=self._flusher,
                                 metadata=meta, config=JournalConfig(capacity_bytes=self._segment_bytes))
        self.segments[seq] = journal
        return journal

    @property
    def active(self) -> Journal:
        return self.segments[max(self.segments)]

    # ---------------------------------------------------------------- counts

    @property
    def completed(self) -> int:
        """Results ever recorded (live segments plus the ledger)."""
        return self.ledger.results + sum(j.count - self.ledger_entries.get(s, 0) for s, j in self._uncollected())

    @property
    def delivered(self) -> int:
        return self.ledger.results + sum(j.count_of(Marker.DELIVERED) - self.ledger_entries.get(s, 0)
                                         for s, j in self._uncollected())

    def _uncollected(self) -> list[tuple[int, Journal]]:
        return [(s, j) for s, j in self.segments.items() if s >= self.ledger.collected_below]

    @property
    def undelivered(self) -> int:
        return sum(j.count_of(Marker.LIVE) for j in self.segments.values())

    # ---------------------------------------------------------------- writes

    def append(self, handles: np.ndarray, positions: np.ndarray, payloads: list[memoryview] | list[bytes]) -> Ticket:
        """Record results (one batch); rotates to a new segment when full."""
        size = sum(len(p) for p in payloads) + len(payloads) * (HEAD_BYTES + 32)
        journal = self._writable(size)
        head = heads(handles, positions, time.time_ns(), len(handles))
        _, ticket = journal.append_batch(payloads, prefix=head)
        if len(positions):
            self.max_position = max(self.max_position, int(positions.max()))
        return ticket

    def _writable(self, size: int) -> Journal:
        """The active segment, or a new one if it is sealed or too full."""
        journal = self.active
        if journal.sealed or (journal.end + size > self._segment_bytes and journal.count):
            journal.seal()
            journal = self._new_segment(max(self.segments) + 1)
        self.last_append = time.monotonic()
        return journal

    def write_ledger(self) -> Ticket:
        """Append the running totals (written DELIVERED: never handed out)."""
        body = msgpack.packb(dataclasses.asdict(self.ledger))
        journal = self._writable(len(body) + 64)
        _, ticket = journal.append_batch([body], marker=Marker.DELIVERED, prefix=heads(LEDGER, 0, time.time_ns(), 1))
        seq = max(self.segments)
        self.ledger_entries[seq] = self.ledger_entries.get(seq, 0) + 1
        return ticket

    def collectable(self) -> int | None:
        """The oldest segment, if it is sealed, not active, and fully delivered."""
        seq = min(self.segments)
        journal = self.segments[seq]
        if (seq != max(self.segments) and journal.sealed and journal.count_of(Marker.LIVE) == 0
                and not self.in_delivery.get(seq)):
            return seq
        return None

    def forget_segment(self, seq: int) -> Journal:
        """Drop a collected segment from memory; the caller deletes the file."""
        self.in_delivery.pop(seq, None)
        self.cursors.pop(seq, None)
        self.ledger_entries.pop(seq, None)
        return self.segments.pop(seq)

    # -------------------------------------------------------------- delivery

    def take(self, limit: int) -> list[Outgoing]:
        """Plan: up to ``limit`` undelivered results in log order."""
        out: list[Outgoing] = []
        got = 0
        for seq in sorted(self.segments):
            journal = self.segments[seq]
            if journal.count_of(Marker.LIVE) <= len(self.in_delivery.get(seq, ())):
                continue
            skip = np.fromiter(self.in_delivery.get(seq, ()), dtype=np.int64)
            for chunk in journal.scan(start=self.cursors.get(seq, HEADER_SIZE), window=scan_window(journal, limit)):
                handles = journal.fields(chunk, HANDLE_AT, "<u8")
                mask = (chunk.markers == LIVE) & (handles != LEDGER)
                if len(skip):
                    mask &= ~np.isin(chunk.offsets, skip)
                picked = np.flatnonzero(mask)[: limit - got]
                if len(picked):
                    out.append(self._outgoing(seq, journal, chunk, picked, handles))
                    got += len(picked)
                if got >= limit:
                    return out
        return out

    def _outgoing(self, seq: int, journal: Journal, chunk: RecordChunk, picked: np.ndarray,
                  handles: np.ndarray) -> Outgoing:
        sub = RecordChunk(chunk.offsets[picked], chunk.markers[picked], chunk.lengths[picked],
                          chunk.continues[picked], 0)
        payloads = journal.bodies(sub, skip=HEAD_BYTES)
        return Outgoing(seq, sub.offsets, handles[picked], journal.fields(sub, POSITION_AT, "<u8"), payloads,
                        int(sub.ends(journal.alignment)[-1]))

    def sending(self, batch: list[Outgoing]) -> None:
        """Commit a plan: the results are in delivery until confirmed or dropped."""
        for out in batch:
            self.in_delivery.setdefault(out.seq, set()).update(out.offsets.tolist())
            self.cursors[out.seq] = max(self.cursors.get(out.seq, HEADER_SIZE), out.cursor)

    def confirm(self, batch: list[Outgoing]) -> list[Ticket]:
        """The results reached the consumer: mark them DELIVERED (durable
        when the returned tickets are)."""
        tickets = []
        for out in batch:
            if out.seq in self.segments:
                tickets.append(self.segments[out.seq].set_markers(out.offsets, Marker.DELIVERED))
                self.in_delivery.get(out.seq, set()).difference_update(out.offsets.tolist())
        return tickets

    def drop(self, batch: list[Outgoing]) -> None:
        """The response never left: the results are undelivered again."""
        for out in batch:
            if out.seq in self.segments:
                self.in_delivery.get(out.seq, set()).difference_update(out.offsets.tolist())
                self.cursors[out.seq] = min(self.cursors.get(out.seq, HEADER_SIZE), int(out.offsets.min()))
