"""Leasing: dispatch, extension, give-back and worker reports.

Dispatch is two-phase: dispatch.py plans (reads, changes nothing) and
:func:`lease` commits in memory only (Items.leased: segment cursors, the
lease table, counts), so a lease either happens whole or not at all. Every
way a lease ends without a result goes through Items.reclaimed: the item is
pending again (its job's cursor in its segment moves back to it, nothing
else rewinds) or, after ``max_deliveries`` deliveries, buried.

Threads: under the broker's owner lock (workq/loop.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import numpy as np

from common.journal import Marker
from common.journal.errors import CorruptJournal, RecordNotFound
from common.wire.errors import Internal
from workq.config import REPLY_BATCH_BYTES
from workq.errors import NotLeased
from workq.protocol import Handle, Key, Leased

from . import dispatch

if TYPE_CHECKING:
    from workq.disk.segment import Taken

    from .queue import QueueState

log = logging.getLogger(__name__)

LIVE: Final = np.uint32(Marker.LIVE)
MAX_BURIED_PER_LEASE: Final = 100


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
          max_bytes: int | None) -> list[tuple[Key, Taken]]:
    keys = dispatch.rotated(sorted(k for k in state.keys if filters.match(k)), state.key_turn)
    state.key_turn += 1
    state.job_turn += 1
    plan: list[tuple[Key, Taken]] = []
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
    state.items.damaged(segment, exc.offset)
    log.error("workq: buried item %s: its payload is damaged (%s)", Handle(segment.id, exc.offset), exc.detail)


def _commit(state: QueueState, worker: str, key: Key, taken: Taken, now: float) -> Leased:
    packed, deliveries = state.items.leased(taken, worker, now)
    return Leased(key, state.job_name(taken.job), packed, taken.positions, deliveries, taken.payloads)


def _distinct(packed: list[int]) -> list[int]:
    """Handles without repeats (a handle named twice counts once), in order."""
    return list(dict.fromkeys(packed))


def _held_by(state: QueueState, worker: str, packed: list[int]) -> None:
    """NotLeased (changing nothing) unless ``worker`` holds every item."""
    for h in packed:
        lease = state.items.leases.by_handle.get(h)
        if lease is None or lease.worker != worker:
            raise NotLeased(f"item {Handle.unpack(h)} is not leased by worker {worker!r} "
                            f"({'completed, reclaimed or never leased' if lease is None else 'another holder'})")


def touch(state: QueueState, worker: str, packed: list[int], now: float) -> None:
    """Extend leases by a full lease period from now."""
    packed = _distinct(packed)
    _held_by(state, worker, packed)
    state.items.leases.extend(packed, now + state.config.lease_s)


def release(state: QueueState, worker: str, packed: list[int], delay: float, now: float) -> None:
    """Give leased items back, now or after ``delay`` seconds."""
    packed = _distinct(packed)
    _held_by(state, worker, packed)
    state.items.released(packed, delay, now, state.segments)


def worker_gone(state: QueueState, worker: str, now: float) -> None:
    """The worker's connection dropped: its leases end after the grace period."""
    deadline = now + state.config.disconnect_grace_s
    leases = state.items.leases
    for lease in leases.of_worker(worker):
        if lease.deadline > deadline:
            leases.extend(list(lease.handles), deadline)


def hello(state: QueueState, worker: str, packed: list[int], now: float) -> list[int]:
    """A (re)connecting worker reports what it holds. Items still unfinished
    are leased to it before it gets anything new; the rest are returned: the
    worker should drop them (completed, or held by someone else)."""
    dropped: list[int] = []
    mine: list[int] = []
    adopt: dict[tuple[int, int], list[int]] = {}
    leases = state.items.leases
    for h in _distinct(packed):
        lease = leases.by_handle.get(h)
        if lease is not None:
            (mine if lease.worker == worker else dropped).append(h)
            continue
        found = _pending_item(state, h)
        if found is None:
            dropped.append(h)
        else:
            adopt.setdefault(found, []).append(h)
    leases.extend(mine, now + state.config.lease_s)
    for (segment_id, job), hs in adopt.items():
        state.items.adopted(state.segments[segment_id], job, hs, worker, now)
    return dropped


def _pending_item(state: QueueState, h: int) -> tuple[int, int] | None:
    """(segment, job) of a reported item that is pending, else None."""
    segment_id, offset = Handle.unpack(h)
    segment = state.segments.get(segment_id)
    if segment is None or h in state.items.completing or offset in segment.held:
        return None
    try:
        jobs, _, markers = segment.heads_of(np.array([offset], dtype=np.int64))
    except RecordNotFound:
        return None
    return (segment_id, int(jobs[0])) if markers[0] == LIVE else None
