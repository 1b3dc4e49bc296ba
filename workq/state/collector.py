"""The collector: deletes segments nobody needs any more.

* An input segment is deleted when it is sealed and every item in it is
  retired (buried items keep it). The broker's newest segment is never
  deleted, so segment ids, and therefore handles, are never reused.
* Before any file is unlinked its catalog record (catalog.py) is
  tombstoned and made durable, so a missing file the catalog still lists
  is a lost file, never a collected one. That flush blocks the owner thread
  once per collection (a few ms per sealed segment: rare).
* A job's oldest completion-log segment is deleted when it is sealed, not
  the active one, and every result in it was delivered; first a ledger entry
  with the running totals is appended to the active segment and made
  durable (the broker calls :func:`finish_log` once it is).

Deletion is safe for readers: the broker runs the collector on its owner
thread between operations, so no scan of its own is in progress, and a
process that still has the file open (``verify``) keeps reading the
unlinked inode, as POSIX guarantees.

Threads: under the broker's owner lock (workq/loop.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from common.journal import Marker, Ticket
from common.journal.filesystem import fsync_dir
from workq.disk.catalog import RESULTS, SEGMENT, Entry
from workq.disk.completion_log import CompletionLog

if TYPE_CHECKING:
    from .queue import QueueState

log = logging.getLogger(__name__)


def collect_segments(state: QueueState) -> int:
    """Delete every finished input segment (but the newest); returns how many."""
    newest = max(state.segments, default=0)
    done = [s for s in state.segments.values() if s.finished and s.id != newest and not s.held]
    if done and state.catalog is not None:  # durable tombstones first: a missing file must mean collected
        state.catalog.retire_durably([Entry(SEGMENT, s.id) for s in done])
    for segment in done:
        state.remove_segment(segment)
        path = segment.journal.path
        segment.journal.close()
        path.unlink()
        log.info("collected %s (%d items, all retired)", path.name, segment.records)
    if done:
        fsync_dir(state.segment_dir)
    return len(done)


def start_logs(state: QueueState) -> list[tuple[CompletionLog, int, Ticket]]:
    """Write ledger entries for collectable completion segments; the caller
    calls finish_log for each once its ticket is durable."""
    started = []
    for job_log in state.logs.values():
        seq = job_log.collectable()
        if seq is None or seq < job_log.ledger.collected_below:
            continue
        journal = job_log.segments[seq]
        job_log.ledger.collected_below = seq + 1
        job_log.ledger.results += journal.count - job_log.ledger_entries.get(seq, 0)
        job_log.ledger.max_position = max(job_log.ledger.max_position, job_log.max_position)
        started.append((job_log, seq, job_log.write_ledger()))
    return started


def finish_log(job_log: CompletionLog, seq: int) -> None:
    """The ledger entry is durable: delete the segment."""
    if seq not in job_log.segments or job_log.segments[seq].counters[Marker.LIVE]:
        return
    if job_log.catalog is not None:  # after the ledger entry: the ledger decides what was collected
        job_log.catalog.retire_durably([Entry(RESULTS, job_log.job, seq)])
    journal = job_log.forget_segment(seq)
    path = journal.path
    journal.close()
    path.unlink()
    fsync_dir(job_log.directory)
    log.info("collected %s (all results delivered)", path)
