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

A job whose log is idle (everything delivered, one segment left, every
tombstone durable) *rests*: its journal is closed and only its counts stay
in memory, so a broker with many finished jobs holds no file per job. The
broker rests a log after ``idle_seal_s`` unused, or after REST_AFTER_S once
its job has nothing pending, in flight or buried. The next result for it
reopens the segment (a sealed one read-only in O(1), and a new one starts).

Threads: touched only under the broker's owner lock (workq/loop.py).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import msgpack
import numpy as np

from common.journal import Flusher, Journal, JournalConfig, Marker, Ticket
from common.journal.filesystem import make_dirs
from common.journal.header import HEADER_SIZE
from common.journal.record import SMALL_BATCH, Prefix
from common.journal.scan import RecordChunk
from workq.config import SEGMENT_OVERHEAD

from . import picks
from .catalog import RESULTS, Catalog, Entry
from .records import (
    HANDLE_AT,
    HEAD_BYTES,
    LEDGER,
    POSITION_AT,
    RESULTS_KIND,
    RESULTS_SUFFIX,
    as_ints,
    heads,
    heads_few,
    job_dir,
    log_file,
)
from .segment import scan_window

SUFFIX: Final = RESULTS_SUFFIX


@dataclasses.dataclass(slots=True)
class Ledger:
    """Running totals of collected segments (segments are collected oldest
    first, so one number says which are gone)."""

    collected_below: int = 0  # every segment with a smaller seq was collected
    results: int = 0  # results those segments held (all delivered)
    max_position: int = -1

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, collected_below: int = 0, results: int = 0, max_position: int = -1) -> None:
        self.collected_below = collected_below
        self.results = results
        self.max_position = max_position


@dataclasses.dataclass(slots=True)
class Rested:
    """A resting log's one segment, closed: where it is and what it held."""

    seq: int
    path: Path
    results: int  # results in it (all delivered)
    sealed: bool

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, seq: int, path: Path, results: int, sealed: bool) -> None:
        self.seq = seq
        self.path = path
        self.results = results
        self.sealed = sealed


class ResultsWritten:
    """What CompletionLog.append wrote: the first ``written`` results (all, unless ``error``).
    A plain class, not a NamedTuple: a NamedTuple's constructor is exec'd Python code, run
    interpreted in the compiled build (shardmgr/build.py) on every complete."""

    def __init__(self, tickets: list[Ticket], written: int, error: Exception | None) -> None:
        self.tickets = tickets
        self.written = written
        self.error = error


def _span(sizes: list[int] | np.ndarray, start: int, free: int, room: int) -> tuple[int, int]:
    """The next batch of results from ``start``: (its stop, its bytes). As
    many as fit in the active segment's ``free`` bytes; if none does, as
    many as fit an empty segment's ``room`` (at least one: a new segment)."""
    if isinstance(sizes, list):
        fits = _prefix_fits(sizes, start, free) or max(1, _prefix_fits(sizes, start, room))
        return start + fits, sum(sizes[start:start + fits])
    total = np.cumsum(sizes[start:])
    fits = int(np.searchsorted(total, free, side="right"))
    fits = fits or max(1, int(np.searchsorted(total, room, side="right")))
    return start + fits, int(total[fits - 1])


def _prefix_fits(sizes: list[int], start: int, limit: int) -> int:
    """How many of ``sizes`` from ``start`` fit in ``limit`` taken in order
    (np.searchsorted(np.cumsum(...), limit, side="right"), in plain ints)."""
    total = fits = 0
    for size in sizes[start:]:
        total += size
        if total > limit:
            break
        fits += 1
    return fits


@dataclasses.dataclass(slots=True)
class Outgoing:
    """Results planned for one consumer response (not yet confirmed sent)."""

    seq: int
    offsets: np.ndarray
    handles: np.ndarray
    positions: np.ndarray
    payloads: list[memoryview]
    cursor: int  # the segment's delivery cursor once these are sent

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, seq: int, offsets: np.ndarray, handles: np.ndarray, positions: np.ndarray,
                 payloads: list[memoryview], cursor: int) -> None:
        self.seq = seq
        self.offsets = offsets
        self.handles = handles
        self.positions = positions
        self.payloads = payloads
        self.cursor = cursor


