"""The broker: the one API of every queue operation.

Every operation has two forms with the same rules: ``x_async(...)`` returns
a :class:`~concurrent.futures.Future` and never blocks, and ``x(...)``
waits for it and returns plain values (embedded use, ``workq.open``). The
operations a worker or consumer repeats also have ``x_into(answer, ...)``,
which answers into a given Future or :class:`~workq.answer.Callback` (the
network service's: it replies from the callback, without a Future). The
worker's operations (hello, lease, complete, release, touch) are
:attr:`Broker.workers` (worker_side.py, compiled with the queue's state
machine; the service calls it directly): the broker's methods of those
names delegate to it, and add the plain forms. Each
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

from common.journal import Flusher, FlusherConfig, leader
from common.journal.filesystem import make_dirs
from common.journal.lockfile import LockFile
from common.wire.errors import Unavailable

from .answer import Promise
from .calls import Alive, WaitingCalls
from .config import WorkqConfig
from .delivery import Delivery
from .disk.copies import copy_queue
from .enqueues import Enqueue
from .loop import OwnerLoop, settle
from .protocol import Handle, Item, Key, Leased, Result, pack_handles
from .state import collector
from .state.dispatch import Filters
from .state.queue import QueueState
from .state.recovery import RecoverySummary, recover
from .state.stats import key_stats, totals
from .worker_side import WorkerSide

log = logging.getLogger(__name__)
T = TypeVar("T")
EMBEDDED = "embedded"  # the worker name of embedded lease calls


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
        self._calls = WaitingCalls(self._loop)
        self.workers = WorkerSide(self._state, self._loop, self._calls)
        """What a worker asks: hello, lease, complete, release, touch (worker_side.py)."""
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
        make_dirs(self.data_dir)
        if self._lock is not None:  # first: a directory it refuses (a snapshot cut short) is left as it is
            self._lock.acquire()
        make_dirs(self._state.root)
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

    def frozen(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` under the owner lock (nothing is enqueued, leased,
        completed or delivered meanwhile) and return its result; a snapshot
        flushes and copies the queue's files (:meth:`copy_files`) from there."""

        def run(future: Future[T]) -> None:
            settle(future, fn())

        return self._loop.future(run).result()

    def copy_files(self, dest: Path) -> int:
        """Copy the queue's files to ``dest/workq``; only inside :meth:`frozen`,
        after a flush (disk/copies.py). Returns bytes copied."""
        return copy_queue(self._state.root, self._state.journals(), dest / "workq")

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
        with leader.leading():  # a durable one is synced on this thread when no round runs: no switch
            future = self.enqueue_async(job, Key.of(model, shape, lane), payloads, durable)
        packed = future.result()
        return [Handle.unpack(h) for h in packed.tolist()]

    # ---------------------------------------------------------------- workers
    # The x_async and x_into forms are WorkerSide's (their rules are documented there).

    def hello_async(self, worker: str, held: np.ndarray) -> Future[list[int]]:
        return self.workers.hello_async(worker, held)

    def hello(self, worker: str, held: Sequence[Handle]) -> list[Handle]:
        """A (re)connecting worker reports what it holds; returns the handles
        it should drop (WorkerSide.hello_async)."""
        return [Handle.unpack(h) for h in self.hello_async(worker, pack_handles(held)).result()]

    def worker_gone(self, worker: str) -> None:
        self.workers.worker_gone(worker)

    def lease_async(self, worker: str, filters: Filters, max_items: int = 1, wait: float = 0.0, *,
                    max_bytes: int | None = None, alive: Alive | None = None) -> Future[list[Leased]]:
        return self.workers.lease_async(worker, filters, max_items, wait, max_bytes=max_bytes, alive=alive)

    def lease_into(self, answer: Promise[list[Leased]], worker: str, filters: Filters, max_items: int = 1,
                   wait: float = 0.0, *, max_bytes: int | None = None, alive: Alive | None = None) -> None:
        self.workers.lease_into(answer, worker, filters, max_items, wait, max_bytes=max_bytes, alive=alive)

    def lease(self, max_items: int = 1, wait: float = 0.0, *, worker: str = EMBEDDED,
              models: Sequence[str] | None = None, shapes: Sequence[str] | None = None,
              lanes: Sequence[str | int] | None = None) -> list[Item]:
        """Lease up to ``max_items`` tasks, waiting up to ``wait`` seconds for the first."""
        batches = self.lease_async(worker, Filters.of(models, shapes, lanes), max_items, wait).result()
        return [item for batch in batches for item in batch.items()]

    def complete_async(self, packed: np.ndarray, results: Sequence[memoryview | bytes],
                       durable: bool = True) -> Future[list[str]]:
        return self.workers.complete_async(packed, results, durable)

    def complete_into(self, answer: Promise[list[str]], packed: np.ndarray,
                      results: Sequence[memoryview | bytes], durable: bool = True) -> None:
        self.workers.complete_into(answer, packed, results, durable)

    def complete_and_lease_into(self, answer: Promise[tuple[list[str], list[Leased]]], worker: str, filters: Filters,
                                packed: np.ndarray, results: Sequence[memoryview | bytes], max_items: int = 1,
                                wait: float = 0.0, *, durable: bool = True, max_bytes: int | None = None,
                                alive: Alive | None = None) -> None:
        self.workers.complete_and_lease_into(answer, worker, filters, packed, results, max_items, wait,
                                             durable=durable, max_bytes=max_bytes, alive=alive)

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
        with leader.leading():  # as enqueue's
            future = self.complete_async(pack_handles(handles), results, durable)
        return future.result()

    def release_async(self, worker: str, packed: np.ndarray, delay: float = 0.0) -> Future[None]:
        return self.workers.release_async(worker, packed, delay)

    def release(self, handles: Sequence[Handle], delay: float = 0.0, *, worker: str = EMBEDDED) -> None:
        """Give leased items back: pending again after ``delay`` seconds."""
        self.release_async(worker, pack_handles(handles), delay).result()

    def touch_async(self, worker: str, packed: np.ndarray) -> Future[None]:
        return self.workers.touch_async(worker, packed)

    def touch(self, handles: Sequence[Handle], *, worker: str = EMBEDDED) -> None:
        """Extend leases by a full lease period from now."""
        self.touch_async(worker, pack_handles(handles)).result()

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
        the Delivery (delivery.py). ``alive``: see calls.py. A job
        nothing was enqueued for (yet) has no results: the call waits like
        any other, and answers those of a job enqueued and completed
        meanwhile; asking creates nothing."""

        def take(limit: int, final: bool) -> Delivery | None:
            job_log, batch = self._state.take_results(job, limit, max_bytes)  # unknown: a name hash and a dict miss
            return Delivery(self._loop, self._state, job_log, batch) if batch or final else None

        # a malformed name fails at once, not after the wait
        self._calls.begin(answer, "results", max_items, wait, alive, take, check=lambda: self._state.find_job(job))

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


def _ledger_failed(exc: Exception) -> None:
    log.error("workq: a ledger entry could not be made durable: %s", exc)
