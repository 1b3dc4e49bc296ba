"""The broker's worker side: hello, lease, complete, release, touch.

:class:`WorkerSide` is composed by :class:`~workq.broker.Broker` (its
``workers``) over the broker's state and owner loop; the network service
calls it directly, and the broker's methods of the same names delegate to
it (the plain forms that wait for their answer, for embedded use, are the
broker's). Their rules are in state/leasing.py and state/completion.py,
and a worker's lease ends as described there. ``x_async`` returns a
Future, ``x_into`` answers into a given Future or Callback (answer.py).

Counts, byte limits and seconds a caller gives are taken as ``object`` and
checked (calls.py), so a bad one answers BadRequest in both builds, and
``durable`` is any truth value.

Threads: every method may be called from any thread; what it does runs
under the owner lock (loop.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from .answer import Callback, Promise
from .calls import MAX_DELAY_S, MAX_WAIT_S, Alive, WaitingCalls, check_count, check_seconds
from .loop import OwnerLoop, settle
from .protocol import Leased
from .state import completion, leasing
from .state.dispatch import Filters
from .state.queue import QueueState


class WorkerSide:
    """What a worker asks of the broker, over its state and owner loop."""

    def __init__(self, state: QueueState, loop: OwnerLoop, calls: WaitingCalls) -> None:
        self._state = state
        self._loop = loop
        self._calls = calls

    def hello_async(self, worker: str, held: np.ndarray) -> Future[list[int]]:
        """A (re)connecting worker reports the packed handles it holds:
        unfinished ones are leased to it before it gets anything new; the
        future answers the ones it should drop (done, or someone else's)."""
        state = self._state
        return self._loop.future(lambda f: settle(f, leasing.hello(state, worker, held.tolist(), time.monotonic())))

    def worker_gone(self, worker: str) -> None:
        """The worker's connection dropped: its leases end after the grace period."""
        state = self._state
        self._loop.submit(lambda: leasing.worker_gone(state, worker, time.monotonic()))

    def lease_async(self, worker: str, filters: Filters, max_items: object = 1, wait: object = 0.0, *,
                    max_bytes: object = None, alive: Alive | None = None) -> Future[list[Leased]]:
        """See :meth:`lease_into`."""
        future: Future[list[Leased]] = Future()
        self.lease_into(future, worker, filters, max_items, wait, max_bytes=max_bytes, alive=alive)
        return future

    def lease_into(self, answer: Promise[list[Leased]], worker: str, filters: Filters, max_items: object = 1,
                   wait: object = 0.0, *, max_bytes: object = None, alive: Alive | None = None) -> None:
        """Lease up to ``max_items`` tasks the worker's ``filters`` match
        (their payloads within ``max_bytes``), waiting up to ``wait``
        seconds for the first. ``alive``: see WaitingCalls.begin."""
        self._calls.begin(answer, "items", max_items, wait, alive, self._lease_take(worker, filters, max_bytes))

    def _lease_take(self, worker: str, filters: Filters,
                    max_bytes: object) -> Callable[[int, bool], list[Leased] | None]:
        state = self._state

        def take(limit: int, final: bool) -> list[Leased] | None:
            within = None if max_bytes is None else check_count("max_bytes", max_bytes)
            batches = leasing.lease(state, worker, filters, limit, time.monotonic(), within)
            return batches if batches or final else None

        return take

    def complete_async(self, packed: list[int] | np.ndarray, results: Sequence[memoryview | bytes],
                       durable: object = True) -> Future[list[str]]:
        """See :meth:`complete_into`."""
        future: Future[list[str]] = Future()
        self.complete_into(future, packed, results, durable)
        return future

    def complete_into(self, answer: Promise[list[str]], packed: list[int] | np.ndarray,
                      results: Sequence[memoryview | bytes], durable: object = True) -> None:
        """Record results for packed handles: 'completed' or 'duplicate' (the
        item already had a result; this one is dropped) per handle, answered
        once the results are durable (completion.py), or with ``durable=False``
        at once (group commit: durable at the next flush round; if the
        broker loses them first, their items are pending again after
        recovery and run again; none ever has two results)."""
        self._loop.call(lambda future: self._complete_now(future, packed, results, durable,
                                                          lambda statuses: settle(future, statuses)), answer)

    def complete_and_lease_into(self, answer: Promise[tuple[list[str], list[Leased]]], worker: str, filters: Filters,
                                packed: list[int] | np.ndarray, results: Sequence[memoryview | bytes],
                                max_items: object = 1,
                                wait: object = 0.0, *, durable: object = True, max_bytes: object = None,
                                alive: Alive | None = None) -> None:
        """:meth:`complete_into`, then :meth:`lease_into` for the same worker,
        as one call: a worker that takes one item at a time needs one round
        trip per item. The lease begins once the results are durable (at
        once with ``durable=False``). Answers (statuses, leased); if the
        completion fails, nothing is leased and the error is the answer (a
        failed lease after a good completion is the answer too: the results
        stay recorded, and a retried complete answers 'duplicate')."""
        take = self._lease_take(worker, filters, max_bytes)

        def run(future: Promise[tuple[list[str], list[Leased]]]) -> None:
            check_count("max_items", max_items)  # before anything is written
            check_seconds("wait", wait, MAX_WAIT_S)

            def lease(statuses: list[str]) -> None:
                leased = Callback[list[Leased]](lambda batches: settle(future, (statuses, batches)),
                                                lambda exc: settle(future, error=exc))
                self._calls.now(leased, "items", max_items, wait, alive, take)

            self._complete_now(future, packed, results, durable, lease)

        self._loop.call(run, answer)

    def _complete_now(self, future: Promise[Any], packed: list[int] | np.ndarray,
                      results: Sequence[memoryview | bytes], durable: object,
                      then: Callable[[list[str]], None]) -> None:
        """Owner lock: start a completion; ``then(statuses)`` once its results
        are durable (or at once if not ``durable``); an error answers ``future``."""
        state = self._state
        durable = bool(durable)  # any truth value, as the pure module takes it; before anything is written
        plan = completion.start(state, completion.plan(state, packed, results))
        done, failed = _answering(state, plan, future, then) if durable else _finishing(state, plan)
        self._loop.after_durable(plan.tickets, done, failed, hurry=durable, quick=True)
        if not durable:
            _answer(future, plan, then)

    def release_async(self, worker: str, packed: np.ndarray, delay: object = 0.0) -> Future[None]:
        """Give leased items back: pending again after ``delay`` seconds
        (NotLeased, changing nothing, unless ``worker`` holds every one)."""
        state = self._state

        def run(future: Future[None]) -> None:
            seconds = check_seconds("delay", delay, MAX_DELAY_S)
            leasing.release(state, worker, packed.tolist(), seconds, time.monotonic())
            settle(future)

        return self._loop.future(run)

    def touch_async(self, worker: str, packed: np.ndarray) -> Future[None]:
        """Extend leases by a full lease period from now (NotLeased unless ``worker`` holds them)."""
        state = self._state

        def run(future: Future[None]) -> None:
            leasing.touch(state, worker, packed.tolist(), time.monotonic())
            settle(future)

        return self._loop.future(run)


def _answering(state: QueueState, plan: completion.CompletionPlan, future: Promise[Any],
               then: Callable[[list[str]], None]) -> tuple[Callable[[], None], Callable[[Exception], None]]:
    """The continuation of a durable completion: finish it, then answer."""
    def done() -> None:
        completion.finish(state, plan)
        _answer(future, plan, then)

    def failed(exc: Exception) -> None:
        completion.abort(state, plan, exc)
        settle(future, error=exc)

    return done, failed


def _finishing(state: QueueState, plan: completion.CompletionPlan) -> tuple[Callable[[], None],
                                                                            Callable[[Exception], None]]:
    """The continuation of a completion answered before its flush (group
    commit): it holds the plan and nothing of the call, so the request, its
    frame and its answer are freed at once, not kept until the round."""
    def done() -> None:
        completion.finish(state, plan)

    def failed(exc: Exception) -> None:
        completion.abort(state, plan, exc)

    return done, failed


def _answer(future: Promise[Any], plan: completion.CompletionPlan, then: Callable[[list[str]], None]) -> None:
    """Answer a started completion: its statuses, or the error that cut it
    short (the results written before the failure complete once durable)."""
    if plan.error is None:
        then(plan.statuses)
    else:
        settle(future, error=plan.error)
