"""The queue's totals for ``stats`` and Prometheus, and what they are when the owner cannot answer.

The totals (state/stats.py) are computed on the owner thread. When it does
not answer within STATS_WAIT_S (a snapshot holding the queue frozen while it
copies, a long batch, a stuck owner) or is closed (a scrape during the
stop), :meth:`TotalsReader.read` answers the last totals it had, marked
``stats_stale`` 1 with ``stats_age_seconds`` (how old they are), rather than
nothing: the queue's metrics do not go blank, and an alert on
``stats_stale`` says why they stopped moving. ``stats_failures_total``
counts the reads that were not answered. The first failure of an episode is
logged (WARNING, with the reason); the first answer after it ends the
episode (INFO). While a read is unanswered the next ones wait for the same
answer, at most STALE_WAIT_S each, so a long freeze neither stacks requests
on the owner nor holds every scrape for STATS_WAIT_S. An answer that comes
after every read waiting for it gave up is not served as fresh by the next
read, however long ago it was computed: that read keeps it as the last
totals known (aged from when the owner computed them) and asks again, so a
fresh answer is always one computed during the read that returns it.

Threads: any (the ``stats`` command's connection threads, the metrics
port's); ``_lock`` guards the reader's state, never held while waiting.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Final

from common.wire.errors import Unavailable

log = logging.getLogger(__name__)

STATS_WAIT_S: Final = 10.0
"""Longest a read waits for the owner thread's totals before answering the last ones, stale."""
STALE_WAIT_S: Final = 0.2
"""Longest a read waits while the totals are stale already (the owner has not answered an earlier read)."""

Totals = dict[str, float | int]


class _Asked:
    """One request for the totals, and when its answer was computed (set on the thread that answered)."""

    def __init__(self, future: Future[dict[str, int]]) -> None:
        self.future = future
        self.answered_at: float | None = None  # time.monotonic()
        future.add_done_callback(self._answered)  # (at once if done already)

    def _answered(self, _: Future[dict[str, int]]) -> None:
        self.answered_at = time.monotonic()


class TotalsReader:
    """Reads the totals through ``ask`` (the broker's ``totals_async``); see the module docstring."""

    def __init__(self, ask: Callable[[], Future[dict[str, int]]]) -> None:
        self._ask = ask
        #: STATS_WAIT_S; tests shorten it
        self.wait_s = STATS_WAIT_S
        self._lock = threading.Lock()
        self._pending: _Asked | None = None  # asked, not taken by a read yet
        self._last: dict[str, int] | None = None
        self._last_at = 0.0  # time.monotonic() when _last was computed
        self._failures = 0
        self._stale_since: float | None = None  # the episode's first failure

    def read(self) -> Totals:
        """The totals now, or the last ones marked stale (module docstring); never raises."""
        with self._lock:
            late = self._pending
            if late is not None and late.future.done():  # answered after its read gave up: old news now
                self._pending = None
                self._keep(late)
            if self._pending is None:
                try:
                    self._pending = _Asked(self._ask())
                except Exception as exc:  # closed: Unavailable at once
                    return self._stale(exc)
            asked = self._pending
            wait = self.wait_s if self._stale_since is None else min(self.wait_s, STALE_WAIT_S)
        try:
            totals = asked.future.result(timeout=wait)
        except Exception as exc:  # TimeoutError: still unanswered, and waited for by the next read
            with self._lock:
                if asked.future.done() and self._pending is asked:
                    self._pending = None
                return self._stale(exc)
        with self._lock:
            if self._pending is asked:
                self._pending = None
            now = time.monotonic()
            if self._stale_since is not None:
                log.info("workq: stats answered again after %.1f s of stale totals", now - self._stale_since)
                self._stale_since = None
            self._last, self._last_at = dict(totals), asked.answered_at or now
            return {**totals, "stats_stale": 0, "stats_age_seconds": round(max(0.0, now - self._last_at), 3),
                    "stats_failures_total": self._failures}

    def _keep(self, late: _Asked) -> None:
        """Keep a late answer's totals as the last known, with the time they were computed (under ``_lock``)."""
        answered = not late.future.cancelled() and late.future.exception() is None
        if answered and late.answered_at is not None and late.answered_at > self._last_at:
            self._last, self._last_at = dict(late.future.result()), late.answered_at

    def _stale(self, exc: Exception) -> Totals:
        """The last totals, marked stale; logs the first failure of an episode (under ``_lock``)."""
        now = time.monotonic()
        self._failures += 1
        if self._stale_since is None:
            self._stale_since = now
            expected = isinstance(exc, (TimeoutError, Unavailable))
            why = f"did not answer within {self.wait_s:g} s" if isinstance(exc, TimeoutError) else \
                f"failed: {type(exc).__name__}: {exc}"
            log.log(logging.WARNING if expected else logging.ERROR,
                    "workq: stats: the queue's owner thread %s; answering %s, marked stale (stats_stale 1) "
                    "until it answers again", why,
                    "no totals (none read yet)" if self._last is None else
                    f"the totals of {now - self._last_at:.1f} s ago", exc_info=None if expected else exc)
        known: Totals = {"stats_stale": 1, "stats_failures_total": self._failures}
        if self._last is not None:
            known = {**self._last, **known, "stats_age_seconds": round(now - self._last_at, 3)}
        return known
