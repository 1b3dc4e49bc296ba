"""Calls that wait: the machinery the broker's lease and results calls share.

A waiting call answers what its ``take`` finds, tried again whenever what it
waits for may have changed, for up to ``wait`` seconds (loop.py's waiters),
and ends at once if its caller goes away. Its arguments are checked before
anything is taken: a bad count or wait answers BadRequest whatever its
type (the compiled build takes them as ``object`` and checks them here, so
it refuses exactly what the pure-Python modules refuse).

Threads: :meth:`WaitingCalls.begin` from any thread; the rest under the
owner lock (loop.py).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from typing import Final, TypeVar

import numpy as np

from common.wire.errors import BadRequest, Unavailable

from .answer import Promise
from .loop import OwnerLoop, settle
from .waiters import Wants

T = TypeVar("T")
Alive = Callable[[], bool]
MAX_WAIT_S: Final = 3600.0
"""Longest ``wait`` of a lease or results call, in seconds (a long poll; call again to wait longer)."""
MAX_DELAY_S: Final = 7 * 86400.0
"""Longest ``delay`` of a release, in seconds (a week: an item given back must become leasable again)."""


class WaitingCalls:
    """The waiting calls of one owner loop (composed by the broker and its worker side)."""

    def __init__(self, loop: OwnerLoop) -> None:
        self._loop = loop

    def begin(self, answer: Promise[T], wants: Wants, max_items: object, wait: object, alive: Alive | None,
              take: Callable[[int, bool], T | None], check: Callable[[], object] | None = None) -> None:
        """A call that answers what ``take(max_items, final)`` finds (None:
        nothing yet), retried whenever what it ``wants`` may have changed
        for up to ``wait`` seconds; at the deadline ``take(max_items, True)``
        must answer. If ``alive()`` turns false meanwhile (nobody is left to
        answer), the call ends with Unavailable, having taken nothing.
        ``check`` runs first, under the owner lock (what it raises answers)."""
        self._loop.call(lambda future: self.now(future, wants, max_items, wait, alive, take, check), answer)

    def now(self, future: Promise[T], wants: Wants, max_items: object, wait: object, alive: Alive | None,
            take: Callable[[int, bool], T | None], check: Callable[[], object] | None = None) -> None:
        """Owner lock: :meth:`begin`'s call, begun now."""
        limit = check_count("max_items", max_items)
        seconds = check_seconds("wait", wait, MAX_WAIT_S)
        if check is not None:
            check()
        deadline = time.monotonic() + (seconds if limit else 0.0)  # asking for nothing answers at once

        def attempt(final: bool) -> bool:
            if alive is not None and not alive():
                settle(future, error=Unavailable("the caller went away before an answer"))
                return True
            answer = take(limit, final)
            if answer is None:
                return False
            settle(future, answer)
            return True

        self._loop.park(deadline, attempt, wants, lambda exc: settle(future, error=exc), alive)


def check_count(name: str, value: object) -> int:
    """A count: an integer (numpy's too) >= 0, as an int; BadRequest otherwise."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise BadRequest(f"{name} must be an integer >= 0, got {value!r}")
    return operator.index(value)


def check_seconds(name: str, seconds: object, limit: float) -> float:
    """A wait or delay: a real number of seconds in [0, limit] (NaN, inf and 1e308 are refused), as a float."""
    if (not isinstance(seconds, (int, float, np.integer, np.floating)) or isinstance(seconds, bool)
            or not 0 <= seconds <= limit):  # also NaN
        raise BadRequest(f"{name} must be a number of seconds in 0..{limit:g}, got {seconds!r}")
    return float(seconds)
