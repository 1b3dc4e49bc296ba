"""Completing items: result durable, then tombstone, then retire.

Three steps, so the owner never waits for a flush:

1. :func:`plan` checks every handle and every result (changes nothing). A
   handle whose item is retired, completing, or in a collected segment is a
   *duplicate*: its result is dropped, since the item already has one (the
   first result wins, whichever worker sent it). Unknown handles, oversized
   results and wrong types fail the whole call.
2. :func:`start` appends the accepted results to their jobs' completion logs
   (one batch per job and segment) and marks the items completing, so no
   one dispatches or completes them meanwhile, and no consumer sees their
   results before they are durable. It returns the tickets to wait for.
3. :func:`finish`, once the tickets are durable: rewrite each input's marker
   to RETIRED in place, and retire the items in memory.

A crash between 2 and 3 leaves durable results for LIVE inputs; recovery
finishes them (recovery.py). If the results cannot be made durable,
:func:`abort` strands the items until a restart (never a second result).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import numpy as np

from common.journal import Marker, Ticket
from common.journal.errors import JournalError, RecordNotFound
from workq.errors import PayloadTooLarge, ResultsNotRecorded, UnknownHandle
from workq.protocol import COMPLETED, DUPLICATE, OFFSET_UNIT, Handle

from .items import Completion

if TYPE_CHECKING:
    from workq.disk.segment import Segment

    from .queue import QueueState

RETIRED: Final = int(Marker.RETIRED)


@dataclasses.dataclass(slots=True)
class CompletionPlan:
    """What one complete call does: a status per handle and the accepted results."""

    statuses: list[str]
    groups: list[Completion]
    tickets: list[Ticket] = dataclasses.field(default_factory=list)
    error: Exception | None = None  # set by start: only some results were written

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, statuses: list[str], groups: list[Completion], tickets: list[Ticket] | None = None,
                 error: Exception | None = None) -> None:
        self.statuses = statuses
        self.groups = groups
        self.tickets = [] if tickets is None else tickets
        self.error = error


def plan(state: QueueState, packed: list[int] | np.ndarray, payloads: Sequence[bytes | memoryview]) -> CompletionPlan:
    """Validate a batch of results; nothing is changed.

    Grouping is plain Python over the handles (one dict step each): for
    one item per call, numpy's per-call overhead would cost more than the
    rest of the completion; for batches it costs well under a microsecond
    per item. The records are read per segment, vectorised."""
    if len(packed) != len(payloads):
        raise ValueError(f"{len(packed)} handles but {len(payloads)} results")
    limit = state.config.result_limit
    for index, payload in enumerate(payloads):
        if len(payload) > limit:
            raise PayloadTooLarge(f"result {index} has {len(payload)} bytes; the limit is {limit}")
    handles = packed if isinstance(packed, list) else np.asarray(packed, dtype=np.uint64).tolist()
    rows_of: dict[int, list[int]] = {}  # segment id -> rows of the first mention of each handle
    seen: set[int] = set()
    completing = state.items.completing
    for row, handle in enumerate(handles):
        if handle not in seen:
            seen.add(handle)
            if handle not in completing:  # completing: it has a result already
                rows_of.setdefault(handle >> 32, []).append(row)
    accept = [False] * len(handles)
    groups: list[Completion] = []
    for segment_id, rows in sorted(rows_of.items()):
        segment = state.segments.get(segment_id)
        if segment is None:
            if not 0 < segment_id < state.next_segment_id:
                raise UnknownHandle(f"item {Handle.unpack(handles[rows[0]])}: no such segment")
            continue  # the segment was collected: every item in it already has its result
        groups += _segment_groups(segment, rows, handles, payloads, accept)
    return CompletionPlan([COMPLETED if a else DUPLICATE for a in accept], groups)


def _segment_groups(segment: Segment, rows: list[int], handles: list[int],
                    payloads: Sequence[bytes | memoryview], accept: list[bool]) -> list[Completion]:
    """The accepted results of one segment's ``rows``, one group per job;
    sets ``accept`` for them (an item already retired is a duplicate)."""
    offsets = [(handles[r] & 0xFFFFFFFF) * OFFSET_UNIT for r in rows]  # Handle.unpack
    try:
        jobs, positions, markers = segment.heads_listed(offsets)
    except RecordNotFound as exc:
        raise UnknownHandle(f"segment {segment.id}: {exc}") from None
    return _grouped(segment, rows, handles, payloads, accept, offsets, jobs, positions, markers)


def _grouped(segment: Segment, rows: list[int], handles: list[int], payloads: Sequence[bytes | memoryview],
             accept: list[bool], offsets: list[int], jobs: list[int], positions: list[int],
             markers: list[int]) -> list[Completion]:
    """:func:`_by_job`, short-cut for the usual call (every call of one
    item): one job, nothing retired, so one group of every row as read."""
    if RETIRED in markers or jobs.count(jobs[0]) != len(jobs):
        return _by_job(segment, rows, handles, payloads, accept, offsets, jobs, positions, markers)
    for row in rows:
        accept[row] = True
    return [Completion(jobs[0], segment, offsets, [handles[r] for r in rows], positions, markers,
                       [payloads[r] for r in rows])]


def _by_job(segment: Segment, rows: list[int], handles: list[int], payloads: Sequence[bytes | memoryview],
            accept: list[bool], offsets: list[int], jobs: list[int], positions: list[int],
            markers: list[int]) -> list[Completion]:
    """One group per job (ascending) of the rows whose item is not retired."""
    picks: dict[int, list[int]] = {}  # job -> indexes into rows
    for index, (job, marker) in enumerate(zip(jobs, markers)):
        if marker != RETIRED:
            picks.setdefault(job, []).append(index)
            accept[rows[index]] = True
    groups = []
    for job, chosen in sorted(picks.items()):
        mine = [rows[i] for i in chosen]
        groups.append(Completion(job, segment, [offsets[i] for i in chosen], [handles[r] for r in mine],
                                 [positions[i] for i in chosen], [markers[i] for i in chosen],
                                 [payloads[r] for r in mine]))
    return groups


def start(state: QueueState, plan: CompletionPlan) -> CompletionPlan:
    """Append the results and mark their items completing.

    If an append fails (full disk, I/O error), the results written before
    it still complete: the plan keeps only their groups and ``plan.error``
    says what failed; the rest of the call changes nothing.
    """
    written: list[Completion] = []
    by_job: dict[int, list[Completion]] = {}
    for group in plan.groups:
        by_job.setdefault(group.job, []).append(group)
    for job, groups in by_job.items():
        if len(groups) == 1:  # one segment (always, for one item): nothing to join
            appended = state.logs[job].append(groups[0].handles, groups[0].positions, groups[0].payloads)
        else:
            appended = state.logs[job].append([h for g in groups for h in g.handles],
                                              [p for g in groups for p in g.positions],
                                              [p for g in groups for p in g.payloads])
        plan.tickets += appended.tickets
        if appended.error is not None:
            written += _first(groups, appended.written)
            plan.error = ResultsNotRecorded(f"{appended.written} of this call's results for job "
                                            f"{state.job_name(job)!r} were written, then: {appended.error}")
            plan.error.__cause__ = appended.error
            break
        written += groups
    plan.groups = written
    for group in written:
        state.items.began_completing(group)
        group.payloads = []  # written: not kept alive (nor the request's frame they view) until the flush
    return plan


def _first(groups: list[Completion], n: int) -> list[Completion]:
    """The first ``n`` results of a job's groups, in append order."""
    out = []
    for group in groups:
        if n <= 0:
            break
        k = min(n, len(group.offsets))
        out.append(Completion(group.job, group.segment, group.offsets[:k], group.handles[:k],
                              group.positions[:k], group.markers[:k], group.payloads[:k]))
        n -= k
    return out


def finish(state: QueueState, plan: CompletionPlan) -> list[str]:
    """The results are durable: tombstone the inputs and retire them. The
    tombstones' tickets go to the job's log: it keeps its segments until
    they are durable too. Items whose input segment has failed (an earlier
    flush error) cannot be tombstoned: they stay completing until a restart
    (see :func:`abort`); their results are durable, so they count as done."""
    for group in plan.groups:
        try:
            ticket = state.items.retired(group)
        except JournalError as exc:
            state.items.stranded_by([group], exc)
            continue
        state.logs[group.job].tombstoned(ticket)
    return plan.statuses


def abort(state: QueueState, plan: CompletionPlan, error: Exception) -> None:
    """The results could not be made durable (their log's flush failed).

    They may or may not be on disk, so their items can neither retire nor
    be offered again (either could give an item two results): they stay
    completing (in flight, never dispatched, their results never handed
    out) until the broker restarts, when recovery settles each item from
    what the disk holds.
    """
    state.items.stranded_by(plan.groups, error)
