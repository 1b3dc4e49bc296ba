"""Waiting calls: lease and results calls with a deadline, parked on the owner loop.

A waiter is a call (a lease or results call with ``wait``) that could not
be answered at once. It is tried again whenever what it waits for may have
changed, and answered at its deadline at the latest (its *final* attempt,
which must answer):

* ``changes()`` returns two counters that move whenever items (first) or
  results (second) may have become available; a waiter is retried only
  when the counter it ``wants`` moved since the last retry;
* results waiters are retried ``linger`` seconds after results changed,
  not at once, so results that complete one at a time leave in shared
  responses;
* a waiter whose caller went away (``alive()`` false, checked at every
  tick of the owner loop) is answered Unavailable at once, so it holds
  nothing until its deadline;
* once a stop is coming (:meth:`Waiters.quiesce`), every waiter gets its
  final attempt, and calls parked later get it at once.

If an attempt raises, ``fail`` answers the call with the error.

Threads: everything here runs under the owner lock (loop.py).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Literal

from common.wire.errors import Unavailable

log = logging.getLogger(__name__)

Wants = Literal["items", "results"]


@dataclasses.dataclass(slots=True)
class Waiter:
    """One parked call."""

    deadline: float
    attempt: Callable[[bool], bool]  # (final) -> answered?
    wants: Wants  # which changes are worth a retry
    fail: Callable[[Exception], None]  # answers the call if an attempt raises
    alive: Callable[[], bool] | None  # False once nobody is left to answer

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, deadline: float, attempt: Callable[[bool], bool], wants: Wants,
                 fail: Callable[[Exception], None], alive: Callable[[], bool] | None) -> None:
        self.deadline = deadline
        self.attempt = attempt
        self.wants = wants
        self.fail = fail
        self.alive = alive

    def run(self, final: bool) -> bool:
        """One attempt; True once the call is answered (by it or by fail)."""
        try:
            return self.attempt(final)
        except Exception as exc:
            log.exception("workq: a waiting call failed")
            self.fail(exc)
            return True


class Waiters:
    """The owner loop's parked calls (module docstring); owner lock throughout.

    ``due(when)`` tells the loop something is due at ``when`` (it wakes its
    thread if it would sleep past it)."""

    def __init__(self, changes: Callable[[], tuple[int, int]], linger: float,
                 due: Callable[[float], None]) -> None:
        self._changes = changes
        self._linger = linger
        self._due = due
        self._waiting: list[Waiter] = []
        self._seen = (-1, -1)  # changes() at the last retry
        self._results_due: float | None = None  # when results waiters are retried after a change
        self._quiesced = False  # a stop is coming: waiting calls are answered at once

    def park(self, deadline: float, attempt: Callable[[bool], bool], wants: Wants,
             fail: Callable[[Exception], None], alive: Callable[[], bool] | None = None) -> None:
        """Call ``attempt(False)`` now and keep the call waiting unless it
        answered (``attempt(True)`` at once past its deadline or when quiesced)."""
        waiter = Waiter(deadline, attempt, wants, fail, alive)
        if not waiter.run(self._quiesced or deadline <= time.monotonic()):
            self._waiting.append(waiter)
            self._due(deadline)

    def quiesce(self) -> None:
        """Answer every waiting call now (its final attempt), and from now on
        answer calls that would wait at once."""
        self._quiesced = True
        self.finish()

    def finish(self) -> None:
        """Give every waiting call its final attempt now (a stop)."""
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            waiter.run(True)

    def next_due(self) -> float:
        """When the next deadline or results retry falls (inf: none)."""
        due = self._results_due if self._results_due is not None else float("inf")
        return min(due, min((w.deadline for w in self._waiting), default=float("inf")))

    def end_orphans(self) -> None:
        """End the waiting calls whose caller went away (a closed connection),
        so they hold nothing until their deadline."""
        orphans = [w for w in self._waiting if w.alive is not None and not w.alive()]
        if orphans:
            self._waiting = [w for w in self._waiting if w.alive is None or w.alive()]
            for waiter in orphans:
                waiter.fail(Unavailable("the caller went away before an answer"))

    def serve(self, now: float) -> None:
        """Retry waiting calls when what they want changed since the last
        try (results waiters: ``linger`` seconds after), and answer those
        whose deadline passed."""
        if not self._waiting:
            self._results_due = None
            return
        seen = self._changes()
        if seen[1] != self._seen[1] and self._results_due is None:
            self._results_due = now + self._linger
            self._due(self._results_due)
        changed = {"items": seen[0] != self._seen[0],
                   "results": self._results_due is not None and now >= self._results_due}
        if changed["results"]:
            self._results_due = None
        self._seen = seen
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            final = now >= waiter.deadline
            if not (changed[waiter.wants] or final) or not waiter.run(final):
                self._waiting.append(waiter)