class CompletionLog:
    """One job's completion log segments and delivery state."""

    def __init__(self, directory: Path, name: str, job: int, flusher: Flusher, segment_bytes: int,
                 catalog: Catalog | None = None) -> None:
        self.directory = directory
        self.catalog = catalog  # new segments are recorded in it (None: tests of the log alone)
        self.name = name
        self.job = job
        self._flusher = flusher
        self._segment_bytes = segment_bytes
        self.segments: dict[int, Journal] = {}  # seq -> journal
        self.ledger = Ledger()
        self.ledger_entries: dict[int, int] = {}  # seq -> ledger records in that segment
        self.max_position = -1
        self.cursors: dict[int, int] = {}  # seq -> no undelivered result outside delivery lies before it
        self.last_append = time.monotonic()  # for idle sealing
        self.last_used = self.last_append  # any append or delivery, for resting
        self.in_delivery: dict[int, set[int]] = {}  # seq -> offsets sent, not yet confirmed
        # input tombstones of results here, maybe not durable yet: the newest ticket per input journal
        # (by id: the ticket keeps its journal alive), since a journal's later write is durable only
        # once its earlier ones are
        self.tombstones: dict[int, Ticket] = {}
        self.rested: Rested | None = None

    # ----------------------------------------------------------- lifecycle

    @classmethod
    def create(cls, root: Path, name: str, job: int, flusher: Flusher, segment_bytes: int,
               catalog: Catalog | None = None) -> CompletionLog:
        directory = root / job_dir(job)
        make_dirs(directory)
        log = cls(directory, name, job, flusher, segment_bytes, catalog)
        log._new_segment(catalog.next_seq(job) if catalog is not None else 0)  # a lost log's numbers stay unused
        return log

    def _new_segment(self, seq: int) -> Journal:
        meta = msgpack.packb({"job": self.name, "job_id": self.job, "seq": seq})
        journal = Journal.create(self.directory / log_file(seq), kind=RESULTS_KIND, flusher=self._flusher,
                                 metadata=meta, config=JournalConfig(capacity_bytes=self._segment_bytes))
        if self.catalog is not None:  # the file is durable: record it
            self.catalog.add([Entry(RESULTS, self.job, seq)])
        self.segments[seq] = journal
        return journal

    @property
    def active(self) -> Journal:
        return self.segments[max(self.segments)]

    # ---------------------------------------------------------------- counts

    @property
    def completed(self) -> int:
        """Results ever recorded (live segments plus the ledger)."""
        return self._rested_results + sum(j.count - self.ledger_entries.get(s, 0) for s, j in self._uncollected())

    @property
    def delivered(self) -> int:
        return self._rested_results + sum(j.count_of(Marker.DELIVERED) - self.ledger_entries.get(s, 0)
                                          for s, j in self._uncollected())

    @property
    def _rested_results(self) -> int:
        return self.ledger.results + (self.rested.results if self.rested is not None else 0)

    def _uncollected(self) -> list[tuple[int, Journal]]:
        return [(s, j) for s, j in self.segments.items() if s >= self.ledger.collected_below]

    @property
    def undelivered(self) -> int:
        return sum(j.count_of(Marker.LIVE) for j in self.segments.values())

    # ---------------------------------------------------------------- writes

    def append(self, handles: list[int] | np.ndarray, positions: list[int] | np.ndarray,
               payloads: Sequence[bytes | memoryview]) -> ResultsWritten:
        """Record results, as one batch per segment they fill (each result
        must fit an empty segment). If a write fails, the results before
        it stay written: ``written`` says how many, ``error`` why.

        Up to SMALL_BATCH results are sized and headed with plain ints (one
        result per call is common; numpy's per-call cost would dominate);
        the batches, bytes and errors are the same either way."""
        room = self._segment_bytes - SEGMENT_OVERHEAD
        few = len(payloads) <= SMALL_BATCH
        sizes: list[int] | np.ndarray
        if few:
            sizes = [len(p) + HEAD_BYTES + 64 for p in payloads]
            firsts, seconds = as_ints(handles), as_ints(positions)
        else:
            sizes = np.fromiter((len(p) for p in payloads), dtype=np.int64, count=len(payloads)) + HEAD_BYTES + 64
            first_column, second_column = np.asarray(handles, dtype=np.uint64), np.asarray(positions, dtype=np.uint64)
        tickets: list[Ticket] = []
        start = 0
        while start < len(payloads):
            stop, size = _span(sizes, start, self._room(room), room)
            try:
                journal = self._writable(size)
                head: Prefix
                if few:
                    top = max(seconds[start:stop])
                    head = heads_few(firsts[start:stop], seconds[start:stop], time.time_ns())
                else:
                    top = int(second_column[start:stop].max())
                    head = heads(first_column[start:stop], second_column[start:stop], time.time_ns(), stop - start)
                tickets.append(journal.append_batch(payloads[start:stop], prefix=head).ticket)
            except Exception as exc:  # I/O error, full disk: keep what is written
                return ResultsWritten(tickets, start, exc)
            self.max_position = max(self.max_position, top)
            start = stop
        return ResultsWritten(tickets, start, None)

    def _room(self, room: int) -> int:
        """Bytes of results the active segment still takes."""
        if not self.segments or self.active.sealed:
            return room
        return room - (self.active.end - HEADER_SIZE)

    def _writable(self, size: int) -> Journal:
        """The active segment, or a new one if it is sealed or too full."""
        self.wake()
        journal = self.active
        if journal.sealed or journal.failed or (journal.end + size > self._segment_bytes and journal.count):
            if not (journal.sealed or journal.failed):  # a failed journal takes no more writes, not even a seal
                journal.seal()
            journal = self._new_segment(self._next_seq())
        self.last_append = self.last_used = time.monotonic()
        return journal

    def _next_seq(self) -> int:
        """The next segment's number: above every one this job ever had."""
        seq = max(self.segments) + 1
        return seq if self.catalog is None else max(seq, self.catalog.next_seq(self.job))

    def adopt_name(self, name: str) -> None:
        """A log recreated under its id (its files were lost) takes its job's
        name back, on disk too: a new segment whose metadata carries it."""
        self.name = name
        self.wake()
        journal = self.active
        if not (journal.sealed or journal.failed):
            journal.seal()
        self._new_segment(self._next_seq())

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
        if len(self.segments) < 2:
            return None
        seq = min(self.segments)
        journal = self.segments[seq]
        if (seq != max(self.segments) and journal.sealed and journal.count_of(Marker.LIVE) == 0
                and not self.in_delivery.get(seq) and self.tombstones_durable()):
            return seq
        return None

    def tombstoned(self, ticket: Ticket) -> None:
        """An input of a result here was tombstoned: the log keeps its
        segments until that ticket is durable (see tombstones_durable)."""
        held = self.tombstones.get(id(ticket.journal))
        if held is None or ticket.seq > held.seq:
            self.tombstones[id(ticket.journal)] = ticket

    def tombstones_durable(self) -> bool:
        """Are the input tombstones of every result finished here durable?
        Until they are, no segment may go: after a power cut an input
        whose tombstone was lost must still find its result. One check
        per input journal, however many results."""
        for key, ticket in list(self.tombstones.items()):
            if ticket.durable:
                del self.tombstones[key]
        return not self.tombstones

    def forget_segment(self, seq: int) -> Journal:
        """Drop a collected segment from memory; the caller deletes the file."""
        self.in_delivery.pop(seq, None)
        self.cursors.pop(seq, None)
        self.ledger_entries.pop(seq, None)
        return self.segments.pop(seq)

    # ---------------------------------------------------------------- resting

    def restable(self, now: float, idle_s: float) -> bool:
        """Unused for ``idle_s``, one segment, every result delivered and
        every tombstone durable: nothing the log must do until a new result."""
        if self.rested is not None or len(self.segments) != 1 or now - self.last_used < idle_s:
            return False
        return (self.active.count_of(Marker.LIVE) == 0 and not any(self.in_delivery.values())
                and self.tombstones_durable())

    def rest(self) -> None:
        """Close the one segment (flushing it), keeping its counts (see restable)."""
        [(seq, journal)] = self.segments.items()
        self.rested = Rested(seq, journal.path, journal.count - self.ledger_entries.get(seq, 0), journal.sealed)
        self.segments.clear()
        self.cursors.clear()
        self.in_delivery.clear()
        journal.close()

    def wake(self) -> None:
        """Reopen a resting log's segment: read-only in O(1) if sealed (the
        next result starts a new one), else writable."""
        rested, self.rested = self.rested, None
        if rested is None:
            return
        if rested.sealed:
            journal = Journal.open(rested.path, kind=RESULTS_KIND, writable=False, recount=False)
        else:
            journal = Journal.open(rested.path, kind=RESULTS_KIND, flusher=self._flusher,
                                   config=JournalConfig(capacity_bytes=self._segment_bytes))
        self.segments[rested.seq] = journal

    # -------------------------------------------------------------- delivery

    def take(self, limit: int, max_bytes: int | None = None, completing: set[int] | frozenset[int] = frozenset()
             ) -> list[Outgoing]:
        """Plan: up to ``limit`` undelivered results in log order, their
        payloads plus REPLY_ITEM_BYTES each within ``max_bytes`` (at least
        one is taken). Stops before the first result whose item is in
        ``completing``: such a result may not be durable yet."""
        out: list[Outgoing] = []
        got = 0
        budget = max_bytes if max_bytes is not None else 1 << 62
        for seq in sorted(self.segments):
            journal = self.segments[seq]
            skip = self.in_delivery.get(seq, set())
            if journal.count_of(Marker.LIVE) <= len(skip):
                continue
            cursor = self.cursors.get(seq, HEADER_SIZE)  # a record start this log's own scan found
            for chunk in journal.scan(start=cursor, window=scan_window(journal, limit), proven=True):
                handles = journal.fields(chunk, HANDLE_AT, "<u8")
                picked, cost, halt = picks.results(chunk, handles, skip, completing, limit - got, budget, not got)
                if len(picked):
                    out.append(self._outgoing(seq, journal, chunk, picked, handles))
                    budget -= cost
                    got += len(picked)
                if halt or got >= limit:
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
        self.last_used = time.monotonic()
        for out in batch:
            self.in_delivery.setdefault(out.seq, set()).update(out.offsets.tolist())
            self.cursors[out.seq] = max(self.cursors.get(out.seq, HEADER_SIZE), out.cursor)

    def confirm(self, batch: list[Outgoing]) -> list[Ticket]:
        """The results reached the consumer: mark them DELIVERED (durable
        when the returned tickets are)."""
        tickets = []
        for out in batch:
            if out.seq in self.segments:
                # offsets this log's own scan found (take): no chain proof again
                tickets.append(self.segments[out.seq].set_markers(out.offsets, Marker.DELIVERED, proven=True))
                self.in_delivery.get(out.seq, set()).difference_update(out.offsets.tolist())
        return tickets

    def drop(self, batch: list[Outgoing]) -> None:
        """The response never left: the results are undelivered again."""
        for out in batch:
            if out.seq in self.segments:
                self.in_delivery.get(out.seq, set()).difference_update(out.offsets.tolist())
                self.cursors[out.seq] = min(self.cursors.get(out.seq, HEADER_SIZE), int(out.offsets.min()))
