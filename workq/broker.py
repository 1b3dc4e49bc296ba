"""The broker: the one API of every queue operation.

Every operation has two forms with the same rules: ``x_async(...)`` returns
a :class:`~concurrent.futures.Future` and never blocks, and ``x(...)``
waits for it and returns plain values (embedded use, ``workq.open``). The
operations a worker or consumer repeats also have ``x_into(answer, ...)``,
which answers into a given Future or :class:`~workq.answer.Callback` (the
network service's: it replies from the callback, without a Future). Each
runs under the owner lock (loop.py), in the order submitted, over the
queue's state (state/): on the calling thread when the lock is free, else
on the thread holding it. Operations that must wait (a durable enqueue, a
completion whose results must be flushed, a lease or results call with
``wait``) park without blocking anyone.

Errors: a future fails with a :mod:`workq.errors` error, a
:class:`~common.wire.errors.ServiceError`, or ``ValueError`` for malformed
arguments (a bad key or job name).

Futures: a caller may cancel one until its operation starts (then nothing
is done); after that it always gets its answer, so no
lease or delivery is made that nobody learns of.

Threads: every method may be called from any thread. Futures' callbacks
run on whichever thread answers (the caller's own, the owner thread, or
the flusher thread right after a flush round): they must not block, and
must not wait for a flush.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from common.journal import Flusher, FlusherConfig
from common.journal.filesystem import make_dirs
from common.journal.lockfile import LockFile
from common.wire.errors import BadRequest, Unavailable

from .answer import Callback, Promise
from .config import WorkqConfig
from .delivery import Delivery
from .enqueues import Enqueue
from .loop import OwnerLoop, Wants, settle
from .protocol import Handle, Item, Key, Leased, Result, pack_handles
from .state import collector, completion, leasing
from .state.dispatch import Filters
from .state.queue import QueueState
from .state.recovery import RecoverySummary, recover
from .state.stats import key_stats, totals

log = logging.getLogger(__name__)

T = TypeVar("T")
Alive = Callable[[], bool]
EMBEDDED = "embedded"  # the worker name of embedded lease calls
MAX_WAIT_S = 3600.0
"""Longest ``wait`` of a lease or results call, in seconds (a long poll; call again to wait longer)."""
MAX_DELAY_S = 7 * 86400.0
"""Longest ``delay`` of a release, in seconds (a week: an item given back must become leasable again)."""


class Broker:
    """A work queue on ``data_dir/workq``. Use :func:`workq.open` or the service."""

    def __init__(self, data_dir: str | Path, config: WorkqConfig | None = None, *,
                 flusher: Flusher | FlusherConfig | None = None, lock: bool = True) -> None:
        """``flusher``: a shared, running Flusher (the server's), or the
        configuration of the broker's own, which it starts and stops
        (default FlusherConfig()). ``lock`` takes the directory's LOCK."""
        self.data_dir = Path(data_dir)
        self.config = (config or WorkqConfig()).validate()
        self._own_flusher = not isinstance(flusher, Flusher)
        self.flusher = flusher if isinstance(flusher, Flusher) else Flusher(flusher or FlusherConfig())
        self._state = QueueState(self.data_dir / "workq", self.config, self.flusher)
        self._lock = LockFile(self.data_dir) if lock else None
        self._loop = OwnerLoop(self.flusher, self._tick, self._changes, self._collect_now,
                               linger=self.config.results_linger_s)
        self.recovery: RecoverySummary | None = None

    # -------------------------------------------------------------- lifecycle

    def open(self) -> Broker:
        """Recover, then start serving: :meth:`recover` and :meth:`start`."""
        self.recover()
        self.start()
        return self

    def recover(self) -> RecoverySummary:
        """Lock the directory (embedded use) and rebuild the state from disk,
        on the calling thread. Nothing is served yet."""
        make_dirs(self._state.root)
        if self._lock is not None:
            self._lock.acquire()
        if self._own_flusher:
            self.flusher.start()
        self.recovery = summary = recover(self._state)
        log.info("workq: recovered %d segments, %d jobs (%d pending, %d buried, %d results; %d completions "
                 "finished) in %.3f s", summary.segments, summary.jobs, summary.pending, summary.buried,
                 summary.results, summary.finished, summary.seconds)
        return summary

    def start(self) -> None:
        """Start the owner thread."""
        self._loop.start()

    def quiesce(self) -> None:
        """Answer every waiting call now, and calls that would wait from now
        on at once (a stop is coming). Everything else keeps working."""
        with contextlib.suppress(Unavailable):
            self._loop.submit(self._loop.quiesce)

    def close(self) -> None:
        """Answer waiting calls, finish or fail what waits for a flush,
        collect finished files, close every journal. Idempotent."""
        if self._loop.closed:
            return
        self._loop.stop()
        self._state.close()
        self._release()

    def abandon(self) -> None:
        """Stop at once, as a crash would: no further flush, files released
        unsynced, waiting calls never answered (crash tests; see testing.py)."""
        if self._loop.closed:
            return
        self._loop.stop(abandon=True)
        if self._own_flusher:
            self.flusher.stop(flush=False)
        self._state.abandon()
        if self._lock is not None:
            self._lock.release()

    def _release(self) -> None:
        if self._own_flusher:
            self.flusher.stop()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- timers

    def _tick(self, now: float) -> None:
        """Owner thread: expire leases, seal and rest idle files, end the
        reconnect window, collect finished files."""
        state = self._state
        state.items.expired(now, state.segments)
        state.seal_idle(now)
        if state.end_window(now):
            log.info("workq: reconnect window over; recovered items are dispatched again")
        collector.collect_segments(state)
        for job_log, seq, ticket in collector.start_logs(state):
            self._loop.after_durable([ticket], functools.partial(collector.finish_log, job_log, seq),
                                     _ledger_failed)

    def _changes(self) -> tuple[int, int]:
        return self._state.items.item_changes, self._state.items.result_changes

    def _collect_now(self) -> None:
        """Owner thread, at a clean stop: collect every finished file,
        waiting for the ledger entries' flush. Runs after the last
        continuations, so the completions they finish count."""
        self.flusher.flush_now()
        collector.collect_segments(self._state)
        started = collector.start_logs(self._state)
        if started:
            self.flusher.flush_now()
        for job_log, seq, ticket in started:
            if ticket.durable:
                collector.finish_log(job_log, seq)

    def tick(self) -> None:
        """Run the timers (expiry, sealing, collection) now and wait for them (tests, operators)."""

        def run(future: Future[None]) -> None:
            self._tick(time.monotonic())
            settle(future)

        self._loop.future(run).result()

    # -------------------------------------------------------------- producers

    def enqueue_async(self, job: str, key: Key, payloads: Sequence[memoryview | bytes],
                      durable: bool = False) -> Future[np.ndarray]:
        """Add one job's tasks for one key; answers their packed handles
        (uint64), in order, at once or, with ``durable``, once the flush
        that covers them completed. Requests that wait in the owner's inbox
        together for one job and key are written as one batch (enqueues.py)."""
        future: Future[np.ndarray] = Future()
        self.enqueue_into(future, job, key, payloads, durable)
        return future

    def enqueue_into(self, answer: Promise[np.ndarray], job: str, key: Key, payloads: Sequence[memoryview | bytes],
                     durable: bool = False) -> None:
        """:meth:`enqueue_async` answering into ``answer`` (answer.py: the service's Callback)."""
        message = Enqueue(self._state, self._loop, job, key, payloads, durable, answer)
        try:
            self._loop.submit(message)
        except Unavailable as exc:
            settle(answer, error=exc)

    def enqueue(self, job: str, model: str, shape: str, lane: str | int, payloads: Sequence[bytes],
                durable: bool = False) -> list[Handle]:
        """Add tasks; returns one handle per payload, in order. With
        ``durable`` it returns after the flush that covers them."""
        packed = self.enqueue_async(job, Key.of(model, shape, lane), payloads, durable).result()
        return [Handle.unpack(h) for h in packed.tolist()]

    def _waiting(self, answer: Promise[T], wants: Wants, max_items: int, wait: float, alive: Alive | None,
                 take: Callable[[bool], T | None], check: Callable[[], object] = lambda: None) -> None:
        """A call that answers what ``take(final)`` finds (None: nothing yet),
        retried whenever what it ``wants`` may have changed for up to
        ``wait`` seconds; at the deadline ``take(True)`` must answer. If
        ``alive()`` turns false meanwhile (nobody is left to answer), the
        call ends with Unavailable, having taken nothing."""
        self._loop.call(lambda future: self._wait_now(future, wants, max_items, wait, alive, take, check), answer)

    def _wait_now(self, future: Promise[T], wants: Wants, max_items: int, wait: float, alive: Alive | None,
                  take: Callable[[bool], T | None], check: Callable[[], object] = lambda: None) -> None:
        """Owner lock: :meth:`_waiting`'s call, begun now."""
        _check_count("max_items", max_items)
        _check_seconds("wait", wait, MAX_WAIT_S)
        check()
        deadline = time.monotonic() + (wait if max_items else 0.0)  # asking for nothing answers at once

        def attempt(final: bool) -> bool:
            if alive is not None and not alive():
                settle(future, error=Unavailable("the caller went away before an answer"))
                return True
            answer = take(final)
            if answer is None:
                return False
            settle(future, answer)
            return True

        self._loop.park(deadline, attempt, wants, lambda exc: settle(future, error=exc), alive)

    # -------------------------------------------------------------- consumers

    def results_async(self, job: str, max_items: int = 1000, wait: float = 0.0, *, max_bytes: int | None = None,
                      alive: Alive | None = None) -> Future[Delivery]:
        """See :meth:`results_into`."""
        future: Future[Delivery] = Future()
        self.results_into(future, job, max_items, wait, max_bytes=max_bytes, alive=alive)
        return future

    def results_into(self, answer: Promise[Delivery], job: str, max_items: int = 1000, wait: float = 0.0, *,
                     max_bytes: int | None = None, alive: Alive | None = None) -> None:
        """Take up to ``max_items`` undelivered, durable results of ``job``
        (payloads plus REPLY_ITEM_BYTES each within ``max_bytes``), waiting
        up to ``wait`` seconds for the first. The caller confirms or drops
        the Delivery (delivery.py). ``alive``: see :meth:`_waiting`. A job
        nothing was enqueued for (yet) has no results: the call waits like
        any other, and answers those of a job enqueued and completed
        meanwhile; asking creates nothing."""

        def take(final: bool) -> Delivery | None:
            job_log, batch = self._state.take_results(job, max_items, max_bytes)  # unknown: a name hash and a dict miss
            return Delivery(self._loop, self._state, job_log, batch) if batch or final else None

        # a malformed name fails at once, not after the wait
        self._waiting(answer, "results", max_items, wait, alive, take, check=lambda: self._state.find_job(job))

    def results(self, job: str, max_items: int = 1000, wait: float = 0.0) -> list[Result]:
        """Undelivered results of the job (at most ``max_items``), waiting up
        to ``wait`` seconds for the first. Returns once they are durably
        marked delivered, so a result returned here is never returned again,
        even after a crash. A job nothing was enqueued for yet has none
        (``[]``, after the wait): a consumer may start before its producer."""
        delivery = self.results_async(job, max_items, wait).result()
        delivery.confirm().result()
        return delivery.results()

    def job_status_async(self, job: str) -> Future[dict[str, int]]:
        return self._loop.future(lambda f: settle(f, self._state.job_status(job)))

    def job_status(self, job: str) -> dict[str, int]:
        """Counts: enqueued, pending, in_flight, completed, delivered, buried.
        A job nothing was enqueued for yet answers all zeros (and is not
        created by asking); a malformed name is a ValueError."""
        return self.job_status_async(job).result()

    # ---------------------------------------------------------------- workers

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
            _check_count("max_items", max_items)  # before anything is written
            _check_seconds("wait", wait, MAX_WAIT_S)

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
            _check_seconds("delay", delay, MAX_DELAY_S)
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

    # --------------------------------------------------------------- operator

    def kick_async(self, job: str) -> Future[int]:
        """Make the job's buried items pending again; answers how many (0
        for a job nothing was enqueued for)."""
        return self._loop.future(lambda f: settle(f, self._state.kick(job)))

    def kick(self, job: str) -> int:
        return self.kick_async(job).result()

    def stats_async(self) -> Future[dict[str, Any]]:
        """``{"totals": {...}, "keys": [...]}``: see state/stats.py."""
        return self._loop.future(lambda f: settle(f, {"totals": totals(self._state),
                                                      "keys": key_stats(self._state)}))

    def stats(self) -> dict[str, Any]:
        return self.stats_async().result()

    def totals_async(self) -> Future[dict[str, int]]:
        """Flat counters (``shardmgr stats``, Prometheus)."""
        return self._loop.future(lambda f: settle(f, totals(self._state)))


def _check_count(name: str, value: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"{name} must be an integer >= 0, got {value!r}")


def _check_seconds(name: str, seconds: float, limit: float) -> None:
    """A wait or delay: a real number of seconds in [0, limit] (NaN, inf and 1e308 are refused)."""
    if (not isinstance(seconds, (int, float, np.integer, np.floating)) or isinstance(seconds, bool)
            or not 0 <= seconds <= limit):  # also NaN
        raise BadRequest(f"{name} must be a number of seconds in 0..{limit:g}, got {seconds!r}")


def _ledger_failed(exc: Exception) -> None:
    log.error("workq: a ledger entry could not be made durable: %s", exc)
