"""Leasing: dispatch, extension, give-back, expiry and worker reports.

Dispatch is two-phase: dispatch.py plans (reads, changes nothing) and
:func:`lease` commits in memory only (segment cursors, the lease table,
counts), so a lease either happens whole or not at all. Every way a lease
ends without a result goes through :func:`reclaim`: the item is pending
again (its job's cursor in its segment moves back to it, nothing else
rewinds) or, after ``max_deliveries`` deliveries, buried.

Threads: the broker's owner thread.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from common.journal import Marker
from common.journal.errors import CorruptJournal, RecordNotFound
from common.wire.errors import Internal
from workq import protocol as handles
from workq.config import REPLY_BATCH_BYTES
from workq.errors import NotLeased
from workq.protocol import Handle, Key

from . import dispatch
from .lease_table import Lease
from .queue import JobCounts, Leased

if TYPE_CHECKING:
    from .queue import QueueState

log = logging.getLogger(__name__)

LIVE = np.uint32(Marker.LIVE)
MAX_BURIED_PER_LEASE = 100


def lease(state: QueueState, worker: str, filters: dispatch.Filters, limit: int, now: float,
          max_bytes: int | None = None) -> list[Leased]:
    """Plan, then commit, a lease of up to ``limit`` items whose response
    fits ``max_bytes`` (see dispatch.py). An item whose payload fails its
    checksum is buried (and logged) instead of failing every lease."""
    for _ in range(MAX_BURIED_PER_LEASE):
        try:
            plan = _plan(state, filters, max(0, min(limit, state.config.max_lease_items)), now, max_bytes)
        except CorruptJournal as exc:
            _bury_damaged(state, exc)
            continue
        return [_commit(state, worker, key, taken, now) for key, taken in plan]
    raise Internal(f"more than {MAX_BURIED_PER_LEASE} damaged items met in one lease; see the log")


def _plan(state: QueueState, filters: dispatch.Filters, limit: int, now: float,
          max_bytes: int | None) -> list[tuple[Key, dispatch.Taken]]:
    keys = dispatch.rotated(sorted(k for k in state.keys if filters.match(k)), state.key_turn)
    state.key_turn += 1
    state.job_turn += 1
    plan: list[tuple[Key, dispatch.Taken]] = []
    budget = max_bytes if max_bytes is not None else 1 << 62
    got = 0
    for key in keys:
        if got >= limit or budget <= 0:
            break
        ready = [s for s in state.keys[key] if state.dispatchable(s, now)]
        for taken in dispatch.plan_key(ready, limit - got, state.job_turn, budget, first=not plan):
            plan.append((key, taken))
            got += len(taken.offsets)
            budget -= taken.cost + REPLY_BATCH_BYTES
    return plan


def _bury_damaged(state: QueueState, exc: CorruptJournal) -> None:
    """Bury the item whose record ``exc`` names (pending, so unheld)."""
    segment = next((s for s in state.segments.values() if s.journal.path == exc.path), None)
    if segment is None:
        raise exc
    offset = np.array([exc.offset], dtype=np.int64)
    jobs, _, _ = segment.heads_of(offset)
    job = int(jobs[0])
    segment.journal.set_markers(offset, Marker.BURIED, expect=Marker.LIVE)
    cursor = segment.jobs.get(job)
    if cursor is not None:
        cursor.pending -= 1
    counts = state.counts.setdefault(job, JobCounts())
    counts.pending -= 1
    counts.buried += 1
    log.error("workq: buried item %s: its payload is damaged (%s)", Handle(segment.id, exc.offset), exc.detail)


def _commit(state: QueueState, worker: str, key: Key, taken: dispatch.Taken, now: float) -> Leased:
    segment = taken.segment
    segment.commit_take(taken)
    packed = handles.pack(segment.id, taken.offsets)
    listed = packed.tolist()
    deliveries = np.array(state.leases.delivered(listed), dtype=np.uint32)
    state.leases.add(segment.id, taken.job, worker, now + state.config.lease_s, listed)
    counts = state.counts.setdefault(taken.job, JobCounts())
    counts.pending -= len(listed)
    counts.in_flight += len(listed)
    return Leased(key, state.job_name(taken.job), packed, taken.positions, deliveries, taken.payloads)


def _distinct(packed: list[int]) -> list[int]:
    """Handles without repeats (a handle named twice counts once), in order."""
    return list(dict.fromkeys(packed))


def _held_by(state: QueueState, worker: str, packed: list[int]) -> None:
    """NotLeased (changing nothing) unless ``worker`` holds every item."""
    for h in packed:
        batch = state.leases.by_handle.get(h)
        if batch is None or batch.worker != worker:
            raise NotLeased(f"item {Handle.unpack(h)} is not leased by worker {worker!r} "
                            f"({'completed, reclaimed or never leased' if batch is None else 'another holder'})")


def touch(state: QueueState, worker: str, packed: list[int], now: float) -> None:
    """Extend leases by a full lease period from now."""
    packed = _distinct(packed)
    _held_by(state, worker, packed)
    state.leases.extend(packed, now + state.config.lease_s)


def release(state: QueueState, worker: str, packed: list[int], delay: float, now: float) -> None:
    """Give leased items back, now or after ``delay`` seconds."""
    packed = _distinct(packed)
    _held_by(state, worker, packed)
    groups: dict[int, tuple[Lease, list[int]]] = {}
    for h, batch in state.leases.remove(packed):
        groups.setdefault(id(batch), (batch, []))[1].append(h)
    for batch, hs in groups.values():
        if delay > 0:
            state.leases.add(batch.segment, batch.job, None, now + delay, hs)
            counts = state.counts[batch.job]
            counts.in_flight -= len(hs)
            counts.pending += len(hs)
        else:
            reclaim(state, batch, hs)


def reclaim(state: QueueState, batch: Lease, packed: list[int]) -> None:
    """LeaseTable ended without a result: pending again, or buried."""
    counts = state.counts.setdefault(batch.job, JobCounts())
    if batch.worker is None:  # a delayed release: already counted pending
        counts.pending -= len(packed)
    else:
        counts.in_flight -= len(packed)
    segment = state.segments.get(batch.segment)
    if segment is None:
        return
    state.item_changes += 1
    offsets = handles.unpack(np.array(packed, dtype=np.uint64))[1]
    worn = np.array([state.leases.deliveries.get(h, 0) >= state.config.max_deliveries for h in packed], dtype=bool)
    if worn.any():
        segment.journal.set_markers(offsets[worn], Marker.BURIED)
        segment.unhold(offsets[worn])
        counts.buried += int(worn.sum())
    if (~worn).any():
        segment.give_back(batch.job, offsets[~worn])
        counts.pending += int((~worn).sum())


def expire(state: QueueState, now: float) -> int:
    """Reclaim every lease past its deadline; returns how many items."""
    ended = state.leases.expired(now)
    for batch, packed in ended:
        reclaim(state, batch, packed)
    return sum(len(p) for _, p in ended)


def worker_gone(state: QueueState, worker: str, now: float) -> None:
    """The worker's connection dropped: its leases end after the grace period."""
    deadline = now + state.config.disconnect_grace_s
    for batch in state.leases.of_worker(worker):
        if batch.deadline > deadline:
            state.leases.extend(list(batch.handles), deadline)


