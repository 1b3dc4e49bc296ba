"""Items in flight: who holds them, until when, and their delivery counts.

Leases are kept in batches: one :class:`Lease` per dispatched group of
items (one segment, one job, one holder, one deadline), since items are
leased, extended and given back in batches. ``by_handle`` maps each item to
its lease (dict updates run in C), and the expiry heap holds one entry per
lease, not per item. Touching some items of a lease moves them to a new
lease with the new deadline. A lease whose items all ended early (most
do: they complete) stays in the heap until it reaches the top (items
mostly end in the order they were leased, so usually at once) or its
deadline would pop it, so once such entries outnumber the live ones (and
pass :data:`COMPACT_AFTER`) the heap is rebuilt without them: one item
leased per call at thousands a second would otherwise keep every lease of
the last ``lease_s`` seconds in memory behind one long lease.

A lease ends when its item is completed, released, reclaimed after its
deadline, or reclaimed after its worker disconnected for longer than the
grace period. A release with a delay is a lease with no holder that
expires when the delay ends.

Delivery counts live in memory only: after a broker restart they start
again at 0 (1 for items a worker reports back). An item that comes back
after ``max_deliveries`` deliveries is buried.

The table is a data structure: the item-state transitions that use it, and
their counts, are in items.py.

Threads: touched only under the broker's owner lock (workq/loop.py).
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Iterable

COMPACT_AFTER = 4096
"""Ended leases the expiry heap may hold before it is rebuilt without them."""


@dataclasses.dataclass(eq=False, slots=True)
class Lease:
    """Items of one segment and one job, held by one worker until one deadline."""

    segment: int
    job: int
    worker: str | None  # None: released with a delay, held by no one
    deadline: float  # monotonic seconds
    handles: set[int]  # packed

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, segment: int, job: int, worker: str | None, deadline: float, handles: set[int]) -> None:
        self.segment = segment
        self.job = job
        self.worker = worker
        self.deadline = deadline
        self.handles = handles


class LeaseTable:
    """Every lease of one queue: by item, by worker, and by deadline."""

    def __init__(self) -> None:
        self.by_handle: dict[int, Lease] = {}
        self.by_worker: dict[str, set[Lease]] = {}
        self.deliveries: dict[int, int] = {}  # packed handle -> dispatches
        self._heap: list[tuple[float, int, Lease]] = []
        self._ended = 0  # heap entries whose lease has no items left
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self.by_handle)

    def __contains__(self, handle: int) -> bool:
        return handle in self.by_handle

    def add(self, segment: int, job: int, worker: str | None, deadline: float, handles: Iterable[int]) -> Lease:
        """Lease ``handles`` (none may be leased already) as one lease."""
        lease = Lease(segment, job, worker, deadline, set(handles))
        self.by_handle.update(dict.fromkeys(lease.handles, lease))
        if worker is not None:
            self.by_worker.setdefault(worker, set()).add(lease)
        heapq.heappush(self._heap, (deadline, next(self._order), lease))
        return lease

    def remove(self, handles: Iterable[int]) -> list[tuple[int, Lease]]:
        """End the leases of those of ``handles`` that are leased; returns
        (handle, lease it was in) for each."""
        ended = []
        for handle in handles:
            lease = self.by_handle.pop(handle, None)
            if lease is not None:
                lease.handles.discard(handle)
                ended.append((handle, lease))
                if not lease.handles:
                    self._drop(lease)
                    self._ended += 1
        # Items mostly end in the order they were leased, so the lease that just ended is usually the
        # heap's top: popping it now frees it at once, where kept it would live through the garbage
        # collector's young generations (three tracked objects per one-item lease) until compaction.
        self._pop_ended()
        if self._ended > COMPACT_AFTER and 2 * self._ended > len(self._heap):
            self._heap = [entry for entry in self._heap if entry[2].handles]
            heapq.heapify(self._heap)
            self._ended = 0
        return ended

    @property
    def heap_size(self) -> int:
        """Entries in the expiry heap (live leases plus ended ones not yet dropped)."""
        return len(self._heap)

    def _drop(self, lease: Lease) -> None:
        if lease.worker is not None:
            mine = self.by_worker.get(lease.worker)
            if mine is not None:
                mine.discard(lease)
                if not mine:
                    del self.by_worker[lease.worker]

    def extend(self, handles: Iterable[int], deadline: float) -> None:
        """Give leased ``handles`` a new deadline (moving them to a new lease)."""
        moved: dict[int, tuple[Lease, list[int]]] = {}
        for handle, lease in self.remove(handles):
            moved.setdefault(id(lease), (lease, []))[1].append(handle)
        for lease, hs in moved.values():
            self.add(lease.segment, lease.job, lease.worker, deadline, hs)

    def of_worker(self, worker: str) -> list[Lease]:
        return list(self.by_worker.get(worker, ()))

    def expired(self, now: float) -> list[tuple[Lease, list[int]]]:
        """End every lease whose deadline has passed: (lease, its handles)."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            _, _, lease = heapq.heappop(self._heap)
            if not lease.handles:
                self._ended -= 1
                continue
            handles = list(lease.handles)
            for handle in handles:
                del self.by_handle[handle]
            lease.handles = set()
            self._drop(lease)
            out.append((lease, handles))
        return out

    def next_deadline(self) -> float | None:
        self._pop_ended()
        return self._heap[0][0] if self._heap else None

    def _pop_ended(self) -> None:
        """Drop the ended leases at the heap's top."""
        heap = self._heap
        while heap and not heap[0][2].handles:
            heapq.heappop(heap)
            self._ended -= 1

    def delivered(self, handles: list[int]) -> list[int]:
        """Count one more delivery for each handle; return the new counts."""
        # a loop, not Counter.update: that is Python code (run interpreted on every lease)
        counts = self.deliveries
        out = []
        for handle in handles:
            count = counts.get(handle, 0) + 1
            counts[handle] = count
            out.append(count)
        return out

    def forget(self, handles: Iterable[int]) -> None:
        """The items retired: drop their delivery counts."""
        for handle in handles:
            self.deliveries.pop(handle, None)
