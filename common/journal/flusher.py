"""Group commit: one background thread makes every open journal durable.

Every ``interval`` the flusher runs a *round*: for each registered journal
with writes since its last sync it snapshots the journal's write sequence,
calls fdatasync, then advances the journal's durable watermark to that
snapshot and writes a checkpoint (made durable by the journal's next sync,
which a round starts for it alone only after syncer.CHECKPOINT_LAG_S). A write
is therefore durable once the first round that *starts after it* completes.
When someone waits for durability (:meth:`Flusher.wait_durable`,
:meth:`Flusher.hurry`) a round starts at once instead of at the end of the
interval: a lone writer waits for one fdatasync, not an interval, while
concurrent writers still share rounds (group commit). Such a *hurried*
round syncs only the journals someone waits for; the timed rounds, every
``interval``, sync every journal with writes, so no write waits longer for
its flush than it did before (a queue that retires items one at a time
would otherwise fdatasync every journal it touched, tombstones and delivery
marks nobody waits for, once per item).

A thread that waits for a write (:meth:`Flusher.wait_durable`), or that
answers a durable call before it next blocks (a connection's reader:
leader.py), runs a hurried round *itself* when no round is running: the
write, its fdatasync and the reply then happen on one thread, as Redis
``appendfsync always`` does them, instead of costing two thread switches
(waking the flusher thread, then the answering thread) per durable call.
While a round runs (on any thread), others hand their journals to the
flusher thread, whose next round they then share (group commit as before).

Threads: one round at a time, on the flusher thread or on a waiting
thread, under ``_round_lock``; the flusher thread waits for it, a waiting
thread only tries it. No waiting thread starts a round once :meth:`stop`
was called, and stop returns only after a round under way on one ended,
its listeners included (the flusher thread's last round waits for it), so
a power-cut test's disk is frozen from then on. A journal serialises its
own explicit syncs (e.g. on seal) against rounds with a per-journal lock.
Any thread may call
:meth:`Flusher.wait_durable`, :meth:`Flusher.sync_here` or
:meth:`Flusher.flush_now`.

An fdatasync error is fatal for that journal only: it is logged, no ticket
of that journal at or after the failed round is ever confirmed, and every
waiter on it receives :class:`~common.errors.FlushFailed`.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from ..wakeup import Wakeup
from .config import FlusherConfig
from .errors import FlushFailed, JournalClosed

log = logging.getLogger(__name__)


class Journal(Protocol):
    """What the flusher and a ticket's holder use of a journal: journal.py's
    ``Journal`` (a protocol, not that class, so that this module, compiled,
    needs no import of journal.py, which imports it)."""

    path: Path
    closed: bool

    @property
    def durable_seq(self) -> int: ...

    @property
    def failed(self) -> FlushFailed | None: ...

    def raise_if_failed(self) -> None: ...

    def sync_for_flusher(self, lazy: bool = True) -> bool: ...

    def wait_durable(self, ticket: Ticket, timeout: float | None = None) -> None: ...

    def flush(self, timeout: float | None = None) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Ticket:
    """Names a write: it is durable once ``journal``'s watermark reaches ``seq``."""

    journal: Journal
    seq: int

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, journal: Journal, seq: int) -> None:
        object.__setattr__(self, "journal", journal)
        object.__setattr__(self, "seq", seq)

    @property
    def durable(self) -> bool:
        return self.journal.durable_seq >= self.seq


@dataclasses.dataclass(slots=True)
class FlusherStats:
    """Counters since the flusher started (read without locking)."""

    rounds: int = 0
    here: int = 0
    """Of the rounds, those run by a waiting thread (:meth:`Flusher.sync_here`)."""
    syncs: int = 0
    failures: int = 0
    last_round_seconds: float = 0.0
    max_round_seconds: float = 0.0

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, rounds: int = 0, here: int = 0, syncs: int = 0, failures: int = 0,
                 last_round_seconds: float = 0.0, max_round_seconds: float = 0.0) -> None:
        self.rounds = rounds
        self.here = here
        self.syncs = syncs
        self.failures = failures
        self.last_round_seconds = last_round_seconds
        self.max_round_seconds = max_round_seconds


