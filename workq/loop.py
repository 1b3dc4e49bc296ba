"""The broker's owner thread: one thread runs every queue operation, in order.

Submitted functions run on the owner thread in the order submitted, so the
queue's state needs no locks. Work that must wait never blocks the thread:

* a *continuation* (:meth:`OwnerLoop.after_durable`) runs once every ticket
  it names is durable; the shared flusher's round listener wakes the loop;
* a *waiter* (:meth:`OwnerLoop.park`) is a call with a deadline (a lease or
  results call with ``wait``) that is tried again whenever what it waits
  for may have changed, and answered at its deadline at the latest; results
  waiters are retried ``linger`` seconds after results changed, so results
  that complete one at a time leave in shared responses;
* timers run every TICK_S between batches of messages; at each tick,
  waiters whose caller went away (``alive``) end at once;
* the replies made while a wake-up's batch runs leave together at its end
  (common/wire/reply_batch.py);
* a run of adjacent :class:`Mergeable` messages of one ``group`` in a
  wake-up's batch runs as one call (``run_many``): many producers'
  one-item enqueues become one append (order is kept: only neighbours merge).

Threads: any thread may submit (``_submit_lock`` makes a submit and a
stop exclusive, so a submitted function either runs or is refused);
everything else runs on the owner thread.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any, Literal, TypeVar

from common.journal import Flusher, Ticket
from common.wire.errors import DurabilityLost, Unavailable
from common.wire.reply_batch import batched_replies

from .answer import Promise

log = logging.getLogger(__name__)

T = TypeVar("T")
P = TypeVar("P", bound=Promise[Any])
TICK_S = 0.25
#: Messages run per wake-up before continuations, timers and waiters run.
BATCH = 1024
Wants = Literal["items", "results"]

_WAKE = object()
_STOP = object()
_ABANDON = object()


class Mergeable:
    """A message that may run together with its like neighbours in the inbox.

    Subclasses set ``group`` (messages merge only with adjacent ones of an
    equal group) and implement ``run_many``; calling one alone runs it as a
    run of one."""

    group: object = None

    def __call__(self) -> None:
        type(self).run_many([self])

    @classmethod
    def run_many(cls, messages: list[Any]) -> None:
        raise NotImplementedError


class _Call:
    """A message that runs ``fn(answer)`` unless the answer was cancelled
    first; what ``fn`` raises answers it."""

    __slots__ = ("fn", "answer")

    def __init__(self, fn: Callable[[Any], None], answer: Promise[Any]) -> None:
        self.fn = fn
        self.answer = answer

    def __call__(self) -> None:
        if not self.answer.set_running_or_notify_cancel():
            return  # cancelled before it started
        try:
            self.fn(self.answer)
        except BaseException as exc:  # delivered to the caller, not lost on the owner thread
            settle(self.answer, error=exc)


@dataclasses.dataclass(slots=True)
class _Continuation:
    tickets: list[Ticket]
    done: Callable[[], None]
    failed: Callable[[Exception], None]


@dataclasses.dataclass(slots=True)
class _Waiter:
    deadline: float
    attempt: Callable[[bool], bool]  # (final) -> answered?
    wants: Wants  # which changes are worth a retry
    fail: Callable[[Exception], None]  # answers the call if an attempt raises
    alive: Callable[[], bool] | None  # False once nobody is left to answer

    def run(self, final: bool) -> bool:
        """One attempt; True once the call is answered (by it or by fail)."""
        try:
            return self.attempt(final)
        except Exception as exc:
            log.exception("workq: a waiting call failed")
            self.fail(exc)
            return True


class OwnerLoop:
    """Runs messages, continuations, waiters and timers on one thread.

    ``tick(now)`` runs the timers; ``changes()`` returns counters that move
    whenever items (first) or results (second) may have become available;
    ``stop()`` runs once on the owner thread at a clean stop.
    """

    def __init__(self, flusher: Flusher, tick: Callable[[float], None], changes: Callable[[], tuple[int, int]],
                 stop: Callable[[], None], linger: float = 0.0) -> None:
        self.flusher = flusher
        self._tick = tick
        self._changes = changes
        self._on_stop = stop
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._continuations: list[_Continuation] = []
        self._waiters: list[_Waiter] = []
        self._thread = threading.Thread(target=self._run, name="workq-owner", daemon=True)
        self._next_tick = 0.0
        self._seen = (-1, -1)  # changes() at the last retry of waiters
        self._linger = linger
        self._results_due: float | None = None  # when results waiters are retried after a change
        self._quiesced = False  # a stop is coming: waiting calls are answered at once
        self._submit_lock = threading.Lock()
        self.closed = False

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.flusher.add_listener(self._flushed)
        self._thread.start()

    def stop(self, *, abandon: bool = False) -> None:
        """Stop the thread: cleanly (waiters answered, continuations run or
        failed, then ``stop``), or, with ``abandon``, at once as a crash would."""
        with self._submit_lock:
            self.closed = True
            self._inbox.put(_ABANDON if abandon else _STOP)
        while self._thread.is_alive():
            self._thread.join(0.2)  # in slices: the main thread may have a signal to handle

    def quiesce(self) -> None:
        """Owner thread: answer every waiting call now (its final attempt),
        and from now on answer calls that would wait at once."""
        self._quiesced = True
        waiting, self._waiters = self._waiters, []
        for waiter in waiting:
            waiter.run(True)

    # ------------------------------------------------------------- submitting

    def submit(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the owner thread (any thread may call this)."""
        with self._submit_lock:
            if self.closed:
                raise Unavailable("the work queue is closed")
            self._inbox.put(fn)

    def future(self, fn: Callable[[Future[T]], None]) -> Future[T]:
        """Run ``fn(future)`` on the owner thread; ``fn`` (or whatever it
        parks) answers the future. An exception ``fn`` raises answers it too.

        As with an executor's futures, the caller may cancel the future
        until ``fn`` starts, and then nothing is done; once it has started,
        ``cancel()`` returns False and the future always gets its answer
        (so no work is done that nobody learns of)."""
        future: Future[T] = Future()
        self.call(fn, future)
        return future

    def call(self, fn: Callable[[P], None], answer: P) -> None:
        """:meth:`future` with the answer's holder given (a Future, or a
        Callback: answer.py); it gets Unavailable at once if the loop is closed."""
        try:
            self.submit(_Call(fn, answer))
        except Unavailable as exc:
            settle(answer, error=exc)

    def after_durable(self, tickets: Sequence[Ticket | None], done: Callable[[], None],
                      failed: Callable[[Exception], None], *, hurry: bool = True) -> None:
        """Owner thread: run ``done`` once every ticket is durable, or
        ``failed`` (DurabilityLost) once one of their journals failed.
        ``hurry``: start a flush round for their journals now (else the
        next timed round covers them)."""
        real = [t for t in tickets if t is not None and not t.durable]
        if not real:
            done()
            return
        self._continuations.append(_Continuation(real, done, failed))
        if hurry:
            self.flusher.hurry([t.journal for t in real])

    def park(self, deadline: float, attempt: Callable[[bool], bool], wants: Wants,
             fail: Callable[[Exception], None], alive: Callable[[], bool] | None = None) -> None:
        """Owner thread: call ``attempt(False)`` now and again whenever what it
        ``wants`` may have changed, until it answers; at ``deadline`` call
        ``attempt(True)``, which must answer. If an attempt raises, ``fail``
        answers the call with the error. Once ``alive()`` is false (checked
        at every tick), ``fail`` answers it with Unavailable."""
        waiter = _Waiter(deadline, attempt, wants, fail, alive)
        if not waiter.run(self._quiesced or deadline <= time.monotonic()):
            self._waiters.append(waiter)

    # ---------------------------------------------------------------- the loop

    def _flushed(self) -> None:
        if self._continuations:
            self._inbox.put(_WAKE)

    def _run(self) -> None:
        while True:
            due = self._results_due if self._results_due is not None else float("inf")
            wait = max(0.0, min(self._next_tick, self._next_waiter(), due) - time.monotonic())
            try:
                batch = [self._inbox.get(timeout=min(wait, TICK_S))]
            except queue.Empty:
                batch = []
            while len(batch) < BATCH:
                try:
                    batch.append(self._inbox.get_nowait())
                except queue.Empty:
                    break
            with batched_replies():  # the batch's replies leave together, one sendmsg per connection
                if not self._run_batch(batch):
                    return

    def _run_batch(self, batch: list[Any]) -> bool:
        """Run one wake-up's messages, then continuations, timers and
        waiters; False once the loop must end."""
        for run in _runs(batch):
            message = run[0]
            if message is _STOP:
                self._stop()
                return False
            if message is _ABANDON:
                return False
            if len(run) > 1:
                self.guarded(functools.partial(type(message).run_many, run))
            elif message is not _WAKE:
                self.guarded(message)
        self._after()
        return True

    def guarded(self, fn: Callable[[], object]) -> None:
        """Run ``fn``, logging (not raising) what it raises."""
        try:
            fn()
        except Exception:
            log.exception("workq: unexpected error on the owner thread")

    def _after(self) -> None:
        """Continuations, timers and waiters, after each batch of messages."""
        self.run_continuations()
        now = time.monotonic()
        if now >= self._next_tick:
            self.guarded(lambda: self._tick(now))
            self._next_tick = now + TICK_S
            self._end_orphans()
        self._serve_waiters(now)

    def _end_orphans(self) -> None:
        """End the waiting calls whose caller went away (a closed connection),
        so they hold nothing until their deadline."""
        orphans = [w for w in self._waiters if w.alive is not None and not w.alive()]
        if orphans:
            self._waiters = [w for w in self._waiters if w.alive is None or w.alive()]
            for waiter in orphans:
                waiter.fail(Unavailable("the caller went away before an answer"))

    def run_continuations(self) -> None:
        """Owner thread: run the continuations whose tickets are durable (or failed)."""
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
                self.guarded(functools.partial(cont.failed, DurabilityLost(str(failed))))
            else:
                self.guarded(cont.done)

    def _next_waiter(self) -> float:
        return min((w.deadline for w in self._waiters), default=float("inf"))

    def _serve_waiters(self, now: float) -> None:
        """Retry waiting calls when what they want changed since the last
        try (results waiters: ``linger`` seconds after), and answer those
        whose deadline passed."""
        if not self._waiters:
            self._results_due = None
            return
        seen = self._changes()
        if seen[1] != self._seen[1] and self._results_due is None:
            self._results_due = now + self._linger
        changed = {"items": seen[0] != self._seen[0],
                   "results": self._results_due is not None and now >= self._results_due}
        if changed["results"]:
            self._results_due = None
        self._seen = seen
        waiting = self._waiters
        self._waiters = []
        for waiter in waiting:
            final = now >= waiter.deadline
            if not (changed[waiter.wants] or final):
                self._waiters.append(waiter)
                continue
            if not waiter.run(final):
                self._waiters.append(waiter)

    def _stop(self) -> None:
        for waiter in self._waiters:
            waiter.run(True)
        self._waiters = []
        self.flusher.flush_now()
        self.run_continuations()
        self.guarded(self._on_stop)
        self.run_continuations()
        closed = Unavailable("the work queue closed before the write was durable")
        for cont in self._continuations:
            self.guarded(functools.partial(cont.failed, closed))
        self._continuations = []


def _runs(batch: list[Any]) -> list[list[Any]]:
    """The batch as runs: adjacent Mergeable messages of one group together, others alone."""
    runs: list[list[Any]] = []
    for message in batch:
        if (isinstance(message, Mergeable) and runs and type(runs[-1][0]) is type(message)
                and runs[-1][0].group == message.group):
            runs[-1].append(message)
        else:
            runs.append([message])
    return runs


def settle(future: Promise[T], value: T | None = None, *, error: BaseException | None = None) -> None:
    """Answer ``future`` unless it is answered already (or was cancelled
    before its operation started: see :meth:`OwnerLoop.future`)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)  # type: ignore[arg-type]
    except InvalidStateError:
        pass
