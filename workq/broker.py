"""The broker: the queue's state behind one owner thread.

Every operation runs on the owner thread, in the order submitted, so the
state needs no locks. Operations that must wait (a durable enqueue, a
completion whose results must be flushed, a lease or results call with
``wait``) park a continuation and the owner thread moves on; the shared
flusher's round listener wakes it to run continuations whose tickets are
durable. Timers (lease expiry, the reconnect window, idle sealing,
collection) run between messages.

Embedded use (``workq.open``): the Broker's methods may be called from any
thread; each submits to the owner thread and waits for its answer. The
network service (service.py) submits the same operations with callbacks.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from common.journal import Flusher, FlusherConfig, Ticket
from common.journal.filesystem import make_dirs
from common.journal.lockfile import LockFile
from common.wire.errors import DurabilityLost, Unavailable
from workq.state.dispatch import Filters
from workq.state.queue import JobCounts, Leased, QueueState
from workq.state.recovery import RecoverySummary, recover

from .config import WorkqConfig
from .protocol import Handle, Key
from .state import collector, completion, leasing

log = logging.getLogger(__name__)

TICK_S = 0.25
#: Seconds a finished job's log (nothing pending, in flight or buried, all
#: delivered) stays open before it rests (completions.py).
REST_AFTER_S = 1.0
_WAKE = object()
_STOP = object()
_ABANDON = object()


class Item(NamedTuple):
    """A leased task."""

    handle: Handle
    payload: bytes
    job: str
    key: Key
    position: int
    deliveries: int


class Result(NamedTuple):
    """A completed task's result."""

    handle: Handle
    payload: bytes
    position: int


@dataclasses.dataclass(slots=True)
class _Continuation:
    tickets: list[Ticket]
    done: Callable[[], None]
    failed: Callable[[Exception], None]


@dataclasses.dataclass(slots=True)
class _Waiter:
    deadline: float
    attempt: Callable[[bool], bool]  # (final) -> answered?
    wants: str  # "items" or "results": which changes are worth a retry
    fail: Callable[[Exception], None]  # answers the call if an attempt raises

    def run(self, final: bool) -> bool:
        """One attempt; True once the call is answered (by it or by fail)."""
        try:
            return self.attempt(final)
        except Exception as exc:
            log.exception("workq: a waiting call failed")
            self.fail(exc)
            return True