class Flusher:
    """The shared group-commit thread. Start it before opening journals."""

    def __init__(self, config: FlusherConfig | None = None) -> None:
        self.config = (config or FlusherConfig()).validate()
        self.stats = FlusherStats()
        self._journals: dict[int, Journal] = {}
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()  # a plain lock: its ``with`` is C, a Condition's is Python code
        self._cond = threading.Condition(self._lock)
        self._sleepers = 0  # threads in _cond.wait (guarded by _lock): notified only if any
        self._wake = Wakeup()
        self.changes = 0
        """Moments since the start when tickets may have become durable or
        journals failed: every round, every out-of-round sync, failure or
        close (:meth:`notify`); it moves after their effect is visible and
        before the listeners run. Owners that check many tickets after every
        request skip the check while it stands still. Written under
        ``_lock``, read without it."""
        self._started_rounds = 0  # rounds begun (guarded by _lock)
        self._done_rounds = 0  # rounds finished (guarded by _lock)
        self._stopping = False  # stop() was called (guarded by _lock)
        self._finished = False  # the last round is done (guarded by _lock)
        self._skip_last = False  # stop(flush=False): no last round (guarded by _lock)
        self._round_lock = threading.Lock()  # held while a round runs, on whichever thread (stats too)
        self._hurried: dict[int, Journal] = {}  # journals waited for before the next round (guarded by _lock)
        self._hurry_all = False  # the next round syncs every journal, timed or not (guarded by _lock)
        self._round_thread: threading.Thread | None = None

    def __enter__(self) -> Flusher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Flusher:
        if self._round_thread is None:
            self._round_thread = threading.Thread(target=self._run, name="journal-flusher", daemon=True)
            self._round_thread.start()
        return self

    def stop(self, flush: bool = True) -> None:
        """End the thread after a last round. Journals stay open.

        ``flush=False`` skips that round: writes not yet durable stay so
        (crash tests use it to freeze the disk before a simulated power cut).
        A stopped flusher cannot be restarted.
        """
        with self._lock:
            self._stopping = True
            self._skip_last = not flush
        self._wake.set()
        if self._round_thread is not None:
            self._round_thread.join()

    @property
    def running(self) -> bool:
        """True from start() until the last round after stop() finished."""
        return self._round_thread is not None and not self._finished

    def register(self, journal: Journal) -> None:
        with self._lock:
            self._journals[id(journal)] = journal

    def unregister(self, journal: Journal) -> None:
        with self._lock:
            self._journals.pop(id(journal), None)
            self._notify_sleepers()

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the flusher thread) after every round that
        synced something, and after out-of-round syncs. It must be quick:
        owners use it to post a wake-up to their own thread."""
        with self._lock:
            self._listeners.append(callback)

    def hurry(self, journals: Iterable[Journal] | None = None) -> None:
        """Someone waits for durability: start a round now instead of at the
        end of the interval (a round already running finishes first; writes
        arriving meanwhile share the following round). The round syncs
        ``journals`` (the ones waited for) or, if None, every journal."""
        with self._lock:
            if journals is None:
                self._hurry_all = True
            else:
                self._hurried.update((id(j), j) for j in journals)
        self._wake.set()

    def sync_here(self, journals: Iterable[Journal]) -> bool:
        """Run a hurried round for ``journals`` on this thread, now, unless a
        round is running or the flusher is stopping or stopped: False then
        (:meth:`hurry` them instead: they share the flusher thread's next
        round). Blocks for the round's fdatasyncs. Waiters and listeners
        hear of it as of any round; the listeners run on this thread, before
        the round ends for :meth:`stop` (nothing of it runs after a stop)."""
        if not self._round_lock.acquire(blocking=False):
            return False
        try:
            with self._lock:
                if self._stopping or not self.running:
                    return False
                mine = [j for j in journals if id(j) in self._journals]
            synced = self._timed_round(mine, lazy=True)
            self.stats.here += 1
            self._round_done(synced)
        finally:
            self._round_lock.release()
        return True

    def notify(self) -> None:
        """Wake waiters: a journal synced outside a round, failed or closed."""
        with self._lock:
            self.changes += 1
            self._notify_sleepers()
            listeners = list(self._listeners)
        self._call(listeners)

    @staticmethod
    def _call(listeners: list[Callable[[], None]]) -> None:
        for listener in listeners:
            try:
                listener()
            except Exception:  # a listener bug must not stop the flusher
                log.exception("flusher listener failed")

    def wait_durable(self, ticket: Ticket, timeout: float | None = None) -> None:
        """Block until a completed flush covers ``ticket``.

        Without a timeout, the round runs on this thread if none is running
        (:meth:`sync_here`). Raises FlushFailed if the journal's durability was lost first,
        JournalClosed if it was closed before the write became durable, and
        TimeoutError after ``timeout`` seconds.
        """
        journal = ticket.journal
        deadline = None if timeout is None else time.monotonic() + timeout
        # Without a timeout, the round may run here (no thread switch); with one, a round here could outlast it.
        if journal.durable_seq < ticket.seq and not (timeout is None and self.sync_here([journal])):
            self.hurry([journal])
        with self._lock:
            while journal.durable_seq < ticket.seq:
                journal.raise_if_failed()
                if journal.closed:
                    raise JournalClosed(f"{journal.path} was closed before write {ticket.seq} was durable")
                if not self.running:
                    raise JournalClosed("the flusher is stopped: no write will become durable")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"write {ticket.seq} to {journal.path} not durable after {timeout} s")
                self._sleep(remaining)

    def flush_now(self, timeout: float | None = None) -> None:
        """Start a round at once and wait for it: every write made before
        this call is then durable (or its journal has failed)."""
        with self._lock:
            if not self.running:
                raise JournalClosed("the flusher is not running: nothing can be flushed")
            target = self._started_rounds + 1
            self._hurry_all = True  # the round it waits for syncs every journal
            self._wake.set()
            if not self._sleep(timeout, lambda: self._done_rounds >= target or not self.running):
                raise TimeoutError(f"flush round not finished after {timeout} s")

    def _sleep(self, timeout: float | None, until: Callable[[], bool] | None = None) -> bool:
        """Under ``_lock``: wait for the next notify, or with ``until`` until it
        holds; False if ``timeout`` seconds passed first (as Condition.wait_for)."""
        self._sleepers += 1
        try:
            return self._cond.wait(timeout) if until is None else self._cond.wait_for(until, timeout)
        finally:
            self._sleepers -= 1

    def _notify_sleepers(self) -> None:
        """Under ``_lock``: wake the waiters, if any (``notify_all`` is Python
        code, run on every round and every out-of-round sync otherwise)."""
        if self._sleepers:
            self._cond.notify_all()

    def _run(self) -> None:
        interval = self.config.interval
        next_round = time.monotonic()
        while True:
            delay = next_round - time.monotonic()
            if delay > 0:
                self._wake.wait(delay)
            self._wake.clear()
            with self._lock:
                stopping = self._stopping
                self._started_rounds += 1
                timed = self._hurry_all or stopping or time.monotonic() >= next_round
                if self._skip_last:
                    journals = []
                elif timed:
                    journals = list(self._journals.values())
                else:  # hurried: only what someone waits for (and is still registered)
                    journals = [j for key, j in self._hurried.items() if key in self._journals]
                self._hurried.clear()
                self._hurry_all = False
            started = time.monotonic()
            with self._round_lock:
                synced = self._timed_round(journals, lazy=not stopping)
            with self._lock:
                self._done_rounds += 1
                self._finished = stopping
            self._round_done(synced)
            if stopping:
                return
            if timed:
                next_round = started + interval

    def _round_done(self, synced: bool) -> None:
        """After a round, on the thread that ran it: waiters and listeners hear."""
        with self._lock:
            self.changes += 1
            self._notify_sleepers()
            listeners = list(self._listeners) if synced else []
        self._call(listeners)

    def _timed_round(self, journals: list[Journal], lazy: bool) -> bool:
        """Under ``_round_lock``: :meth:`_round`, counted in the stats."""
        started = time.monotonic()
        synced = self._round(journals, lazy)
        elapsed = time.monotonic() - started
        self.stats.rounds += 1
        self.stats.last_round_seconds = elapsed
        self.stats.max_round_seconds = max(self.stats.max_round_seconds, elapsed)
        return synced

    def _round(self, journals: list[Journal], lazy: bool) -> bool:
        """Under ``_round_lock``: sync each journal; True if any fdatasync
        was issued or a journal failed (the listeners must hear either)."""
        any_synced = False
        for journal in journals:
            was_failed = journal.failed is not None
            try:
                synced = journal.sync_for_flusher(lazy)
            except Exception:  # a bug in one journal must not stop durability for the rest
                log.exception("flusher: unexpected error syncing %s", journal.path)
                synced = False
            self.stats.syncs += synced
            any_synced |= bool(synced)
            if journal.failed is not None and not was_failed:
                self.stats.failures += 1
                any_synced = True  # waiters must hear about the failure too
        return any_synced
