"""Retry pauses per piece of work (a shard to upload, its deletes, its
index): after each failure the pause doubles, from ``min_s`` up to
``max_s`` (``upload_retry_min_s``/``upload_retry_max_s`` of NodeConfig); a
success forgets it. Used from one thread (the node's)."""

from __future__ import annotations

import time
from collections.abc import Hashable


class Backoff:
    """When each failed piece of work may be tried again."""

    def __init__(self, min_s: float, max_s: float) -> None:
        self.min_s = min_s
        self.max_s = max_s
        self._retry: dict[Hashable, tuple[float, float]] = {}  # key -> (monotonic time it is due, last pause)

    def due(self, key: Hashable) -> bool:
        """True unless ``key`` failed and its pause has not passed yet."""
        when, _ = self._retry.get(key, (0.0, 0.0))
        return time.monotonic() >= when

    def failing(self, key: Hashable) -> bool:
        """True if ``key``'s last try failed."""
        return key in self._retry

    def failed(self, key: Hashable) -> float:
        """Note a failure of ``key``; returns the pause before it is due again."""
        _, pause = self._retry.get(key, (0.0, 0.0))
        pause = min(max(pause * 2, self.min_s), self.max_s)
        self._retry[key] = (time.monotonic() + pause, pause)
        return pause

    def succeeded(self, key: Hashable) -> None:
        self._retry.pop(key, None)
