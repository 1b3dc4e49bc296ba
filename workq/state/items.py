"""Every item-state transition, and every count it changes, in one place.

An item is in one of these states (there is no per-item index: each state
lives where the table says)::

    state       marker on disk   in memory
    ----------  ---------------  ----------------------------------------------
    pending     LIVE             counted in its segment's job cursor
    leased      LIVE             a Lease with a holder; segment.held
    delayed     LIVE             a Lease without a holder; segment.held
    completing  LIVE or BURIED   ``completing``; segment.held
    retired     RETIRED          nothing (the segment's RETIRED count)
    buried      BURIED           counted per job

and moves only along these transitions, each a method of :class:`Items`::

    enqueued          -> pending
    recovered         -> pending | buried          (start-up, from the markers)
    leased            pending -> leased
    adopted           pending -> leased            (a reconnecting worker holds it)
    released          leased -> delayed, or as reclaimed
    reclaimed         leased | delayed -> pending, or buried after max deliveries
    damaged           pending -> buried            (its payload fails its checksum)
    kicked            buried -> pending
    began_completing  pending | leased | delayed | buried -> completing
    retired           completing -> retired        (its result is durable)
    finished          pending | buried -> retired  (start-up: the result was durable)

The counts per job (pending, in flight, buried, completing) and per
segment and job (the cursor's pending count) change only here; the
completion log counts completed and delivered results. ``item_changes`` and
``result_changes`` are bumped whenever items may have become pending or
results deliverable, so that waiting calls retry only then.

Threads: under the broker's owner lock (workq/loop.py).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Final

import numpy as np

from common.journal import Marker, Ticket
from workq.config import WorkqConfig
from workq.disk.completion_log import CompletionLog
from workq.disk.segment import Segment, Taken
from workq.protocol import pack, pack_ints, unpack

from .lease_table import Lease, LeaseTable

log = logging.getLogger(__name__)

BURIED: Final = np.uint32(Marker.BURIED)
BURIED_WORD: Final = int(Marker.BURIED)
LIVE: Final = np.uint32(Marker.LIVE)


@dataclasses.dataclass(slots=True)
class JobCounts:
    """One job's items by state (results are counted by its completion log)."""

    pending: int = 0  # including items released with a delay
    in_flight: int = 0  # leased or completing
    buried: int = 0
    completing: int = 0  # of in_flight: results written, not yet durable

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, pending: int = 0, in_flight: int = 0, buried: int = 0, completing: int = 0) -> None:
        self.pending = pending
        self.in_flight = in_flight
        self.buried = buried
        self.completing = completing

    @property
    def idle(self) -> bool:
        """Nothing pending, in flight or buried."""
        return not (self.pending or self.in_flight or self.buried)


@dataclasses.dataclass(slots=True)
class Completion:
    """Accepted results of one job for items of one segment."""

    job: int
    segment: Segment
    offsets: list[int]
    handles: list[int]  # packed
    positions: list[int]
    markers: list[int]  # when planned
    payloads: list[bytes | memoryview]

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, job: int, segment: Segment, offsets: list[int], handles: list[int], positions: list[int],
                 markers: list[int], payloads: list[bytes | memoryview]) -> None:
        self.job = job
        self.segment = segment
        self.offsets = offsets
        self.handles = handles
        self.positions = positions
        self.markers = markers
        self.payloads = payloads


