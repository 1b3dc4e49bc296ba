"""Items in flight: who holds each one, until when, and its delivery count.

A lease is created when an item is dispatched (or reported by a worker that
reconnects) and ends when the item is completed, released, reclaimed
after its deadline, or reclaimed after its worker disconnected for longer
than the grace period. A release with a delay is kept here too, with no
holder, until the delay ends.

Delivery counts live in memory only: after a broker restart they start
again at 0 (1 for items a worker reports back). An item that comes back
after ``max_deliveries`` deliveries is buried.

Threads: owned by the broker's owner thread.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable


@dataclasses.dataclass(slots=True)
class Lease:
    handle: int  # packed
    segment: int
    offset: int
    job: int
    worker: str | None  # None: released with a delay, not held by anyone
    deadline: float  # monotonic seconds


class Leases:
    """The lease table with an expiry heap (lazy deletion)."""

    def __init__(self) -> None:
        self.by_handle: dict[int, Lease] = {}
        self.by_worker: dict[str, set[int]] = {}
        self.deliveries: dict[int, int] = {}  # packed handle -> times dispatched (until retired)
        self._heap: list[tuple[float, int]] = []

    def __len__(self) -> int:
        return len(self.by_handle)

    def __contains__(self, handle: int) -> bool:
        return handle in self.by_handle

    def add(self, lease: Lease) -> None:
        self.remove(lease.handle)
        self.by_handle[lease.handle] = lease
        if lease.worker is not None:
            self.by_worker.setdefault(lease.worker, set()).add(lease.handle)
        heapq.heappush(self._heap, (lease.deadline, lease.handle))

    def remove(self, handle: int) -> Lease | None:
        lease = self.by_handle.pop(handle, None)
        if lease is not None and lease.worker is not None:
            held = self.by_worker.get(lease.worker)
            if held is not None:
                held.discard(handle)
                if not held:
                    del self.by_worker[lease.worker]
        return lease

    def extend(self, handle: int, deadline: float) -> None:
        lease = self.by_handle[handle]
        lease.deadline = deadline
        heapq.heappush(self._heap, (deadline, handle))

    def of_worker(self, worker: str) -> list[Lease]:
        return [self.by_handle[h] for h in self.by_worker.get(worker, ())]

    def expired(self, now: float) -> list[Lease]:
        """Remove and return every lease whose deadline has passed."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            deadline, handle = heapq.heappop(self._heap)
            lease = self.by_handle.get(handle)
            if lease is not None and lease.deadline == deadline:
                self.remove(handle)
                out.append(lease)
        if len(self._heap) > 4 * len(self.by_handle) + 1024:  # drop stale heap entries now and then
            self._heap = [(lease.deadline, h) for h, lease in self.by_handle.items()]
            heapq.heapify(self._heap)
        return out

    def next_deadline(self) -> float | None:
        while self._heap:
            deadline, handle = self._heap[0]
            lease = self.by_handle.get(handle)
            if lease is not None and lease.deadline == deadline:
                return deadline
            heapq.heappop(self._heap)
        return None

    def delivered(self, handles: Iterable[int]) -> list[int]:
        """Count one more delivery for each handle; return the new counts."""
        counts = []
        for handle in handles:
            count = self.deliveries.get(handle, 0) + 1
            self.deliveries[handle] = count
            counts.append(count)
        return counts

    def forget(self, handles: Iterable[int]) -> None:
        """The items retired: drop their delivery counts."""
        for handle in handles:
            self.deliveries.pop(handle, None)