def hello(state: QueueState, worker: str, packed: list[int], now: float) -> list[int]:
    """A (re)connecting worker reports what it holds. Items still unfinished
    are leased to it before it gets anything new; the rest are returned: the
    worker should drop them (completed, or held by someone else)."""
    dropped: list[int] = []
    mine: list[int] = []
    adopt: dict[tuple[int, int], list[int]] = {}
    for h in _distinct(packed):
        batch = state.leases.by_handle.get(h)
        if batch is not None:
            (mine if batch.worker == worker else dropped).append(h)
            continue
        found = _pending_item(state, h)
        if found is None:
            dropped.append(h)
        else:
            adopt.setdefault(found, []).append(h)
    state.leases.extend(mine, now + state.config.lease_s)
    for (segment_id, job), hs in adopt.items():
        _adopt(state, worker, segment_id, job, hs, now)
    return dropped


def _pending_item(state: QueueState, h: int) -> tuple[int, int] | None:
    """(segment, job) of a reported item that is pending, else None."""
    segment_id, offset = Handle.unpack(h)
    segment = state.segments.get(segment_id)
    if segment is None or h in state.completing or offset in segment.held:
        return None
    try:
        jobs, _, markers = segment.heads_of(np.array([offset], dtype=np.int64))
    except RecordNotFound:
        return None
    return (segment_id, int(jobs[0])) if markers[0] == LIVE else None


def _adopt(state: QueueState, worker: str, segment_id: int, job: int, packed: list[int], now: float) -> None:
    segment = state.segments[segment_id]
    offsets = handles.unpack(np.array(packed, dtype=np.uint64))[1]
    segment.hold(offsets)
    cursor = segment.jobs.get(job)
    if cursor is not None:
        cursor.pending -= len(packed)
    counts = state.counts.setdefault(job, JobCounts())
    counts.pending -= len(packed)
    counts.in_flight += len(packed)
    for h in packed:
        state.leases.deliveries[h] = max(1, state.leases.deliveries.get(h, 0))
    state.leases.add(segment_id, job, worker, now + state.config.lease_s, packed)
