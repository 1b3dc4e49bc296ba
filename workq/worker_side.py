"""The broker's worker side: hello, lease, complete, release, touch.

These are :class:`~workq.broker.Broker` methods (a mixin); their rules are
in state/leasing.py and state/completion.py, and a worker's lease ends as
described there. ``x_async`` returns a Future, ``x_into`` answers into a
given Future or Callback (answer.py), ``x`` waits (embedded use).

Threads: as the broker's (broker.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from .answer import Callback, Promise
from .calls import MAX_DELAY_S, MAX_WAIT_S, Alive, WaitingCalls, check_count, check_seconds
from .loop import settle
from .protocol import Handle, Item, Leased, pack_handles
from .state import completion, leasing
from .state.dispatch import Filters

EMBEDDED = "embedded"  # the worker name of embedded lease calls


class WorkerSide(WaitingCalls):
    """What a worker asks of the broker (a mixin of :class:`~workq.broker.Broker`)."""

    def hello_async(self, worker: str, held: np.ndarray) -> Future[list[int]]:
        """A (re)connecting worker reports the packed handles it holds:
        unfinished ones are leased to it before it gets anything new; the
        future answers the ones it should drop (done, or someone else's)."""
        return self._loop.future(lambda f: settle(f, leasing.hello(self._state, worker, held.tolist(),
                                                                   time.monotonic())))

    def hello(self, worker: str, held: Sequence[Handle]) -> list[Handle]:
        return [Handle.unpack(h) for h in self.hello_async(worker, pack_handles(held)).result()]

    def worker_gone(self, worker: str) -> None:
        """The worker's connection dropped: its leases end after the grace period."""
        self._loop.submit(lambda: leasing.worker_gone(self._state, worker, time.monotonic()))

    def lease_async(self, worker: str, filters: Filters, max_items: int = 1, wait: float = 0.0, *,
                    max_bytes: int | None = None, alive: Alive | None = None) -> Future[list[Leased]]:
        """See :meth:`lease_into`."""
        future: Future[list[Leased]] = Future()
        self.lease_into(future, worker, filters, max_items, wait, max_bytes=max_bytes, alive=alive)
        return future

    def lease_into(self, answer: Promise[list[Leased]], worker: str, filters: Filters, max_items: int = 1,
                   wait: float = 0.0, *, max_bytes: int | None = None, alive: Alive | None = None) -> None:
        """Lease up to ``max_items`` tasks the worker's ``filters`` match
        (their payloads within ``max_bytes``), waiting up to ``wait``
        seconds for the first. ``alive``: see :meth:`_waiting`."""
        self._waiting(answer, "items", max_items, wait, alive, self._lease_take(worker, filters, max_items, max_bytes))

    def _lease_take(self, worker: str, filters: Filters, max_items: int,
                    max_bytes: int | None) -> Callable[[bool], list[Leased] | None]:
        def take(final: bool) -> list[Leased] | None:
            batches = leasing.lease(self._state, worker, filters, max_items, time.monotonic(), max_bytes)
            return batches if batches or final else None

        return take

    def lease(self, max_items: int = 1, wait: float = 0.0, *, worker: str = EMBEDDED,
              models: Sequence[str] | None = None, shapes: Sequence[str] | None = None,
              lanes: Sequence[str | int] | None = None) -> list[Item]:
        """Lease up to ``max_items`` tasks, waiting up to ``wait`` seconds for the first."""
        batches = self.lease_async(worker, Filters.of(models, shapes, lanes), max_items, wait).result()
        return [item for batch in batches for item in batch.items()]

    def complete_async(self, packed: np.ndarray, results: Sequence[memoryview | bytes],
                       durable: bool = True) -> Future[list[str]]:
        """See :meth:`complete_into`."""
        future: Future[list[str]] = Future()
        self.complete_into(future, packed, results, durable)
        return future

    def complete_into(self, answer: Promise[list[str]], packed: np.ndarray,
                      results: Sequence[memoryview | bytes], durable: bool = True) -> None:
        """Record results for packed handles: 'completed' or 'duplicate' (the
        item already had a result; this one is dropped) per handle, answered
        once the results are durable (completion.py), or with ``durable=False``
        at once (group commit: durable at the next flush round; if the
        broker loses them first, their items are pending again after
        recovery and run again; none ever has two results)."""
        self._loop.call(lambda future: self._complete_now(future, packed, results, durable,
                                                          lambda statuses: settle(future, statuses)), answer)

    def complete_and_lease_into(self, answer: Promise[tuple[list[str], list[Leased]]], worker: str, filters: Filters,
                                packed: np.ndarray, results: Sequence[memoryview | bytes], max_items: int = 1,
                                wait: float = 0.0, *, durable: bool = True, max_bytes: int | None = None,
                                alive: Alive | None = None) -> None:
        """:meth:`complete_into`, then :meth:`lease_into` for the same worker,
        as one call: a worker that takes one item at a time needs one round
        trip per item. The lease begins once the results are durable (at
        once with ``durable=False``). Answers (statuses, leased); if the
        completion fails, nothing is leased and the error is the answer (a
        failed lease after a good completion is the answer too: the results
        stay recorded, and a retried complete answers 'duplicate')."""

        def run(future: Promise[tuple[list[str], list[Leased]]]) -> None:
            check_count("max_items", max_items)  # before anything is written
            check_seconds("wait", wait, MAX_WAIT_S)

            def lease(statuses: list[str]) -> None:
                leased = Callback[list[Leased]](lambda batches: settle(future, (statuses, batches)),
                                                lambda exc: settle(future, error=exc))
                self._wait_now(leased, "items", max_items, wait, alive,
                               self._lease_take(worker, filters, max_items, max_bytes))

            self._complete_now(future, packed, results, durable, lease)

        self._loop.call(run, answer)

    def _complete_now(self, future: Promise[Any], packed: np.ndarray, results: Sequence[memoryview | bytes],
                      durable: bool, then: Callable[[list[str]], None]) -> None:
        """Owner lock: start a completion; ``then(statuses)`` once its results
        are durable (or at once if not ``durable``); an error answers ``future``."""
        plan = completion.start(self._state, completion.plan(self._state, packed, results))

        def answer() -> None:
            if plan.error is None:
                then(plan.statuses)
            else:  # the results written before the failure are complete (once durable)
                settle(future, error=plan.error)

        def done() -> None:
            completion.finish(self._state, plan)
            if durable:
                answer()

        def failed(exc: Exception) -> None:
            completion.abort(self._state, plan, exc)
            if durable:
                settle(future, error=exc)

        self._loop.after_durable(plan.tickets, done, failed, hurry=durable, quick=True)
        if not durable:
            answer()

    def complete(self, handles: Sequence[Handle], results: Sequence[bytes], durable: bool = True) -> list[str]:
        """Record results; returns per handle, once they are durable,
        ``'completed'``, or ``'duplicate'`` if the item already had a result
        (from this or another worker, or earlier in this call): the first
        result is kept, later ones are dropped. A duplicate is not an error;
        a retried call answers it for the items it already recorded::

            broker.complete([h1, h2], [r1, r2])    # ['completed', 'completed']
            broker.complete([h1, h3], [r1, r3])    # ['duplicate', 'completed']
            broker.complete([h4, h4], [r4, r4b])   # ['completed', 'duplicate']: r4 is kept

        With ``durable=False`` it returns at once and the results are durable
        at the next flush round (group commit, as an enqueue's): a crash
        before it may lose them, and their items then run again.
        """
        return self.complete_async(pack_handles(handles), results, durable).result()

    def release_async(self, worker: str, packed: np.ndarray, delay: float = 0.0) -> Future[None]:
        """Give leased items back: pending again after ``delay`` seconds
        (NotLeased, changing nothing, unless ``worker`` holds every one)."""

        def run(future: Future[None]) -> None:
            check_seconds("delay", delay, MAX_DELAY_S)
            leasing.release(self._state, worker, packed.tolist(), delay, time.monotonic())
            settle(future)

        return self._loop.future(run)

    def release(self, handles: Sequence[Handle], delay: float = 0.0, *, worker: str = EMBEDDED) -> None:
        self.release_async(worker, pack_handles(handles), delay).result()

    def touch_async(self, worker: str, packed: np.ndarray) -> Future[None]:
        """Extend leases by a full lease period from now (NotLeased unless ``worker`` holds them)."""

        def run(future: Future[None]) -> None:
            leasing.touch(self._state, worker, packed.tolist(), time.monotonic())
            settle(future)

        return self._loop.future(run)

    def touch(self, handles: Sequence[Handle], *, worker: str = EMBEDDED) -> None:
        self.touch_async(worker, pack_handles(handles)).result()
