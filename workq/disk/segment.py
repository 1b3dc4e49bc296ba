"""An input segment: one key's journal and the broker's positions in it.

The broker keeps no per-item index. Per segment it keeps, in memory:

* per job, a cursor (no pending item of that job lies before it) and the
  number of that job's pending items in the segment;
* ``held``: offsets that must not be dispatched now (leased, completing, or
  released with a delay), at most the items in flight. Every held offset is
  a proven record start (it came from a dispatch scan, or was proven when a
  worker reported it or a result named it), so operations on held items
  skip the journal's record-chain proof: that is the per-request fast path;
* byte and record counts for the operator view.

Dispatch walks a job's records from its cursor with the vectorised journal
scan and takes the first pending ones; giving an item back moves that job's
cursor back to it (only this segment, only this job).

Threads: touched only under the broker's owner lock (workq/loop.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import msgpack
import numpy as np

from common.journal import Flusher, Journal, JournalConfig, Marker, Ticket
from common.journal.header import HEADER_SIZE
from common.journal.record import RECORD_HEADER_SIZE, SMALL_BATCH, Prefix, align_up
from common.journal.scan import RecordChunk
from workq.config import REPLY_ITEM_BYTES
from workq.protocol import Key

from . import picks
from .records import (
    HEAD,
    HEAD_BYTES,
    JOB_AT,
    POSITION_AT,
    SEGMENT_KIND,
    SEGMENT_SUFFIX,
    TIME_AT,
    as_ints,
    heads,
    heads_few,
    segment_file,
)

SUFFIX: Final = SEGMENT_SUFFIX
RETIRED: Final = np.uint32(Marker.RETIRED)


def scan_window(journal: Journal, records: int) -> int:
    """Bytes to scan per step to find about ``records`` records (twice the
    average record size each, at least 64 KiB): small steps for small takes."""
    average = (journal.end - HEADER_SIZE) // max(1, journal.count)
    return max(64 * 1024, 2 * records * average)


def _parts(records: int, limit: int) -> list[tuple[int, int]]:
    """How a dispatch of ``limit`` items looks at a chunk of ``records``:
    a small take first at the chunk's first SMALL_BATCH records (plain ints,
    and usually enough), then at the rest in one vectorised step."""
    if limit > SMALL_BATCH or records <= SMALL_BATCH:
        return [(0, records)]
    return [(0, SMALL_BATCH), (SMALL_BATCH, records)]


@dataclasses.dataclass(slots=True)
class JobCursor:
    """Where a job's pending items in one segment start, and how many.

    ``ahead`` keeps the records of the last dispatch scan from the cursor
    on (their markers as of that scan): the next dispatch starts from them
    instead of scanning the same bytes again, so taking one item at a time
    costs one scan per window, not one per call. It starts exactly at the
    cursor; it is dropped whenever the cursor moves back."""

    cursor: int
    pending: int = 0
    ahead: RecordChunk | None = None

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, cursor: int, pending: int = 0, ahead: RecordChunk | None = None) -> None:
        self.cursor = cursor
        self.pending = pending
        self.ahead = ahead

    def rewind(self, first: int) -> None:
        """No pending item lies before ``first`` any more than before it: move back if need be."""
        if first < self.cursor:
            self.cursor, self.ahead = first, None


@dataclasses.dataclass(slots=True)
class Taken:
    """Items a dispatch took from one segment for one job (not yet committed)."""

    segment: Segment
    job: int
    offsets: list[int]  # plain ints whatever the size (a one-item lease builds no array; the lease table wants ints)
    positions: list[int]
    payloads: list[memoryview]
    cursor: int  # the job's cursor once these are committed
    cost: int  # response bytes: payloads plus REPLY_ITEM_BYTES each
    rest: RecordChunk | None  # the scanned records from ``cursor`` on: the job's next lookahead

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, segment: Segment, job: int, offsets: list[int], positions: list[int],
                 payloads: list[memoryview], cursor: int, cost: int, rest: RecordChunk | None) -> None:
        self.segment = segment
        self.job = job
        self.offsets = offsets
        self.positions = positions
        self.payloads = payloads
        self.cursor = cursor
        self.cost = cost
        self.rest = rest


class Segment:
    """One ``WQSG`` journal plus its in-memory positions."""

    def __init__(self, journal: Journal, segment_id: int, key: Key, *, recovered: bool) -> None:
        self.journal = journal
        self.id = segment_id
        self.key = key
        self.recovered = recovered  # existed before this broker started
        self.jobs: dict[int, JobCursor] = {}
        self.held: set[int] = set()
        self.dead_bytes = 0
        self.last_append = time.monotonic()

    # ---------------------------------------------------------------- creation

    @classmethod
    def create(cls, directory: Path, segment_id: int, key: Key, flusher: Flusher, capacity: int) -> Segment:
        meta = msgpack.packb({"segment": segment_id, "model": key.model, "shape": key.shape, "lane": key.lane})
        journal = Journal.create(directory / segment_file(segment_id), kind=SEGMENT_KIND, flusher=flusher,
                                 metadata=meta, config=JournalConfig(capacity_bytes=capacity))
        return cls(journal, segment_id, key, recovered=False)

    @staticmethod
    def describe(journal: Journal) -> tuple[int, Key]:
        """(segment id, key) from a segment journal's metadata."""
        meta = msgpack.unpackb(journal.metadata)
        return int(meta["segment"]), Key(meta["model"], meta["shape"], meta["lane"])

    # ---------------------------------------------------------------- counts

    @property
    def records(self) -> int:
        return self.journal.count

    @property
    def retired(self) -> int:
        return self.journal.count_of(Marker.RETIRED)

    @property
    def buried(self) -> int:
        return self.journal.count_of(Marker.BURIED)

    @property
    def pending(self) -> int:
        return sum(j.pending for j in self.jobs.values())

    @property
    def finished(self) -> bool:
        """Sealed and every item retired: the collector may delete it."""
        return self.journal.sealed and self.retired == self.records

    # ---------------------------------------------------------------- writes

    def append(self, job: int, first_position: int,
               payloads: Sequence[bytes | memoryview]) -> tuple[np.ndarray, Ticket]:
        """Append one job's tasks as one batch; returns their offsets and the
        ticket that says when they are durable (the caller counts them
        pending: workq.state.items)."""
        n = len(payloads)
        head: Prefix
        if n <= SMALL_BATCH:  # a one-item enqueue: struct calls, not a dozen numpy ones
            head = heads_few([job] * n, range(first_position, first_position + n), time.time_ns())
        else:
            head = heads(job, first_position + np.arange(n, dtype=np.uint64), time.time_ns(), n)
        offsets, ticket = self.journal.append_batch(payloads, prefix=head)
        self.last_append = time.monotonic()
        return offsets, ticket

    # -------------------------------------------------------------- dispatch

    def take(self, job: int, limit: int, max_bytes: int | None = None, first: bool = False) -> Taken | None:
        """Plan: the first ``limit`` pending items of ``job`` whose payloads
        (plus REPLY_ITEM_BYTES each) fit in ``max_bytes`` (at least one
        with ``first``); reads their payloads."""
        mine = self.jobs.get(job)
        if mine is None or mine.pending <= 0 or limit <= 0:
            return None
        budget = max_bytes if max_bytes is not None else 1 << 62
        if limit == 1:
            taken = self._take_at_cursor(job, mine, budget, first)
            if taken is not None:
                return taken
        pieces: list[tuple[RecordChunk, np.ndarray]] = []
        got, cost = 0, 0
        for chunk in self._from_cursor(mine, limit):
            for lo, hi in _parts(len(chunk), limit):
                part = self.journal.refreshed(chunk[lo:hi])  # a lookahead's markers may have changed
                jobs = self.journal.fields(part, JOB_AT, "<u8")
                picked, part_cost, cut = picks.items(part, jobs, job, self.held, limit - got, budget - cost,
                                                     first and not got)
                if len(picked):
                    pieces.append((part, picked))
                    got, cost = got + len(picked), cost + part_cost
                if cut is not None:
                    if not pieces:
                        return None  # the first item does not fit: nothing taken, nothing moves
                    cut += lo
                    if cut == len(chunk):
                        return self._taken(job, pieces, int(chunk.ends(self.journal.alignment)[-1]), cost, None)
                    return self._taken(job, pieces, int(chunk.offsets[cut]), cost, chunk[cut:])
        if not pieces:
            mine.cursor, mine.pending, mine.ahead = self.journal.end, 0, None  # nothing pending after all: repair
            return None
        return self._taken(job, pieces, self.journal.end, cost, None)

    def _take_at_cursor(self, job: int, mine: JobCursor, budget: int, first: bool) -> Taken | None:
        """The one-item take when the record at the cursor is the item (a live
        record of ``job``, not held, within ``budget`` or ``first``): read
        in place with plain ints, no scan and no arrays but the Taken's own.
        None otherwise: the general take then finds the item (or none)."""
        if mine.cursor in self.held:
            return None
        body = self.journal.record_at(mine.cursor, Marker.LIVE)
        if body is None:
            return None
        owner, position, _ = HEAD.unpack_from(body)
        cost = len(body) - HEAD_BYTES + REPLY_ITEM_BYTES
        if owner != job or (cost > budget and not first):
            return None
        # the next record's start: this one's end (the lookahead, if any, would start here; dropped)
        after = mine.cursor + align_up(RECORD_HEADER_SIZE + len(body), self.journal.alignment)
        return Taken(self, job, [mine.cursor], [position], [body[HEAD_BYTES:]], after, cost, None)

    def _from_cursor(self, mine: JobCursor, limit: int) -> Iterator[RecordChunk]:
        """The records from the job's cursor on: the lookahead first (its
        markers as of its scan), then a scan from where it ends."""
        start = mine.cursor
        if mine.ahead is not None and len(mine.ahead) and int(mine.ahead.offsets[0]) == start:
            yield mine.ahead
            start = int(mine.ahead.ends(self.journal.alignment)[-1])
        # cursors are record starts found by scans or appends, or held items (see ``held``)
        yield from self.journal.scan(start=start, window=scan_window(self.journal, limit), proven=True)

    def _taken(self, job: int, pieces: list[tuple[RecordChunk, np.ndarray]], cursor: int, cost: int,
               rest: RecordChunk | None) -> Taken:
        offsets: list[int] = []
        positions: list[int] = []
        payloads: list[memoryview] = []
        for chunk, picked in pieces:
            sub = RecordChunk(chunk.offsets[picked], chunk.markers[picked], chunk.lengths[picked],
                              chunk.continues[picked], 0)
            offsets += sub.offsets.tolist()
            positions += self.journal.fields(sub, POSITION_AT, "<u8").tolist()
            payloads += self.journal.bodies(sub, skip=HEAD_BYTES)
        return Taken(self, job, offsets, positions, payloads, cursor, cost, rest)

    def commit_take(self, taken: Taken) -> None:
        """Commit: the taken items are held (in flight); the cursor moves on."""
        mine = self.jobs[taken.job]
        mine.cursor, mine.ahead = taken.cursor, taken.rest
        mine.pending -= len(taken.offsets)
        self.hold(taken.offsets)

    def hold(self, offsets: list[int] | np.ndarray) -> None:
        self.held.update(as_ints(offsets))

    def unhold(self, offsets: list[int] | np.ndarray) -> None:
        self.held.difference_update(as_ints(offsets))

    def give_back(self, job: int, offsets: np.ndarray) -> None:
        """Held items become pending again: rewind this job's cursor to them."""
        self.unhold(offsets)
        self.add_pending(job, int(offsets.min()), len(offsets))

    def add_pending(self, job: int, first: int, n: int) -> None:
        """``n`` more pending items of ``job``, none before offset ``first``
        that was not pending already: the cursor moves back to it if need be."""
        cursor = self.jobs.get(job)
        if cursor is None:
            self.jobs[job] = JobCursor(first, n)
        else:
            cursor.rewind(first)
            cursor.pending += n

    def drop_pending(self, job: int, n: int) -> None:
        """``n`` pending items of ``job`` left the pending state elsewhere
        than through a dispatch (adopted, buried, completed)."""
        cursor = self.jobs.get(job)
        if cursor is not None:
            cursor.pending -= n

    # ------------------------------------------------------------- inspection

    def holds_all(self, offsets: list[int] | np.ndarray) -> bool:
        """Are all of ``offsets`` held (so proven record starts: see ``held``)?"""
        held = self.held
        return all(offset in held for offset in as_ints(offsets))

    def heads_of(self, offsets: np.ndarray, *, proven: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(job ids, positions, current markers) of item offsets, proven
        record starts (RecordNotFound otherwise); ``proven``: the caller
        knows they are (held items: see ``held``), and the chain proof is skipped."""
        if proven and len(offsets) <= SMALL_BATCH:  # the held item of a one-item completion: plain reads
            jobs, positions, words = self._read_heads(offsets.tolist())
            return np.array(jobs, "<u8"), np.array(positions, "<u8"), np.array(words, np.uint32)
        markers = self.journal.markers(offsets, proven=proven)
        chunk = RecordChunk(offsets, markers, np.full(len(offsets), HEAD_BYTES, dtype=np.int64),
                            np.zeros(len(offsets), dtype=bool), 0)
        return self.journal.fields(chunk, JOB_AT, "<u8"), self.journal.fields(chunk, POSITION_AT, "<u8"), markers

    def heads_listed(self, offsets: list[int]) -> tuple[list[int], list[int], list[int]]:
        """:meth:`heads_of` as plain ints, proven by ``held`` where it can be
        (a few held items, a one-item completion's: read without arrays)."""
        proven = self.holds_all(offsets)
        if proven and len(offsets) <= SMALL_BATCH:
            return self._read_heads(offsets)
        jobs, positions, markers = self.heads_of(np.array(offsets, dtype=np.int64), proven=proven)
        return jobs.tolist(), positions.tolist(), markers.tolist()

    def _read_heads(self, offsets: list[int]) -> tuple[list[int], list[int], list[int]]:
        """(job ids, positions, markers) of proven record starts, one plain read each."""
        read = [self.journal.head_at(offset, HEAD_BYTES) for offset in offsets]
        items = [HEAD.unpack(head) for _, head in read]
        return [job for job, _, _ in items], [at for _, at, _ in items], [marker for marker, _ in read]

    def oldest_unfinished(self) -> tuple[int, int, int, int] | None:
        """(offset, job, enqueued_ns, marker) of the first item not retired, if any."""
        for chunk in self.journal.scan():
            alive = np.flatnonzero(chunk.markers != RETIRED)
            if len(alive):
                first = chunk[int(alive[0]):int(alive[0]) + 1]
                return (int(first.offsets[0]), int(self.journal.fields(first, JOB_AT, "<u8")[0]),
                        int(self.journal.fields(first, TIME_AT, "<u8")[0]), int(first.markers[0]))
        return None