class Items:
    """The states and counts of every item of one queue."""

    def __init__(self, config: WorkqConfig) -> None:
        self.config = config
        self.jobs: dict[int, JobCounts] = {}
        self.leases = LeaseTable()
        self.completing: set[int] = set()  # packed handles
        self.stranded = 0  # completing items a flush error left for recovery to settle
        self.item_changes = 0
        self.result_changes = 0

    def counts(self, job: int) -> JobCounts:
        found = self.jobs.get(job)
        if found is None:
            found = self.jobs[job] = JobCounts()
        return found

    def status(self, log: CompletionLog) -> dict[str, int]:
        """A job's counts: enqueued, pending, in_flight, completed, delivered, buried."""
        counts = self.counts(log.job)
        completed = log.completed - counts.completing  # written, but not complete until durable
        return {"enqueued": counts.pending + counts.in_flight + counts.buried + completed,
                "pending": counts.pending, "in_flight": counts.in_flight, "completed": completed,
                "delivered": log.delivered, "buried": counts.buried}

    def totals(self) -> dict[str, int]:
        counts = self.jobs.values()
        return {"pending": sum(c.pending for c in counts), "in_flight": sum(c.in_flight for c in counts),
                "buried": sum(c.buried for c in counts), "leases": len(self.leases),
                "completing": len(self.completing), "stranded": self.stranded}

    def changed(self, *, items: bool = False, results: bool = False) -> None:
        """Items may have become pending (the reconnect window ended) or
        results deliverable (a delivery was dropped): waiting calls retry."""
        self.item_changes += items
        self.result_changes += results

    # ------------------------------------------------------------ arrivals

    def enqueued(self, segment: Segment, job: int, offsets: np.ndarray) -> None:
        """New items, just appended to ``segment``: pending."""
        segment.add_pending(job, int(offsets[0]), len(offsets))
        self.counts(job).pending += len(offsets)
        self.item_changes += 1

    def recovered(self, segment: Segment, job: int, first_live: int, live: int, buried: int) -> None:
        """Start-up: ``live`` LIVE items of ``job`` from ``first_live`` on, and ``buried`` BURIED ones."""
        if live:
            segment.add_pending(job, first_live, live)
        counts = self.counts(job)
        counts.pending += live
        counts.buried += buried

    # ------------------------------------------------------------- leases

    def leased(self, taken: Taken, worker: str, now: float) -> tuple[list[int], list[int]]:
        """A planned dispatch is committed: (packed handles, delivery counts)."""
        segment = taken.segment
        segment.commit_take(taken)
        packed = pack_ints(segment.id, taken.offsets)
        deliveries = self.leases.delivered(packed)
        self.leases.add(segment.id, taken.job, worker, now + self.config.lease_s, packed)
        counts = self.counts(taken.job)
        counts.pending -= len(packed)
        counts.in_flight += len(packed)
        return packed, deliveries

    def adopted(self, segment: Segment, job: int, packed: list[int], worker: str, now: float) -> None:
        """Pending items a reconnecting worker says it holds are leased to it."""
        segment.hold(unpack(np.array(packed, dtype=np.uint64))[1])
        segment.drop_pending(job, len(packed))
        counts = self.counts(job)
        counts.pending -= len(packed)
        counts.in_flight += len(packed)
        for h in packed:
            self.leases.deliveries[h] = max(1, self.leases.deliveries.get(h, 0))
        self.leases.add(segment.id, job, worker, now + self.config.lease_s, packed)

    def released(self, packed: list[int], delay: float, now: float, segments: dict[int, Segment]) -> None:
        """Leased items given back: pending again now, or after ``delay`` s."""
        groups: dict[int, tuple[Lease, list[int]]] = {}
        for h, lease in self.leases.remove(packed):
            groups.setdefault(id(lease), (lease, []))[1].append(h)
        for lease, hs in groups.values():
            if delay > 0:
                self.leases.add(lease.segment, lease.job, None, now + delay, hs)
                counts = self.counts(lease.job)
                counts.in_flight -= len(hs)
                counts.pending += len(hs)
            else:
                self.reclaimed(segments.get(lease.segment), lease, hs)

    def expired(self, now: float, segments: dict[int, Segment]) -> int:
        """Reclaim every lease past its deadline; returns how many items."""
        ended = self.leases.expired(now)
        for lease, packed in ended:
            self.reclaimed(segments.get(lease.segment), lease, packed)
        return sum(len(p) for _, p in ended)

    def reclaimed(self, segment: Segment | None, lease: Lease, packed: list[int]) -> None:
        """Leases ended without a result: pending again, or buried once an
        item was delivered ``max_deliveries`` times."""
        counts = self.counts(lease.job)
        if lease.worker is None:  # a delayed release: already counted pending
            counts.pending -= len(packed)
        else:
            counts.in_flight -= len(packed)
        if segment is None:
            return
        self.item_changes += 1
        offsets = unpack(np.array(packed, dtype=np.uint64))[1]
        limit = self.config.max_deliveries
        worn = np.array([self.leases.deliveries.get(h, 0) >= limit for h in packed], dtype=bool)
        if worn.any():
            segment.journal.set_markers(offsets[worn], Marker.BURIED)
            segment.unhold(offsets[worn])
            counts.buried += int(worn.sum())
        if (~worn).any():
            segment.give_back(lease.job, offsets[~worn])
            counts.pending += int((~worn).sum())

    # ------------------------------------------------------------- burial

    def damaged(self, segment: Segment, offset: int) -> int:
        """A pending item whose payload fails its checksum is buried; returns its job."""
        where = np.array([offset], dtype=np.int64)
        jobs, _, _ = segment.heads_of(where)
        job = int(jobs[0])
        segment.journal.set_markers(where, Marker.BURIED, expect=Marker.LIVE)
        segment.drop_pending(job, 1)
        counts = self.counts(job)
        counts.pending -= 1
        counts.buried += 1
        return job

    def kicked(self, segment: Segment, job: int, offsets: np.ndarray) -> None:
        """Buried items of ``job`` become pending, their delivery counts reset."""
        segment.journal.set_markers(offsets, Marker.LIVE, expect=Marker.BURIED)
        segment.give_back(job, offsets)
        self.leases.forget(pack(segment.id, offsets).tolist())
        counts = self.counts(job)
        counts.buried -= len(offsets)
        counts.pending += len(offsets)
        self.item_changes += 1

    # --------------------------------------------------------- completion

    def began_completing(self, group: Completion) -> None:
        """Results were written: each item leaves its state (leased,
        delayed, pending or buried) until they are durable."""
        counts = self.counts(group.job)
        listed = group.handles
        ended = self.leases.remove(listed)
        delayed = sum(lease.worker is None for _, lease in ended)
        loose = len(listed) - len(ended)  # neither leased nor delayed (a group's handles are distinct)
        buried = self._loose_buried(group, listed, ended) if loose else 0
        pending = loose - buried
        counts.pending -= delayed + pending
        counts.buried -= buried
        counts.in_flight += delayed + pending + buried
        counts.completing += len(listed)
        group.segment.drop_pending(group.job, pending)
        self.completing.update(listed)
        group.segment.hold(group.offsets)

    @staticmethod
    def _loose_buried(group: Completion, listed: list[int], ended: list[tuple[int, Lease]]) -> int:
        """How many of the group's items that were not leased are buried."""
        if BURIED_WORD not in group.markers:  # the usual case
            return 0
        leased = {h for h, _ in ended}
        return sum(h not in leased and marker == BURIED_WORD for h, marker in zip(listed, group.markers))

    def retired(self, group: Completion) -> Ticket:
        """The results are durable: tombstone the inputs in place and retire
        them; returns the tombstones' ticket. A JournalError (the input
        segment failed earlier) changes nothing: see :meth:`stranded`."""
        segment = group.segment
        # completion.plan proved every offset of the group (or found it held: proven before)
        ticket, dead = segment.journal.set_markers_sized(group.offsets, Marker.RETIRED, proven=True)
        segment.unhold(group.offsets)
        segment.dead_bytes += dead
        listed = group.handles
        self.completing.difference_update(listed)
        self.leases.forget(listed)
        counts = self.counts(group.job)
        counts.in_flight -= len(group.offsets)
        counts.completing -= len(group.offsets)
        self.result_changes += 1
        return ticket

    def stranded_by(self, groups: list[Completion], error: Exception) -> None:
        """Completing items whose results may or may not be on disk stay
        completing (never dispatched, never handed out) until a restart."""
        count = sum(len(g.offsets) for g in groups)
        self.stranded += count
        log.error("workq: %d completing items are stranded until a restart: %s", count, error)

    def finished(self, segment: Segment, offsets: np.ndarray, jobs: np.ndarray, markers: np.ndarray) -> Ticket:
        """Start-up: inputs whose result is durable but whose marker is still
        LIVE or BURIED are tombstoned now."""
        ticket, dead = segment.journal.set_markers_sized(offsets, Marker.RETIRED)
        for job in np.unique(jobs).tolist():
            mine = jobs == np.uint64(job)
            live = int((mine & (markers == LIVE)).sum())
            counts = self.counts(job)
            counts.pending -= live
            counts.buried -= int(mine.sum()) - live
            segment.drop_pending(job, live)
        segment.dead_bytes += dead
        return ticket
