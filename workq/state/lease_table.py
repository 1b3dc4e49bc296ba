"""Items in flight: who holds them, until when, and their delivery counts.

LeaseTable are kept in batches: one batch per dispatched group of items (one
segment, one job, one holder, one deadline), since items are leased,
extended and given back in batches. ``by_handle`` maps each item to its
batch (dict updates run in C), and the expiry heap holds one entry per
batch, not per item. Touching some items of a batch moves them to a new
batch with the new deadline.

A lease ends when its item is completed, released, reclaimed after its
deadline, or reclaimed after its worker disconnected for longer than the
grace period. A release with a delay is a batch with no holder that
expires when the delay ends.

Delivery counts live in memory only: after a broker restart they start
again at 0 (1 for items a worker reports back). An item that comes back
after ``max_deliveries`` deliveries is buried.

Threads: owned by the broker's owner thread.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from collections.abc import Iterable


@dataclasses.dataclass(eq=False, slots=True)
class Lease:
    """Items of one segment and one job, held by one worker until one deadline."""

    segment: int
    job: int
    worker: str | None  # None: released with a delay, held by no one
    deadline: float  # monotonic seconds
    handles: set[int]  # packed


class LeaseTable:
    """The lease table."""

    def __init__(self) -> None:
        self.by_handle: dict[int, Lease] = {}
        self.by_worker: dict[str, set[Lease]] = {}
        self.deliveries: collections.Counter[int] = collections.Counter()  # packed handle -> dispatches
        self._heap: list[tuple[float, int, Lease]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self.by_handle)

    def __contains__(self, handle: int) -> bool:
        return handle in self.by_handle

    def add(self, segment: int, job: int, worker: str | None, deadline: float, handles: Iterable[int]) -> Lease:
        """Lease ``handles`` (none may be leased already) as one batch."""
        batch = Lease(segment, job, worker, deadline, set(handles))
        self.by_handle.update(dict.fromkeys(batch.handles, batch))
        if worker is not None:
            self.by_worker.setdefault(worker, set()).add(batch)
        heapq.heappush(self._heap, (deadline, next(self._order), batch))
        return batch

    def remove(self, handles: Iterable[int]) -> list[tuple[int, Lease]]:
        """End the leases of those of ``handles`` that are leased; returns
        (handle, batch it was in) for each."""
        ended = []
        for handle in handles:
            batch = self.by_handle.pop(handle, None)
            if batch is not None:
                batch.handles.discard(handle)
                ended.append((handle, batch))
                if not batch.handles:
                    self._drop_batch(batch)
        return ended

    def _drop_batch(self, batch: Lease) -> None:
        if batch.worker is not None:
            mine = self.by_worker.get(batch.worker)
            if mine is not None:
                mine.discard(batch)
                if not mine:
                    del self.by_worker[batch.worker]

    def extend(self, handles: Iterable[int], deadline: float) -> None:
        """Give leased ``handles`` a new deadline (moving them to a new batch)."""
        moved: dict[int, tuple[Lease, list[int]]] = {}
        for handle, batch in self.remove(handles):
            moved.setdefault(id(batch), (batch, []))[1].append(handle)
        for batch, hs in moved.values():
            self.add(batch.segment, batch.job, batch.worker, deadline, hs)

    def of_worker(self, worker: str) -> list[Lease]:
        return list(self.by_worker.get(worker, ()))

    def expired(self, now: float) -> list[tuple[Lease, list[int]]]:
        """End every lease whose deadline has passed: (batch, its handles)."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            _, _, batch = heapq.heappop(self._heap)
            if not batch.handles:
                continue
            handles = list(batch.handles)
            for handle in handles:
                del self.by_handle[handle]
            batch.handles = set()
            self._drop_batch(batch)
            out.append((batch, handles))
        return out

    def next_deadline(self) -> float | None:
        while self._heap and not self._heap[0][2].handles:
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def delivered(self, handles: list[int]) -> list[int]:
        """Count one more delivery for each handle; return the new counts."""
        self.deliveries.update(handles)
        counts = self.deliveries
        return [counts[h] for h in handles]

    def forget(self, handles: Iterable[int]) -> None:
        """The items retired: drop their delivery counts."""
        for handle in handles:
            self.deliveries.pop(handle, None)
