"""Retry pauses per piece of work (a shard to upload, its deletes, its
index): after each failure the pause doubles, from ``min_s`` up to
``max_s`` (``upload_retry_min_s``/``upload_retry_max_s`` of NodeConfig); a
success forgets it. Each piece of work that is failing now also keeps a
:class:`Failure` (how many tries in a row, since when, the last error), which
the node's report shows (report.py). Used from one thread (the node's);
:meth:`Backoff.failures` may be read from any thread."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable, Mapping


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """A piece of work failing now: ``tries`` failed in a row, the first at
    ``since`` (wall-clock seconds), the last with ``error``."""

    tries: int
    since: float
    error: str


class Backoff:
    """When each failed piece of work may be tried again."""

    def __init__(self, min_s: float, max_s: float) -> None:
        self.min_s = min_s
        self.max_s = max_s
        self._retry: dict[Hashable, tuple[float, float]] = {}  # key -> (monotonic time it is due, last pause)
        # replaced, never changed in place: a reader on another thread takes one whole snapshot
        self._failures: Mapping[Hashable, Failure] = {}

    def due(self, key: Hashable) -> bool:
        """True unless ``key`` failed and its pause has not passed yet."""
        when, _ = self._retry.get(key, (0.0, 0.0))
        return time.monotonic() >= when

    def failing(self, key: Hashable) -> bool:
        """True if ``key``'s last try failed."""
        return key in self._retry

    def failed(self, key: Hashable, error: str = "") -> float:
        """Note a failure of ``key`` (``error``: what went wrong, shown in the
        node's report); returns the pause before it is due again."""
        _, pause = self._retry.get(key, (0.0, 0.0))
        pause = min(max(pause * 2, self.min_s), self.max_s)
        self._retry[key] = (time.monotonic() + pause, pause)
        before = self._failures.get(key)
        self._failures = {**self._failures, key: Failure(before.tries + 1 if before else 1,
                                                         before.since if before else time.time(), error)}
        return pause

    def succeeded(self, key: Hashable) -> None:
        self._retry.pop(key, None)
        if key in self._failures:
            self._failures = {k: f for k, f in self._failures.items() if k != key}

    def failures(self) -> Mapping[Hashable, Failure]:
        """The pieces of work failing now (a snapshot; safe from any thread)."""
        return self._failures
