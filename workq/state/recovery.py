"""Broker start-up: rebuild the queue from the journals' markers alone.

Recovery reads the markers and the fixed 24-byte record heads (job id,
position, handle), never a payload, all with vectorised scans, and decides
every file's fate from the file itself:

1. Completion logs: each job's segments, result counts, delivered markers,
   the newest ledger entry (a record of the log itself), and the handles
   that have results. A log segment the newest ledger counts as collected is
   deleted (a crash came between the ledger entry and the unlink).
2. Input segments: every segment found is opened (its counters recounted
   from its markers) and sealed, and marked *recovered*: no new item is
   ever appended to it (so a handle lost with a torn tail can never name a
   different item later), and its items are not dispatched during the
   reconnect window. Per job: the pending items (LIVE) and where they start,
   the buried ones. A segment whose every entry is RETIRED is finished: the
   collector deletes it like any other (the newest one stays, see 4).
3. Interrupted completions are finished: an input whose result is durable
   but whose marker is still LIVE or BURIED is tombstoned now, durably.
4. The next segment id is above every id the disk names: the segment files,
   the handles that results name, and queue files ``verify --repair`` moved
   to quarantine. The collector never deletes the newest segment, so the
   highest id ever used stays on disk, unless it is lost: then the
   catalog's records serve as a floor (they can only raise the id; a
   reused id would let a worker's old handle name a new item).

The catalog (workq/disk/catalog.py) is an audit record for ``verify``:
recovery writes to it (files present that it lacks are recorded, files
recovery deletes are retired first) but never reads from it what a file
holds or whether it is kept; only the id floor of step 4.
docs/durability.md lists the crash windows.

A job log with nothing undelivered rests at once (closed, counts kept), so
recovering many finished jobs does not hold a file open per job. Journal
recovery (torn tails, checkpoints) happens as each file opens.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import TYPE_CHECKING

import msgpack
import numpy as np

from common.journal import Journal, Marker, RecordChunk
from common.journal.errors import RecordNotFound
from common.journal.filesystem import fsync_dir, make_dirs
from common.journal.header import HEADER_SIZE
from workq.disk.catalog import RESULTS, SEGMENT, Catalog, Entry
from workq.disk.completion_log import CompletionLog, Ledger
from workq.disk.records import (
    HANDLE_AT,
    HEAD_BYTES,
    JOB_AT,
    LEDGER,
    POSITION_AT,
    RESULTS_KIND,
    RESULTS_SUFFIX,
    SEGMENT_KIND,
    SEGMENT_SUFFIX,
    job_dir,
    quarantined_segment_ids,
)
from workq.disk.segment import Segment
from workq.protocol import unpack

if TYPE_CHECKING:
    from .queue import QueueState

log = logging.getLogger(__name__)

LIVE = np.uint32(Marker.LIVE)
BURIED = np.uint32(Marker.BURIED)
RETIRED = np.uint32(Marker.RETIRED)


@dataclasses.dataclass(slots=True)
class RecoverySummary:
    """What the queue's start-up found and did."""

    segments: int = 0
    jobs: int = 0
    pending: int = 0
    buried: int = 0
    results: int = 0
    finished: int = 0  # inputs tombstoned at start-up (result durable, marker not)
    seconds: float = 0.0


def recover(state: QueueState) -> RecoverySummary:
    """Rebuild ``state`` (empty) from the files under ``state.root``."""
    started = time.monotonic()
    make_dirs(state.root)
    state.catalog = Catalog.open(state.root, state.flusher)
    summary = RecoverySummary()
    with_results = _recover_logs(state, summary)
    _recover_segments(state, summary)
    named = [int((with_results >> np.uint64(32)).max())] if len(with_results) else []
    named += quarantined_segment_ids(state.root)
    # a floor only: a lost newest segment that no result names is proven by no file (it can raise, never lower)
    named += state.catalog.segment_ids()
    state.next_segment_id = max([state.next_segment_id] + [i + 1 for i in named])
    _record_in_catalog(state)
    summary.finished = _finish(state, with_results)
    totals = state.items.totals()
    summary.pending, summary.buried, summary.jobs = totals["pending"], totals["buried"], len(state.logs)
    if any(s.pending for s in state.segments.values()):
        state.window_ends = time.monotonic() + state.config.reconnect_window_s
    summary.seconds = time.monotonic() - started
    return summary


