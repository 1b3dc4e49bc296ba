"""Making one journal file durable: fdatasync, then a checkpoint.

A sync notes the newest write (its sequence number) and the state to record
(end, count, counters, sealed), calls fdatasync on the journal's companion
data files and then on the journal, and only then advances the durable
watermark to that write. If the state differs from the newest
checkpoint, it writes a new checkpoint into the *other* slot; the next sync
makes that checkpoint durable in turn. So a checkpoint never describes
anything that is not already durable, and a torn checkpoint write always
leaves the previous one intact.

An OSError from fdatasync or from the checkpoint write is fatal: ``failed``
is set, never cleared, and no later write is ever confirmed (see "fsyncgate":
after a failed fsync the kernel may have dropped the dirty pages, so a retry
that succeeds proves nothing).

Threads: callers hold ``lock`` around :meth:`sync` and around closing the
file descriptor, which keeps syncs from touching a closed (reused) fd.
``durable_seq`` and ``failed`` may be read from any thread.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from .errors import FlushFailed
from .header import SLOT_OFFSETS, Checkpoint

log = logging.getLogger(__name__)


class Syncer:
    """The durability state of one journal file."""

    def __init__(self, path: Path, fd: int, checkpoint: Checkpoint, slot: int,
                 on_change: Callable[[], None]) -> None:
        self.lock = threading.Lock()
        self.durable_seq = 0
        self.failed: FlushFailed | None = None
        self._path = path
        self._fd = fd
        self._checkpoint = checkpoint  # the newest checkpoint written
        self._slot = slot  # the slot holding it
        self._unsynced = False  # it was written but not yet fdatasync'd
        self._on_change = on_change  # wakes durable waiters
        self.companions: list[int] = []  # data files synced before the journal (see Journal.add_companion)

    @property
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    def sync(self, seq: int, state: Checkpoint) -> bool:
        """Make writes up to ``seq`` durable and record ``state`` (whose
        generation is ignored). Returns True if fdatasync was called."""
        if self.failed is not None:
            return False
        changed = not state.same_state(self._checkpoint)
        if seq == self.durable_seq and not self._unsynced and not changed:
            return False
        try:
            for fd in self.companions:
                os.fdatasync(fd)
            os.fdatasync(self._fd)
        except OSError as exc:
            self.fail(exc, "fdatasync")
            return False
        self.durable_seq = seq
        self._unsynced = False
        if changed:
            state = Checkpoint(self._checkpoint.generation + 1, state.end, state.count, state.counters,
                               state.sealed)
            slot = 1 - self._slot
            try:
                os.pwrite(self._fd, state.encode(), SLOT_OFFSETS[slot])
            except OSError as exc:
                self.fail(exc, "writing the checkpoint")
                return True
            self._checkpoint, self._slot, self._unsynced = state, slot, True
        return True

    def fail(self, exc: OSError | None, during: str) -> None:
        """Durability is lost for good: record it, log it, wake waiters."""
        if self.failed is not None:
            return
        reason = f" ({exc.strerror or exc})" if exc is not None else ""
        self.failed = FlushFailed(f"{self._path}: {during} failed{reason}; no later write to this journal "
                                  f"will be confirmed durable")
        self.failed.__cause__ = exc
        log.error("%s", self.failed)
        self._on_change()
