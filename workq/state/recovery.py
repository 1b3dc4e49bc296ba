"""Broker start-up: rebuild the queue from the journals alone.

Recovery reads the markers and the fixed 24-byte record heads (job id,
position, handle), never a payload, all with vectorised scans:

1. Completion logs: each job's segments, result counts, delivered markers,
   the newest ledger entry, and the handles that have results.
2. Input segments: per job, the pending items (LIVE) and where they start,
   the buried ones, and dead bytes. Every segment found is sealed and marked
   *recovered*: no new item is ever appended to it (so a handle lost with a
   torn tail can never name a different item later), and its items are not
   dispatched during the reconnect window.
3. Interrupted completions are finished: an input whose result is durable
   but whose marker is still LIVE or BURIED is tombstoned now, durably.

A job log with nothing undelivered rests at once (closed, counts kept), so
recovering many finished jobs does not hold a file open per job.

Journal recovery (torn tails, checkpoints) happens as each file opens.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

import msgpack
import numpy as np

from common.journal import Journal, Marker
from common.journal.errors import RecordNotFound
from common.journal.filesystem import fsync_dir, make_dirs
from workq import protocol as handles
from workq.disk.catalog import RESULTS, SEGMENT, Catalog, Entry
from workq.disk.completion_log import SUFFIX as RESULTS_SUFFIX
from workq.disk.completion_log import CompletionLog, Ledger
from workq.disk.records import HANDLE_AT, HEAD_BYTES, JOB_AT, LEDGER, POSITION_AT, RESULTS_KIND, SEGMENT_KIND, job_dir
from workq.disk.segment import SUFFIX as SEGMENT_SUFFIX
from workq.disk.segment import JobCursor, Segment

from .queue import JobCounts

if TYPE_CHECKING:
    from .queue import QueueState

log = logging.getLogger(__name__)


@dataclasses.dataclass(slots=True)
class RecoverySummary:
    segments: int = 0
    jobs: int = 0
    pending: int = 0
    buried: int = 0
    results: int = 0
    finished: int = 0  # inputs tombstoned at start-up (result durable, marker not)
    seconds: float = 0.0


def recover(state: QueueState) -> RecoverySummary:
    started = time.monotonic()
    make_dirs(state.root)
    state.catalog = Catalog.open(state.root, state.flusher)
    state.next_segment_id = max(state.next_segment_id, state.catalog.next_segment)
    report = RecoverySummary()
    with_results = _recover_logs(state, report)
    if len(with_results):  # never reuse a segment id a result names (its catalog may be lost)
        state.next_segment_id = max(state.next_segment_id, int((with_results >> np.uint64(32)).max()) + 1)
    _recover_segments(state, report)
    _catalog(state)
    report.finished = _finish(state, with_results)
    report.pending = sum(c.pending for c in state.counts.values())
    report.buried = sum(c.buried for c in state.counts.values())
    report.jobs = len(state.logs)
    if any(s.pending for s in state.segments.values()):
        state.window_ends = time.monotonic() + state.config.reconnect_window_s
    report.seconds = time.monotonic() - started
    return report


def _recover_logs(state: QueueState, report: RecoverySummary) -> np.ndarray:
    """Open every completion log; return the input handles that have results."""
    found: list[np.ndarray] = []
    if not state.results_dir.exists():
        return np.zeros(0, dtype=np.uint64)
    for directory in sorted(p for p in state.results_dir.iterdir() if p.is_dir()):
        job_log = None
        for path in sorted(directory.glob(f"*{RESULTS_SUFFIX}")):
            journal = Journal.open(path, kind=RESULTS_KIND, flusher=state.flusher)
            meta = msgpack.unpackb(journal.metadata)
            if job_log is None:
                job_log = CompletionLog(directory, meta["job"], int(meta["job_id"]), state.flusher,
                                 state.config.segment_bytes, state.catalog)
            elif job_log.name == job_dir(job_log.job):  # a placeholder (a log recreated without its name)
                job_log.name = meta["job"]
            job_log.segments[int(meta["seq"])] = journal
            found.append(_scan_log(job_log, int(meta["seq"]), journal))
        if job_log is None:
            continue
        _drop_collected(job_log)
        if job_log.restable(time.monotonic(), 0.0):
            job_log.rest()  # a finished job holds no file (see completions.py)
        state.logs[job_log.job] = job_log
        state.counts.setdefault(job_log.job, JobCounts())
        state.next_position[job_log.job] = max(state.next_position.get(job_log.job, 0), job_log.max_position + 1,
                                               job_log.ledger.max_position + 1)
        report.results += job_log.completed
    return np.concatenate(found) if found else np.zeros(0, dtype=np.uint64)


def _scan_log(job_log: CompletionLog, seq: int, journal: Journal) -> np.ndarray:
    results: list[np.ndarray] = []
    for chunk in journal.scan():
        handle_column = journal.fields(chunk, HANDLE_AT, "<u8")
        ledger = handle_column == LEDGER
        results.append(handle_column[~ledger])
        positions = journal.fields(chunk, POSITION_AT, "<u8")[~ledger]
        if len(positions):
            job_log.max_position = max(job_log.max_position, int(positions.max()))
        if ledger.any():
            job_log.ledger_entries[seq] = job_log.ledger_entries.get(seq, 0) + int(ledger.sum())
            last = int(np.flatnonzero(ledger)[-1])
            for body in journal.bodies(chunk[last:last + 1], skip=HEAD_BYTES):
                entry = Ledger(**msgpack.unpackb(body))
                if entry.collected_below >= job_log.ledger.collected_below:
                    job_log.ledger = entry
    return np.concatenate(results) if results else np.zeros(0, dtype=np.uint64)


def _drop_collected(job_log: CompletionLog) -> None:
    """Finish collections a crash interrupted (ledger written, file not deleted)."""
    gone = sorted(s for s in job_log.segments if s < job_log.ledger.collected_below)
    if gone and job_log.catalog is not None:
        job_log.catalog.retire_durably([Entry(RESULTS, job_log.job, seq) for seq in gone])
    for seq in gone:
        journal = job_log.forget_segment(seq)
        journal.close()
        journal.path.unlink()
        log.info("finished collecting %s", journal.path)
    if gone:
        fsync_dir(job_log.directory)


def _recover_segments(state: QueueState, report: RecoverySummary) -> None:
    paths = sorted(state.segment_dir.glob(f"*{SEGMENT_SUFFIX}")) if state.segment_dir.exists() else []
    catalog = state.catalog
    assert catalog is not None
    collected = [p for p in paths if p.stem.isdigit() and catalog.marker(Entry(SEGMENT, int(p.stem))) == Marker.RETIRED]
    for path in collected:  # the collector's tombstone is durable; a crash came before the unlink
        path.unlink()
        log.info("finished collecting %s", path)
    if collected:
        fsync_dir(state.segment_dir)
    for path in (p for p in paths if p not in collected):
        journal = Journal.open(path, kind=SEGMENT_KIND, flusher=state.flusher)
        segment_id, key = Segment.describe(journal)
        if not journal.sealed:
            journal.seal()
        segment = Segment(journal, segment_id, key, recovered=True)
        for chunk in journal.scan():
            _scan_segment(state, segment, chunk)
        state.segments[segment_id] = segment
        state.keys.setdefault(key, []).append(segment)
        state.next_segment_id = max(state.next_segment_id, segment_id + 1)
        report.segments += 1
    for segments in state.keys.values():
        segments.sort(key=lambda s: s.id)


def _scan_segment(state: QueueState, segment: Segment, chunk) -> None:  # type: ignore[no-untyped-def]
    journal = segment.journal
    jobs = journal.fields(chunk, JOB_AT, "<u8")
    positions = journal.fields(chunk, POSITION_AT, "<u8")
    markers = chunk.markers
    for job in np.unique(jobs).tolist():
        mine = jobs == np.uint64(job)
        live = mine & (markers == np.uint32(Marker.LIVE))
        counts = state.counts.setdefault(job, JobCounts())
        counts.pending += int(live.sum())
        counts.buried += int((mine & (markers == np.uint32(Marker.BURIED))).sum())
        state.next_position[job] = max(state.next_position.get(job, 0), int(positions[mine].max()) + 1)
        if live.any():
            first = int(chunk.offsets[live][0])
            cursor = segment.jobs.setdefault(job, JobCursor(first))
            cursor.cursor = min(cursor.cursor, first)
            cursor.pending += int(live.sum())
        if job not in state.logs:  # its completion log is missing: start a new one
            state.logs[job] = CompletionLog.create(state.results_dir, job_dir(job), job, state.flusher,
                                            state.config.segment_bytes, state.catalog)
    retired = markers == np.uint32(Marker.RETIRED)
    align = journal.alignment
    segment.dead_bytes += int(((chunk.lengths[retired] + 16 + align - 1) & ~(align - 1)).sum())


def _catalog(state: QueueState) -> None:
    """Record the files present that the catalog lacks (created just before
    a crash, or a directory older than the catalog); report lost ones."""
    assert state.catalog is not None
    present = [Entry(SEGMENT, s) for s in state.segments]
    present += [Entry(RESULTS, int(p.parent.name, 16), int(p.stem))
                for p in state.results_dir.glob(f"*/*{RESULTS_SUFFIX}") if p.stem.isdigit()] \
        if state.results_dir.exists() else []
    state.catalog.add(present)
    lost = set(state.catalog.live()) - set(present)
    for entry in sorted(lost):
        log.error("workq: %s is missing: the catalog says it exists (its items or results are lost; "
                  "run shardmgr verify)", entry.path(state.root))


def _finish(state: QueueState, with_results: np.ndarray) -> int:
    """Tombstone inputs that have a durable result but are not RETIRED."""
    finished = 0
    segment_ids, offsets = handles.unpack(with_results)
    for segment_id in np.unique(segment_ids).tolist():
        segment = state.segments.get(segment_id)
        if segment is None:
            continue
        mine = offsets[segment_ids == segment_id]
        mine = mine[(mine >= 4096) & (mine < segment.journal.end)]
        try:
            jobs, _, markers = segment.heads_of(mine)
        except RecordNotFound:  # a result whose input was lost with a torn tail: nothing to finish
            jobs, markers, mine = _valid_only(segment, mine)
        open_ = markers != np.uint32(Marker.RETIRED)
        if not open_.any():
            continue
        segment.journal.set_markers(mine[open_], Marker.RETIRED)
        segment.journal.flush()  # durable before any completion log is collected
        for job, marker in zip(jobs[open_].tolist(), markers[open_].tolist()):
            counts = state.counts[job]
            if marker == Marker.LIVE:
                counts.pending -= 1
                segment.jobs[job].pending -= 1
            else:
                counts.buried -= 1
        finished += int(open_.sum())
    return finished


def _valid_only(segment: Segment, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keep = []
    for offset in offsets.tolist():
        try:
            segment.journal.markers([offset])
            keep.append(offset)
        except RecordNotFound:
            log.warning("segment %d: a result names offset %d, which holds no item", segment.id, offset)
    kept = np.array(keep, dtype=np.int64)
    jobs, _, markers = segment.heads_of(kept)
    return jobs, markers, kept
