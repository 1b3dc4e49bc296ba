"""Calls that wait: the machinery the broker's lease and results calls share.

A waiting call answers what its ``take`` finds, tried again whenever what it
waits for may have changed, for up to ``wait`` seconds (loop.py's waiters),
and ends at once if its caller goes away. Its arguments are checked before
anything is taken.

Threads: as the broker's (broker.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from common.wire.errors import BadRequest, Unavailable

from .answer import Promise
from .loop import OwnerLoop, settle
from .state.queue import QueueState
from .waiters import Wants

T = TypeVar("T")
Alive = Callable[[], bool]
MAX_WAIT_S = 3600.0
"""Longest ``wait`` of a lease or results call, in seconds (a long poll; call again to wait longer)."""
MAX_DELAY_S = 7 * 86400.0
"""Longest ``delay`` of a release, in seconds (a week: an item given back must become leasable again)."""


class WaitingCalls:
    """The broker's waiting calls (a mixin over its state and owner loop)."""

    _state: QueueState
    _loop: OwnerLoop

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
        check_count("max_items", max_items)
        check_seconds("wait", wait, MAX_WAIT_S)
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


def check_count(name: str, value: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"{name} must be an integer >= 0, got {value!r}")


def check_seconds(name: str, seconds: float, limit: float) -> None:
    """A wait or delay: a real number of seconds in [0, limit] (NaN, inf and 1e308 are refused)."""
    if (not isinstance(seconds, (int, float, np.integer, np.floating)) or isinstance(seconds, bool)
            or not 0 <= seconds <= limit):  # also NaN
        raise BadRequest(f"{name} must be a number of seconds in 0..{limit:g}, got {seconds!r}")
