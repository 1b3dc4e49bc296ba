"""The work queue's state machine. Single-threaded: the broker's owner
thread makes every call.

Item states and where each lives (no per-item index):

==========  =====================  ==========================================
state       on disk (marker)       in memory
==========  =====================  ==========================================
pending     LIVE                   counted in its segment's job cursor
leased      LIVE                   LeaseTable (holder, deadline); segment.held
delayed     LIVE                   LeaseTable with no holder; segment.held
completing  LIVE or BURIED         ``completing``; segment.held
retired     RETIRED                (nothing; the segment's RETIRED count)
buried      BURIED                 counted per job
==========  =====================  ==========================================

Completion follows the spec's order: the result is appended to the job's
completion log and made durable, then the input's marker is rewritten to
RETIRED in place, then the item is retired in memory. ``complete`` is split
in three so the owner thread never blocks on a flush: ``plan_complete``
(validate, changes nothing), ``start_complete`` (append results, mark
completing) and ``finish_complete`` (once durable: tombstone and retire).
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np

from common.journal import Flusher, Marker, Ticket
from common.journal.filesystem import make_dirs
from common.wire.errors import BadRequest
from workq import protocol as handles
from workq.config import SEGMENT_OVERHEAD, WorkqConfig
from workq.disk.catalog import MAX_SEGMENT, SEGMENT, Catalog, Entry
from workq.disk.completion_log import CompletionLog, Outgoing
from workq.disk.records import HEAD_BYTES, RESULTS_DIR, SEGMENTS_DIR, check_job, job_dir, job_id
from workq.disk.segment import Segment
from workq.errors import DiskFull, PayloadTooLarge, UnknownJob
from workq.protocol import Key

from .lease_table import LeaseTable

DUPLICATE = "duplicate"
COMPLETED = "completed"


@dataclasses.dataclass(slots=True)
class JobCounts:
    """Per-job item counts the broker keeps (results are counted by the CompletionLog)."""

    pending: int = 0  # including items released with a delay
    in_flight: int = 0  # leased or completing
    buried: int = 0
    completing: int = 0  # of in_flight: results written, not yet durable

    @property
    def idle(self) -> bool:
        """Nothing pending, in flight or buried."""
        return not (self.pending or self.in_flight or self.buried)


@dataclasses.dataclass(slots=True)
class Leased:
    """Items one lease took from one segment for one job, as handed out."""

    key: Key
    job: str
    handles: np.ndarray  # packed, uint64
    positions: np.ndarray  # uint64
    deliveries: np.ndarray  # uint32
    payloads: list[memoryview]


@dataclasses.dataclass(slots=True)
class CompletionGroup:
    """Accepted results of one job from one segment."""

    job: int
    segment: Segment
    offsets: np.ndarray
    handles: np.ndarray  # packed, uint64
    positions: np.ndarray
    markers: np.ndarray  # uint32, when planned
    payloads: list[memoryview]


@dataclasses.dataclass(slots=True)
class CompletionPlan:
    statuses: list[str]
    groups: list[CompletionGroup]
    tickets: list[Ticket] = dataclasses.field(default_factory=list)
    error: Exception | None = None  # set by start: only some results were written


class QueueState:
    """Segments, completion logs, leases and counts of one data directory."""

    def __init__(self, root: Path, config: WorkqConfig, flusher: Flusher) -> None:
        self.root = root
        self.config = config.validate()
        self.flusher = flusher
        self.segment_dir = root / SEGMENTS_DIR
        self.results_dir = root / RESULTS_DIR
        self.segments: dict[int, Segment] = {}
        self.keys: dict[Key, list[Segment]] = {}
        self.logs: dict[int, CompletionLog] = {}
        self.counts: dict[int, JobCounts] = {}
        self.next_position: dict[int, int] = {}
        self.leases = LeaseTable()
        self.completing: set[int] = set()
        self.stranded = 0  # completing items a flush error left for recovery to settle
        self.next_segment_id = 1
        self.window_ends = 0.0  # monotonic: recovered segments are not dispatched before it
        self.key_turn = 0
        self.job_turn = 0
        self.item_changes = 0  # bumped whenever items may have become pending
        self.result_changes = 0  # bumped whenever results may have become deliverable
        self._disk_checked = (0.0, True)
        self.catalog: Catalog | None = None  # opened by recovery

    # ------------------------------------------------------------------ jobs

    def job(self, name: str) -> CompletionLog:
        """The job's log; UnknownJob if nothing was ever enqueued for it."""
        log = self.logs.get(job_id(check_job(name)))
        if log is None:
            raise UnknownJob(f"no items were ever enqueued for job {name!r}")
        return log

    def job_name(self, job: int) -> str:
        log = self.logs.get(job)
        return log.name if log is not None else job_dir(job)

    def _job_for_enqueue(self, name: str) -> CompletionLog:
        job = job_id(name)
        log = self.logs.get(job)
        if log is None:
            log = CompletionLog.create(self.results_dir, name, job, self.flusher, self.config.segment_bytes,
                                       self.catalog)
            self.logs[job] = log
            self.counts[job] = JobCounts()
        elif log.name == job_dir(job) and log.name != name:  # recreated without its name (a lost log)
            log.adopt_name(name)
        elif log.name != name:
            raise BadRequest(f"job {name!r} collides with job {log.name!r} (same 64-bit id); rename one")
        return log

    def job_status(self, name: str) -> dict[str, int]:
        log = self.job(name)
        counts = self.counts.setdefault(log.job, JobCounts())
        completed = log.completed - counts.completing  # written, but not complete until durable
        return {"enqueued": counts.pending + counts.in_flight + counts.buried + completed,
                "pending": counts.pending, "in_flight": counts.in_flight, "completed": completed,
                "delivered": log.delivered, "buried": counts.buried}

    # ------------------------------------------------------------- enqueue

    def enqueue(self, name: str, key: Key,
                payloads: list[memoryview] | list[bytes]) -> tuple[np.ndarray, Ticket | None]:
        """Append one job's tasks for one key; they are pending at once and
        durable when the returned ticket is."""
        check_job(name)
        if not payloads:
            return np.zeros(0, dtype=np.uint64), None
        sizes = np.fromiter((len(p) for p in payloads), dtype=np.int64, count=len(payloads))
        limit = self.config.payload_limit
        too_big = np.flatnonzero(sizes > limit)
        if len(too_big):
            raise PayloadTooLarge(f"payload {int(too_big[0])} has {int(sizes[too_big[0]])} bytes; the limit is {limit}")
        need = int(sizes.sum()) + len(payloads) * (HEAD_BYTES + 24)
        if need > self.config.segment_bytes - SEGMENT_OVERHEAD:
            raise BadRequest(f"this enqueue needs {need} bytes, more than one segment holds "
                             f"({self.config.segment_bytes}); split it")
        self._check_disk()
        log = self._job_for_enqueue(name)
        segment = self._active_segment(key, need)
        first = self.next_position.get(log.job, 0)
        offsets, ticket = segment.append(log.job, first, payloads)
        self.next_position[log.job] = first + len(payloads)
        self.counts[log.job].pending += len(payloads)
        self.item_changes += 1
        return handles.pack(segment.id, offsets), ticket

    def _check_disk(self) -> None:
        floor = self.config.disk_floor_bytes
        checked_at, ok = self._disk_checked
        now = time.monotonic()
        if now - checked_at > 0.5 or not ok:
            stat = os.statvfs(self.root)
            free = stat.f_bavail * stat.f_frsize
            ok = free >= floor
            self._disk_checked = (now, ok)
            if not ok:
                raise DiskFull(f"free disk space under {self.root} is {free} bytes, below the floor of {floor}; "
                               f"enqueue refused (the rest is reserved for results)")

    def _active_segment(self, key: Key, need: int) -> Segment:
        segments = self.keys.setdefault(key, [])
        last = segments[-1] if segments else None
        if last is not None and not last.journal.sealed:
            if last.journal.end + need <= self.config.segment_bytes:
                return last
            last.journal.seal()
        make_dirs(self.segment_dir)
        if self.next_segment_id >= MAX_SEGMENT:  # handles hold 32 bits of segment id
            raise DiskFull(f"segment ids are exhausted ({self.next_segment_id}); the queue takes no more items")
        segment = Segment.create(self.segment_dir, self.next_segment_id, key, self.flusher,
                                 self.config.segment_bytes)
        self.next_segment_id += 1
        if self.catalog is not None:  # the file is durable: record it
            self.catalog.add([Entry(SEGMENT, segment.id)])
        self.segments[segment.id] = segment
        segments.append(segment)
        return segment

    # -------------------------------------------------------------- leasing

    def dispatchable(self, segment: Segment, now: float) -> bool:
        return not (segment.recovered and now < self.window_ends)

    # ------------------------------------------------------------ consumers

    def take_results(self, name: str, limit: int, max_bytes: int | None = None) -> tuple[CompletionLog, list[Outgoing]]:
        """Plan and commit a delivery of durable results (payloads plus
        REPLY_ITEM_BYTES each within ``max_bytes``): they are in delivery
        until confirm_results (sent) or drop_results (not sent)."""
        log = self.job(name)
        batch = log.take(max(0, limit), max_bytes, self.completing)
        log.sending(batch)
        return log, batch

    def confirm_results(self, log: CompletionLog, batch: list[Outgoing]) -> list[Ticket]:
        return log.confirm(batch)

    def drop_results(self, log: CompletionLog, batch: list[Outgoing]) -> None:
        log.drop(batch)
        self.result_changes += 1

    # ------------------------------------------------------------- operator

    def kick(self, name: str) -> int:
        """Buried items of the job become pending again, delivery counts reset."""
        log = self.job(name)
        kicked = 0
        for segment in self.segments.values():
            if not segment.buried:
                continue
            for chunk in segment.journal.scan():
                mask = chunk.markers == np.uint32(Marker.BURIED)
                if not mask.any():
                    continue
                jobs = segment.journal.fields(chunk, 0, "<u8")
                offsets = chunk.offsets[mask & (jobs == np.uint64(log.job))]
                offsets = np.array([o for o in offsets.tolist() if o not in segment.held], dtype=np.int64)
                if not len(offsets):
                    continue
                segment.journal.set_markers(offsets, Marker.LIVE, expect=Marker.BURIED)
                segment.give_back(log.job, offsets)
                self.leases.forget(handles.pack(segment.id, offsets).tolist())
                kicked += len(offsets)
        counts = self.counts.setdefault(log.job, JobCounts())
        counts.buried -= kicked
        counts.pending += kicked
        self.item_changes += 1
        return kicked