def _recover_logs(state: QueueState, summary: RecoverySummary) -> np.ndarray:
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
            job_log.rest()  # a finished job holds no file (see completion_log.py)
        state.add_log(job_log)
        state.next_position[job_log.job] = max(state.next_position.get(job_log.job, 0), job_log.max_position + 1,
                                               job_log.ledger.max_position + 1)
        summary.results += job_log.completed
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
    if gone and job_log.catalog is not None:  # the audit record first, as the collector does
        job_log.catalog.retire_durably([Entry(RESULTS, job_log.job, seq) for seq in gone])
    for seq in gone:
        journal = job_log.forget_segment(seq)
        journal.close()
        journal.path.unlink()
        log.info("finished collecting %s", journal.path)
    if gone:
        fsync_dir(job_log.directory)


def _recover_segments(state: QueueState, summary: RecoverySummary) -> None:
    paths = sorted(state.segment_dir.glob(f"*{SEGMENT_SUFFIX}")) if state.segment_dir.exists() else []
    for path in paths:
        journal = Journal.open(path, kind=SEGMENT_KIND, flusher=state.flusher)  # recounts the markers
        segment_id, key = Segment.describe(journal)
        if not journal.sealed:
            journal.seal()
        segment = Segment(journal, segment_id, key, recovered=True)
        for chunk in journal.scan():
            _scan_segment(state, segment, chunk)
        state.add_segment(segment)
        summary.segments += 1
    for segments in state.keys.values():
        segments.sort(key=lambda s: s.id)


def _scan_segment(state: QueueState, segment: Segment, chunk: RecordChunk) -> None:
    journal = segment.journal
    jobs = journal.fields(chunk, JOB_AT, "<u8")
    positions = journal.fields(chunk, POSITION_AT, "<u8")
    markers = chunk.markers
    for job in np.unique(jobs).tolist():
        mine = jobs == np.uint64(job)
        live = mine & (markers == LIVE)
        first = int(chunk.offsets[live][0]) if live.any() else 0
        state.items.recovered(segment, job, first, int(live.sum()), int((mine & (markers == BURIED)).sum()))
        state.next_position[job] = max(state.next_position.get(job, 0), int(positions[mine].max()) + 1)
        if job not in state.logs:  # its completion log is missing: start a new one
            state.add_log(CompletionLog.create(state.results_dir, job_dir(job), job, state.flusher,
                                               state.config.segment_bytes, state.catalog))
    retired = markers == RETIRED
    segment.dead_bytes += int((chunk.ends(journal.alignment) - chunk.offsets)[retired].sum())


def _record_in_catalog(state: QueueState) -> None:
    """Audit: record the files present that the catalog lacks (created just
    before a crash, a directory older than the catalog, or a file the
    catalog wrongly called collected); report files it lists that are gone."""
    catalog = state.catalog
    assert catalog is not None
    present = [Entry(SEGMENT, s) for s in state.segments]
    present += [Entry(RESULTS, int(p.parent.name, 16), int(p.stem))
                for p in state.results_dir.glob(f"*/*{RESULTS_SUFFIX}") if p.stem.isdigit()] \
        if state.results_dir.exists() else []
    catalog.add(present)
    lost = set(catalog.live()) - set(present)
    for entry in sorted(lost):
        log.error("workq: %s is missing: the catalog says it exists (its items or results are lost; "
                  "run shardmgr verify)", entry.path(state.root))


def _finish(state: QueueState, with_results: np.ndarray) -> int:
    """Tombstone inputs that have a durable result but are not RETIRED."""
    finished = 0
    segment_ids, offsets = unpack(with_results)
    for segment_id in np.unique(segment_ids).tolist():
        segment = state.segments.get(segment_id)
        if segment is None:
            continue
        mine = offsets[segment_ids == segment_id]
        mine = mine[(mine >= HEADER_SIZE) & (mine < segment.journal.end)]
        try:
            jobs, _, markers = segment.heads_of(mine)
        except RecordNotFound:  # a result whose input was lost with a torn tail: nothing to finish
            jobs, markers, mine = _valid_only(segment, mine)
        open_ = markers != RETIRED
        if not open_.any():
            continue
        state.items.finished(segment, mine[open_], jobs[open_], markers[open_])
        segment.journal.flush()  # durable before any completion log is collected
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
