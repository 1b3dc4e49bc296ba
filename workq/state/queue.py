"""The queue of one data directory, in memory: its files and its jobs.

:class:`QueueState` holds the input segments (by id and by key), each job's
completion log, the next position per job, and :class:`~.items.Items`, which
owns every item's state and count. Operations that span modules live beside
it: leasing.py (dispatch, touch, release, worker reports), completion.py
(result durable, then tombstone, then retire), recovery.py (start-up from
the markers), collector.py (deleting finished files), stats.py.

Threads: one call at a time, under the broker's owner lock (workq/loop.py).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Final

import numpy as np

from common.journal import Flusher, Journal, Marker, Ticket
from common.journal.filesystem import NO_SPACE, make_dirs
from common.journal.full_disk import FullDisk
from common.wire.errors import BadRequest
from workq.config import SEGMENT_OVERHEAD, WorkqConfig
from workq.disk.catalog import MAX_SEGMENT, SEGMENT, Catalog, Entry
from workq.disk.completion_log import CompletionLog, Outgoing
from workq.disk.records import HEAD_BYTES, RESULTS_DIR, SEGMENTS_DIR, check_job, job_dir, job_id
from workq.disk.segment import Segment
from workq.errors import DiskFull, PayloadTooLarge
from workq.protocol import Key, pack

from .items import Items

_log = logging.getLogger(__name__)

BURIED: Final = np.uint32(Marker.BURIED)
#: Seconds a finished job's log (nothing pending, in flight or buried, all
#: delivered) stays open before it rests (completion_log.py).
REST_AFTER_S = 1.0
#: What job_status counts, in order.
JOB_COUNTS: Final = ("enqueued", "pending", "in_flight", "completed", "delivered", "buried")


class QueueState:
    """Segments, completion logs and items of one data directory."""

    def __init__(self, root: Path, config: WorkqConfig, flusher: Flusher) -> None:
        self.root = root
        self.config = config.validate()
        self.flusher = flusher
        self.segment_dir = root / SEGMENTS_DIR
        self.results_dir = root / RESULTS_DIR
        self.segments: dict[int, Segment] = {}
        self.keys: dict[Key, list[Segment]] = {}
        self.logs: dict[int, CompletionLog] = {}
        self.items = Items(self.config)
        self.next_position: dict[int, int] = {}
        self.next_segment_id = 1
        self.window_ends = 0.0  # monotonic: recovered segments are not dispatched before it
        self.key_turn = 0
        self.job_turn = 0
        self._disk_checked = (0.0, True)
        #: enqueues refused for a full disk: counted in stats, logged once per episode
        self.full_disk = FullDisk(f"work queue {root}", _log)
        self.catalog: Catalog | None = None  # opened by recovery; an audit record of files (catalog.py)

    # ------------------------------------------------------------------ jobs

    def find_job(self, name: str) -> CompletionLog | None:
        """The job's log, or None if nothing was ever enqueued for it (a
        lookup: it creates nothing, in memory or on disk). ValueError for a
        malformed name, BadRequest for one whose id another job's name has."""
        job = job_id(check_job(name))
        log = self.logs.get(job)
        if log is not None and log.name != name and log.name != job_dir(job):
            raise BadRequest(f"job {name!r} collides with job {log.name!r} (same 64-bit id); rename one")
        return log

    def job_name(self, job: int) -> str:
        log = self.logs.get(job)
        return log.name if log is not None else job_dir(job)

    def add_log(self, log: CompletionLog) -> None:
        """A job's completion log, created or found at start-up."""
        self.logs[log.job] = log
        self.items.counts(log.job)

    def _job_for_enqueue(self, name: str) -> CompletionLog:
        job = job_id(name)
        log = self.logs.get(job)
        if log is None:
            log = CompletionLog.create(self.results_dir, name, job, self.flusher, self.config.segment_bytes,
                                       self.catalog)
            self.add_log(log)
        elif log.name == job_dir(job) and log.name != name:  # recreated without its name (a lost log)
            log.adopt_name(name)
        elif log.name != name:
            raise BadRequest(f"job {name!r} collides with job {log.name!r} (same 64-bit id); rename one")
        return log

    def job_status(self, name: str) -> dict[str, int]:
        """Counts: enqueued, pending, in_flight, completed, delivered, buried
        (all 0 for a job nothing was enqueued for)."""
        log = self.find_job(name)
        return self.items.status(log) if log is not None else dict.fromkeys(JOB_COUNTS, 0)

    # ------------------------------------------------------------- enqueue

    def enqueue(self, name: str, key: Key,
                payloads: Sequence[bytes | memoryview]) -> tuple[np.ndarray, Ticket | None]:
        """Append one job's tasks for one key; they are pending at once and
        durable when the returned ticket is."""
        if not payloads:
            check_job(name)
            return np.zeros(0, dtype=np.uint64), None
        need = self.check_enqueue(name, payloads)
        self._check_disk(need)
        try:
            log = self._job_for_enqueue(name)
            segment = self._active_segment(key, need)
            first = self.next_position.get(log.job, 0)
            offsets, ticket = segment.append(log.job, first, payloads)
        except OSError as exc:  # the journal's WriteFailed too; it wrote nothing
            if exc.errno in NO_SPACE:
                self.full_disk.refused_write(exc, self.root, need)
                raise DiskFull(f"the disk under {self.root} is full: {exc}; enqueue refused, nothing written") from exc
            raise
        self.full_disk.wrote()
        self.next_position[log.job] = first + len(payloads)
        self.items.enqueued(segment, log.job, offsets)
        return pack(segment.id, offsets), ticket

    def check_enqueue(self, name: str, payloads: Sequence[bytes | memoryview]) -> int:
        """The bytes an enqueue of ``payloads`` takes in a segment; the error
        :meth:`enqueue` would raise for them (bad job name, a payload over
        the limit, more than a segment holds). Changes nothing."""
        check_job(name)
        limit = self.config.payload_limit
        total = 0
        for index, payload in enumerate(payloads):
            size = len(payload)
            if size > limit:
                raise PayloadTooLarge(f"payload {index} has {size} bytes; the limit is {limit}")
            total += size
        need = total + len(payloads) * (HEAD_BYTES + 24)
        if need > self.config.segment_bytes - SEGMENT_OVERHEAD:
            raise BadRequest(f"this enqueue needs {need} bytes, more than one segment holds "
                             f"({self.config.segment_bytes}); split it")
        return need

    def _check_disk(self, need: int) -> None:
        floor = self.config.disk_floor_bytes
        checked_at, ok = self._disk_checked
        now = time.monotonic()
        if now - checked_at > 0.5 or not ok:
            stat = os.statvfs(self.root)
            free = stat.f_bavail * stat.f_frsize
            ok = free >= floor
            self._disk_checked = (now, ok)
            if not ok:
                self.full_disk.refused(self.root, need, free, f"free space below the floor of {floor} bytes kept "
                                                              f"for results (disk_floor_bytes)")
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
        self.add_segment(segment)
        return segment

    def add_segment(self, segment: Segment) -> None:
        """An input segment, created or found at start-up (keys stay in id order)."""
        self.segments[segment.id] = segment
        self.keys.setdefault(segment.key, []).append(segment)
        self.next_segment_id = max(self.next_segment_id, segment.id + 1)

    def remove_segment(self, segment: Segment) -> None:
        """Forget a segment the collector deletes."""
        del self.segments[segment.id]
        self.keys[segment.key].remove(segment)
        if not self.keys[segment.key]:
            del self.keys[segment.key]

    # -------------------------------------------------------------- leasing

    def dispatchable(self, segment: Segment, now: float) -> bool:
        """False for segments recovered at start-up, during the reconnect window."""
        return not (segment.recovered and now < self.window_ends)

    def end_window(self, now: float) -> bool:
        """Close the reconnect window once it is over; True if it just closed."""
        if self.window_ends and now >= self.window_ends:
            self.window_ends = 0.0
            self.items.changed(items=True)
            return True
        return False

    # ------------------------------------------------------------ consumers

    def take_results(self, name: str, limit: int,
                     max_bytes: int | None = None) -> tuple[CompletionLog | None, list[Outgoing]]:
        """Plan and commit a delivery of durable results (payloads plus
        REPLY_ITEM_BYTES each within ``max_bytes``): they are in delivery
        until confirm_results (sent) or drop_results (not sent). A job
        nothing was enqueued for has none: (None, [])."""
        log = self.find_job(name)
        if log is None:
            return None, []
        batch = log.take(max(0, limit), max_bytes, self.items.completing)
        log.sending(batch)
        return log, batch

    def confirm_results(self, log: CompletionLog, batch: list[Outgoing]) -> list[Ticket]:
        """The results were handed over: DELIVERED (durable with the tickets)."""
        return log.confirm(batch)

    def drop_results(self, log: CompletionLog, batch: list[Outgoing]) -> None:
        """The results never left: deliverable again."""
        log.drop(batch)
        self.items.changed(results=True)

    # ------------------------------------------------------------- operator

    def kick(self, name: str) -> int:
        """Buried items of the job become pending again, delivery counts
        reset; how many (0 for a job nothing was enqueued for)."""
        log = self.find_job(name)
        if log is None:
            return 0
        kicked = 0
        for segment in self.segments.values():
            if not segment.buried:
                continue
            for chunk in segment.journal.scan():
                mask = chunk.markers == BURIED
                if not mask.any():
                    continue
                jobs = segment.journal.fields(chunk, 0, "<u8")
                offsets = chunk.offsets[mask & (jobs == np.uint64(log.job))]
                offsets = np.array([o for o in offsets.tolist() if o not in segment.held], dtype=np.int64)
                if len(offsets):
                    self.items.kicked(segment, log.job, offsets)
                    kicked += len(offsets)
        return kicked

    # ---------------------------------------------------------- maintenance

    def seal_idle(self, now: float) -> None:
        """Seal active segments and logs unused for ``idle_seal_s``; rest
        logs with nothing left to do (completion_log.py)."""
        idle = self.config.idle_seal_s
        for segments in self.keys.values():
            active = segments[-1]
            if not active.journal.sealed and now - active.last_append > idle:
                active.journal.seal()
        for log in self.logs.values():
            if log.rested is not None:
                continue
            journal = log.active
            if not journal.sealed and journal.count and now - log.last_append > idle:
                journal.seal()
            elif log.restable(now, REST_AFTER_S if self.items.counts(log.job).idle else idle):
                log.rest()

    def close(self) -> None:
        """Close every file (each flushes first)."""
        for journal in self.journals():
            journal.close()

    def abandon(self) -> None:
        """Release every file unsynced, as a crash would (tests)."""
        for journal in self.journals():
            journal.abandon()

    def journals(self) -> Iterator[Journal]:
        """Every journal the queue holds open."""
        for log in self.logs.values():
            yield from log.segments.values()
        for segment in self.segments.values():
            yield segment.journal
        if self.catalog is not None:
            yield self.catalog.journal