class Broker:
    """A work queue on ``data_dir/workq``. Use :func:`workq.open` or the service."""

    def __init__(self, data_dir: str | Path, config: WorkqConfig | None = None, *, flusher: Flusher | None = None,
                 lock: bool = True) -> None:
        self.data_dir = Path(data_dir)
        self.config = (config or WorkqConfig()).validate()
        self._own_flusher = flusher is None
        self.flusher = flusher or Flusher(FlusherConfig())
        self.state = QueueState(self.data_dir / "workq", self.config, self.flusher)
        self._lock = LockFile(self.data_dir) if lock else None
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._continuations: list[_Continuation] = []
        self._waiters: list[_Waiter] = []
        self._thread = threading.Thread(target=self._run, name="workq-owner", daemon=True)
        self._next_tick = 0.0
        self._seen = (-1, -1)  # (item_changes, result_changes) at the last retry of waiters
        self._closed = False
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
        make_dirs(self.state.root)
        if self._lock is not None:
            self._lock.acquire()
        if self._own_flusher:
            self.flusher.start()
        self.flusher.add_listener(self._flushed)
        self.recovery = recover(self.state)
        log.info("workq: recovered %d segments, %d jobs (%d pending, %d buried, %d results; %d completions "
                 "finished) in %.3f s", self.recovery.segments, self.recovery.jobs, self.recovery.pending,
                 self.recovery.buried, self.recovery.results, self.recovery.finished, self.recovery.seconds)
        return self.recovery

    def start(self) -> None:
        """Start the owner thread."""
        self._thread.start()

    def close(self) -> None:
        """Fail waiting calls, flush, close every journal. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(_STOP)
        if self._thread.is_alive():
            self._thread.join()
        if self._own_flusher:
            self.flusher.stop()
        if self._lock is not None:
            self._lock.release()

    def abandon(self) -> None:
        """Stop at once, as a crash would: no further flush, files released
        unsynced, waiting calls never answered (crash tests; see testing.py)."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(_ABANDON)
        if self._thread.is_alive():
            self._thread.join()
        if self._own_flusher:
            self.flusher.stop(flush=False)
        for job_log in self.state.logs.values():
            for journal in job_log.segments.values():
                journal.abandon()
        for segment in self.state.segments.values():
            segment.journal.abandon()
        if self.state.catalog is not None:
            self.state.catalog.abandon()
        if self._lock is not None:
            self._lock.release()

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ owner loop

    def submit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the owner thread (any thread may call this)."""
        if self._closed:
            raise Unavailable("the work queue is closed")
        self._inbox.put(fn)

    def call(self, fn: Callable[[Future], None], timeout: float | None = None) -> Any:
        """Run ``fn(future)`` on the owner thread and wait for the future."""
        future: Future = Future()

        def run() -> None:
            try:
                fn(future)
            except BaseException as exc:  # delivered to the caller, not lost on the owner thread
                if not future.done():
                    future.set_exception(exc)

        self.submit(run)
        return future.result(timeout)

    def _flushed(self) -> None:
        if self._continuations:
            self._inbox.put(_WAKE)

    def _run(self) -> None:
        while True:
            wait = max(0.0, min(self._next_tick, self._next_waiter()) - time.monotonic())
            try:
                batch = [self._inbox.get(timeout=min(wait, TICK_S))]
            except queue.Empty:
                batch = []
            while len(batch) < 1024:
                try:
                    batch.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            for message in batch:
                if message is _STOP:
                    self._stop()
                    return
                if message is _ABANDON:
                    return
                if message is not _WAKE:
                    self._guarded(message)
            self._after()

    def _guarded(self, fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception:
            log.exception("workq: unexpected error on the owner thread")

    def _after(self) -> None:
        """Continuations, timers and waiters, after each batch of messages."""
        self._run_continuations()
        now = time.monotonic()
        if now >= self._next_tick:
            self._guarded(lambda: self._tick(now))
            self._next_tick = now + TICK_S
        self._serve_waiters(now)

    def _run_continuations(self) -> None:
        ready = []
        for cont in self._continuations:
            failed = next((t.journal.failed for t in cont.tickets if t.journal.failed is not None), None)
            if failed is not None or all(t.durable for t in cont.tickets):
                ready.append((cont, failed))
        if not ready:
            return
        self._continuations = [c for c in self._continuations if all(c is not r for r, _ in ready)]
        for cont, failed in ready:
            if failed is not None:
                error = DurabilityLost(str(failed))
                self._guarded(functools.partial(cont.failed, error))
            else:
                self._guarded(cont.done)

    def after_durable(self, tickets: Sequence[Ticket | None], done: Callable[[], None],
                      failed: Callable[[Exception], None]) -> None:
        """Owner thread: run ``done`` once every ticket is durable (or ``failed``)."""
        real = [t for t in tickets if t is not None and not t.durable]
        if not real:
            done()
            return
        self._continuations.append(_Continuation(real, done, failed))
        self.flusher.hurry()

    def _tick(self, now: float) -> None:
        state = self.state
        leasing.expire(state, now)
        for segments in state.keys.values():
            active = segments[-1]
            if not active.journal.sealed and now - active.last_append > self.config.idle_seal_s:
                active.journal.seal()
        for job_log in state.logs.values():
            if job_log.rested is not None:
                continue
            journal = job_log.active
            if not journal.sealed and journal.count and now - job_log.last_append > self.config.idle_seal_s:
                journal.seal()
            elif job_log.restable(now, REST_AFTER_S if state.counts.setdefault(job_log.job, JobCounts()).idle
                                  else self.config.idle_seal_s):
                job_log.rest()
        if state.window_ends and now >= state.window_ends:
            state.window_ends = 0.0
            state.item_changes += 1
            log.info("workq: reconnect window over; recovered items are dispatched again")
        collector.collect_segments(state)
        for job_log, seq, ticket in collector.start_logs(state):
            self.after_durable([ticket], functools.partial(collector.finish_log, job_log, seq), self._log_failure)

    def tick(self) -> None:
        """Run the timers (expiry, sealing, collection) now and wait for them (tests, operators)."""

        def run(future: Future) -> None:
            self._tick(time.monotonic())
            future.set_result(None)

        self.call(run)

    @staticmethod
    def _log_failure(exc: Exception) -> None:
        log.error("workq: a ledger entry could not be made durable: %s", exc)

    def park(self, deadline: float, attempt: Callable[[bool], bool], wants: str,
             fail: Callable[[Exception], None]) -> None:
        """Owner thread: call ``attempt(False)`` now and again whenever what it
        ``wants`` ("items" or "results") may have changed, until it answers;
        at ``deadline`` call ``attempt(True)``, which must answer. If an
        attempt raises, ``fail`` answers the call with the error."""
        waiter = _Waiter(deadline, attempt, wants, fail)
        if not waiter.run(deadline <= time.monotonic()):
            self._waiters.append(waiter)

    def _next_waiter(self) -> float:
        return min((w.deadline for w in self._waiters), default=float("inf"))

    def _serve_waiters(self, now: float) -> None:
        """Retry waiting calls when the state changed since the last try, and
        answer those whose deadline passed."""
        if not self._waiters:
            return
        changed = {"items": self.state.item_changes != self._seen[0],
                   "results": self.state.result_changes != self._seen[1]}
        self._seen = (self.state.item_changes, self.state.result_changes)
        waiting = self._waiters
        self._waiters = []
        for waiter in waiting:
            final = now >= waiter.deadline
            if not (changed[waiter.wants] or final):
                self._waiters.append(waiter)
                continue
            if not waiter.run(final):
                self._waiters.append(waiter)

    def _collect_now(self) -> None:
        """Owner thread: collect every finished segment, waiting for the
        ledger entries' flush. Runs after the last continuations, so the
        completions they finish count (their tombstones flushed first)."""
        self.flusher.flush_now()
        collector.collect_segments(self.state)
        started = collector.start_logs(self.state)
        if started:
            self.flusher.flush_now()
        for job_log, seq, ticket in started:
            if ticket.durable:
                collector.finish_log(job_log, seq)

    def _stop(self) -> None:
        for waiter in self._waiters:
            waiter.run(True)
        self._waiters = []
        self.flusher.flush_now()
        self._run_continuations()
        self._guarded(self._collect_now)  # a clean stop leaves no finished segment for verify to report
        self._run_continuations()
        closed = Unavailable("the work queue closed before the write was durable")
        for cont in self._continuations:
            self._guarded(functools.partial(cont.failed, closed))
        for job_log in self.state.logs.values():
            for journal in job_log.segments.values():
                journal.close()
        for segment in self.state.segments.values():
            segment.journal.close()
        if self.state.catalog is not None:
            self.state.catalog.close()

    # ------------------------------------------------------------ embedded API

    def enqueue(self, job: str, model: str, shape: str, lane: str | int, payloads: Sequence[bytes],
                durable: bool = False) -> list[Handle]:
        """Add tasks; returns one handle per payload, in order. With
        ``durable`` it returns after the flush that covers them."""
        key = Key.of(model, shape, lane)

        def run(future: Future) -> None:
            packed, ticket = self.state.enqueue(job, key, list(payloads))
            answer = [Handle.unpack(h) for h in packed.tolist()]
            if durable:
                self.after_durable([ticket], lambda: future.set_result(answer), future.set_exception)
            else:
                future.set_result(answer)

        return self.call(run)

    def job_status(self, job: str) -> dict[str, int]:
        """Counts: enqueued, pending, in_flight, completed, delivered, buried."""
        return self.call(lambda f: f.set_result(self.state.job_status(job)))

    def results(self, job: str, max_items: int = 1000, wait: float = 0.0) -> list[Result]:
        """Undelivered results of the job (at most ``max_items``), waiting up
        to ``wait`` seconds for the first. Returns once they are durably
        marked delivered, so a result returned here is never returned again,
        even after a crash."""

        def run(future: Future) -> None:
            def attempt(final: bool) -> bool:
                job_log, batch = self.state.take_results(job, max_items)
                if not batch and not final:
                    return False
                tickets = self.state.confirm_results(job_log, batch)
                answer = [Result(Handle.unpack(h), bytes(p), pos) for out in batch for h, p, pos in
                          zip(out.handles.tolist(), out.payloads, out.positions.tolist())]
                self.after_durable(tickets, lambda: future.set_result(answer), future.set_exception)
                return True

            self.state.job(job)  # unknown job: fail now, not after the wait
            self.park(time.monotonic() + max(0.0, wait), attempt, "results", future.set_exception)

        return self.call(run)

    def lease(self, max_items: int = 1, wait: float = 0.0, *, worker: str = "embedded",
              models: Sequence[str] | None = None, shapes: Sequence[str] | None = None,
              lanes: Sequence[str | int] | None = None) -> list[Item]:
        """Lease up to ``max_items`` tasks, waiting up to ``wait`` seconds for the first."""
        filters = Filters.of(models, shapes, lanes)

        def run(future: Future) -> None:
            self.park(time.monotonic() + max(0.0, wait),
                      lambda final: self.try_lease(worker, filters, max_items, final, future.set_result),
                      "items", future.set_exception)

        batches: list[Leased] = self.call(run)
        return [Item(Handle.unpack(h), bytes(p), b.job, b.key, pos, d) for b in batches for h, p, pos, d in
                zip(b.handles.tolist(), b.payloads, b.positions.tolist(), b.deliveries.tolist())]

    def try_lease(self, worker: str, filters: Filters, limit: int, final: bool,
                  answer: Callable[[list[Leased]], None], max_bytes: int | None = None) -> bool:
        """Owner thread: lease now if anything is available (or ``final``)."""
        batches = leasing.lease(self.state, worker, filters, limit, time.monotonic(), max_bytes)
        if batches or final:
            answer(batches)
            return True
        return False

    def complete(self, handles: Sequence[Handle], results: Sequence[bytes]) -> list[str]:
        """Record results; returns 'completed' or 'duplicate' per handle, once durable."""
        packed = np.array([Handle(*h).packed for h in handles], dtype=np.uint64)

        def run(future: Future) -> None:
            self.complete_async(packed, list(results), future.set_result, future.set_exception)

        return self.call(run)

    def complete_async(self, packed: np.ndarray, results: list, answer: Callable[[list[str]], None],
                       fail: Callable[[Any], None]) -> None:
        """Owner thread: plan, start and, once durable, finish a completion."""
        plan = completion.start(self.state, completion.plan(self.state, packed, results))

        def done() -> None:
            statuses = completion.finish(self.state, plan)
            if plan.error is None:
                answer(statuses)
            else:  # the results written before the failure are complete now
                fail(plan.error)

        def failed(exc: Exception) -> None:
            completion.abort(self.state, plan, exc)
            fail(exc)

        self.after_durable(plan.tickets, done, failed)

    def release(self, handles: Sequence[Handle], delay: float = 0.0, *, worker: str = "embedded") -> None:
        """Give leased items back (pending again after ``delay`` seconds)."""
        packed = [Handle(*h).packed for h in handles]

        def run(future: Future) -> None:
            leasing.release(self.state, worker, packed, delay, time.monotonic())
            future.set_result(None)

        self.call(run)

    def touch(self, handles: Sequence[Handle], *, worker: str = "embedded") -> None:
        """Extend leases by a full lease period from now."""
        packed = [Handle(*h).packed for h in handles]

        def run(future: Future) -> None:
            leasing.touch(self.state, worker, packed, time.monotonic())
            future.set_result(None)

        self.call(run)

    def kick(self, job: str) -> int:
        """Make the job's buried items pending again; returns how many."""
        return self.call(lambda f: f.set_result(self.state.kick(job)))
