"""The broker's owner: one thread of control runs every queue operation, in order.

Submitted functions run in the order submitted, one at a time, under the
owner lock, so the queue's state needs no other locks. Whoever submits runs
the inbox itself when the owner lock is free (a connection's reader thread,
an embedded caller): a single-item request then costs no hand-off to another
thread and no wake-up (two thread switches that cost more than the request).
When the lock is busy, the message waits in the inbox; the thread holding
the lock runs at most one batch of it, and the owner *thread* runs the rest,
besides what nobody else does: timers, deadlines, continuations that may
wait for a flush, and the stop.

Work that must wait never blocks the owner:

* a *continuation* (:meth:`OwnerLoop.after_durable`) runs once every ticket
  it names is durable: the shared flusher's round listener runs it on the
  flusher thread if the owner lock is free, else wakes the owner thread;
* a *waiter* (:meth:`OwnerLoop.park`) is a call with a deadline (a lease or
  results call with ``wait``) that is tried again whenever what it waits
  for may have changed, and answered at its deadline at the latest
  (waiters.py);
* timers run every TICK_S; at each tick, waiters whose caller went away
  (``alive``) end at once;
* the replies made while one batch of messages runs leave together at its
  end (common/wire/reply_batch.py);
* a run of adjacent :class:`Mergeable` messages of one ``group`` in a batch
  runs as one call (``run_many``): many producers' one-item enqueues become
  one append (order is kept: only neighbours merge).

Threads: any thread may submit (``_submit_lock`` makes a submit and a stop
exclusive, so a submitted function either runs or is refused); the inbox is
taken from only under the owner lock (``_lock``), and everything the loop
runs runs under it. Only the owner thread ever waits for ``_lock``; others
try it without blocking, so a submitter holding its own locks cannot
deadlock with the owner. Code running under the lock that submits again
(nested) finds the lock taken: its message runs after the current batch.
The stop runs on the owner thread, after every message submitted before it.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any, Final, TypeVar

from common.journal import Flusher, Ticket, leader
from common.wakeup import Wakeup
from common.wire.errors import DurabilityLost, Unavailable
from common.wire.reply_batch import batched_replies

from .answer import Promise
from .waiters import Waiters, Wants

log = logging.getLogger(__name__)

T = TypeVar("T")
P = TypeVar("P", bound=Promise[Any])
TICK_S = 0.25
#: Messages run per batch before continuations, timers and waiters run.
BATCH: Final = 1024

_STOP: Final = object()
_ABANDON: Final = object()


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
    quick: bool  # may run on the flusher thread (it never waits for a flush)

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, tickets: list[Ticket], done: Callable[[], None], failed: Callable[[Exception], None],
                 quick: bool) -> None:
        self.tickets = tickets
        self.done = done
        self.failed = failed
        self.quick = quick


class OwnerLoop:
    """Runs messages, continuations, waiters and timers, one at a time, under one lock.

    ``tick(now)`` runs the timers; ``changes()`` returns counters that move
    whenever items (first) or results (second) may have become available;
    ``stop()`` runs once on the owner thread at a clean stop.
    """

    def __init__(self, flusher: Flusher, tick: Callable[[float], None], changes: Callable[[], tuple[int, int]],
                 stop: Callable[[], None], linger: float = 0.0) -> None:
        self.flusher = flusher
        self._tick = tick
        self._on_stop = stop
        self._inbox: collections.deque[Any] = collections.deque()
        self._lock = threading.Lock()  # the owner lock: held while anything of the loop runs
        self._wake = Wakeup()  # the owner thread has something to do (or a sooner deadline)
        self._sleep_until = 0.0  # when the sleeping owner thread wakes by itself
        self._continuations: list[_Continuation] = []
        self._checked = -1  # the flusher's changes at the last full check of the continuations
        self._waiters = Waiters(changes, linger, self._due)
        self._owner_thread = threading.Thread(target=self._run, name="workq-owner", daemon=True)
        self._next_tick = 0.0
        self._submit_lock = threading.Lock()
        self.closed = False

    # -------------------------------------------------------------- lifecycle

    def start(self) -> None:
        self.flusher.add_listener(self._flushed)
        self._owner_thread.start()

    def stop(self, *, abandon: bool = False) -> None:
        """Stop the owner: cleanly (what was submitted runs, waiters are
        answered, continuations run or fail, then ``stop``), or, with
        ``abandon``, at once as a crash would."""
        with self._submit_lock:
            self.closed = True
            self._inbox.append(_ABANDON if abandon else _STOP)
        self._wake.set()
        while self._owner_thread.is_alive():
            self._owner_thread.join(0.2)  # in slices: the main thread may have a signal to handle

    def quiesce(self) -> None:
        """Owner lock: answer every waiting call now (its final attempt),
        and from now on answer calls that would wait at once."""
        self._waiters.quiesce()

    # ------------------------------------------------------------- submitting

    def submit(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` under the owner lock, after everything submitted before
        it: here and now if the lock is free (with what waits before it, one
        batch at most), else by the lock's holder or the owner thread (any
        thread may call this; it never waits for the lock)."""
        with self._submit_lock:
            if self.closed:
                raise Unavailable("the work queue is closed")
            self._inbox.append(fn)
        if not self._lock.acquire(blocking=False):
            return  # the holder sees it when it lets go (below)
        try:
            self._drain()
        finally:
            self._lock.release()
        if self._inbox:
            # Submitted while this thread held the lock (or a stop): the owner
            # thread runs it. A submitter runs one batch at most, so its own
            # connection's replies are never held up behind others' requests.
            self._wake.set()

    def future(self, fn: Callable[[Future[T]], None]) -> Future[T]:
        """Run ``fn(future)`` under the owner lock; ``fn`` (or whatever it
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
                      failed: Callable[[Exception], None], *, hurry: bool = True, quick: bool = False) -> None:
        """Owner lock: run ``done`` once every ticket is durable, or
        ``failed`` (DurabilityLost) once one of their journals failed.
        ``hurry``: start a flush round for their journals now (else the
        next timed round covers them). ``quick``: the continuation never
        waits for a flush (it answers calls), so the flusher thread may run
        it right after the round; others run on the owner thread."""
        real = [t for t in tickets if t is not None and not t.durable]
        if not real:
            done()
            return
        self._continuations.append(_Continuation(real, done, failed, quick))
        if hurry:  # a connection's reader syncs them itself after this request, when it can (leader.py)
            leader.hurry(self.flusher, [t.journal for t in real])

    def park(self, deadline: float, attempt: Callable[[bool], bool], wants: Wants,
             fail: Callable[[Exception], None], alive: Callable[[], bool] | None = None) -> None:
        """Owner lock: call ``attempt(False)`` now and again whenever what it
        ``wants`` may have changed, until it answers; at ``deadline`` call
        ``attempt(True)``, which must answer. If an attempt raises, ``fail``
        answers the call with the error. Once ``alive()`` is false (checked
        at every tick), ``fail`` answers it with Unavailable (waiters.py)."""
        self._waiters.park(deadline, attempt, wants, fail, alive)

    def _due(self, when: float) -> None:
        """Owner lock: something is due at ``when``; wake the owner thread
        if it would sleep past it."""
        if when < self._sleep_until:
            self._wake.set()

    # ---------------------------------------------------------------- the loop

    def _flushed(self) -> None:
        """Flusher thread, after a round: run what the round made due here
        when the owner lock is free (no wake-up of the owner thread, which
        costs more than a reply), else leave it to the owner thread. Never
        runs the inbox: a flush round must not wait behind big requests."""
        if not self._continuations:
            return
        if not self._lock.acquire(blocking=False):
            self._wake.set()
            return
        try:
            with batched_replies():  # nothing that may wait for a flush round here: it is this thread's
                others = self.run_continuations(quick_only=True)
                self._waiters.serve(time.monotonic())
        finally:
            self._lock.release()
        if others or self._inbox:  # the owner thread runs the rest, and what arrived meanwhile
            self._wake.set()

    def _run(self) -> None:
        """The owner thread: sleep until woken or something is due, then run
        the inbox (or at least the timers and waiters) under the lock."""
        while True:
            with self._lock:
                self._sleep_until = min(self._next_tick, self._waiters.next_due(), time.monotonic() + TICK_S)
            if not self._inbox:  # a submitter that found the lock held left its message to this thread
                self._wake.wait(max(0.0, self._sleep_until - time.monotonic()))
            self._wake.clear()
            with self._lock:
                self._sleep_until = 0.0  # awake: nobody needs to wake it
                while True:
                    front = self._inbox[0] if self._inbox else None
                    if front is _STOP:
                        self._stop()
                        return
                    if front is _ABANDON:
                        return
                    self._drain()
                    if not self._inbox:
                        break

    def _drain(self) -> None:
        """Owner lock: run up to BATCH messages from the inbox (not past a
        stop), then continuations, timers and waiters."""
        batch: list[Any] = []
        while self._inbox and len(batch) < BATCH:
            front = self._inbox[0]
            if front is _STOP or front is _ABANDON:
                break
            batch.append(self._inbox.popleft())
        with batched_replies():  # the batch's replies leave together, one sendmsg per connection
            for run in _runs(batch):
                if len(run) > 1:
                    self.guarded(functools.partial(type(run[0]).run_many, run))
                else:
                    self.guarded(run[0])
            self._after()

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
            self._waiters.end_orphans()
        self._waiters.serve(now)

    def run_continuations(self, *, quick_only: bool = False, force: bool = False) -> bool:
        """Owner lock: run the continuations whose tickets are durable (or
        failed); with ``quick_only``, only quick ones. True if others are due.
        It runs after every request: unless ``force``, the check is skipped
        while the flusher's ``changes`` stand where the last full check saw
        them (a continuation is added only while its tickets are not durable,
        so none can have become due)."""
        changes = self.flusher.changes  # before the check: a change during it makes the next one look again
        if not (quick_only or force) and changes == self._checked:
            return False
        ready, later, left = [], [], False
        for cont in self._continuations:
            failed = next((t.journal.failed for t in cont.tickets if t.journal.failed is not None), None)
            if failed is None and not all(t.durable for t in cont.tickets):
                later.append(cont)
            elif quick_only and not cont.quick:
                later.append(cont)
                left = True
            else:
                ready.append((cont, failed))
        if not quick_only:
            self._checked = changes
        if not ready:
            return left
        self._continuations = later
        for cont, failed in ready:
            if failed is not None:
                self.guarded(functools.partial(cont.failed, DurabilityLost(str(failed))))
            else:
                self.guarded(cont.done)
        return left

    def _stop(self) -> None:
        """Owner thread, at a clean stop: answer the waiters, flush, run the
        continuations, then ``stop``; continuations still not durable fail."""
        self._waiters.finish()
        self.flusher.flush_now()
        self.run_continuations(force=True)
        self.guarded(self._on_stop)
        self.run_continuations(force=True)  # closing may sync without telling the flusher
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
