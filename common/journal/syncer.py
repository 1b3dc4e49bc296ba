"""Making one journal file durable: fdatasync, then a checkpoint.

A sync notes the newest write (its sequence number) and the state to record
(end, count, counters, sealed), calls fdatasync on the journal's companion
data files and on the journal at once (the journal's on a helper thread:
two fdatasyncs in flight overlap on the device; docs/benchmarks.md,
"Durable ingest", says what that saved a shard's durable appends), and
only when all have returned advances the durable watermark to that write. If the
state differs from the newest
checkpoint, it writes a new checkpoint into the *other* slot; the next sync
makes that checkpoint durable in turn. So a checkpoint never describes
anything that is not already durable, and a torn checkpoint write always
leaves the previous one intact.

A sync whose only work would be to make the newest checkpoint durable
(no write since the last sync) is *lazy* in flusher rounds: it waits up to
CHECKPOINT_LAG_S for a later write's sync to carry the checkpoint with it.
Otherwise a journal written once per round (one item per call) paid a
second fdatasync per write just for its checkpoint. Nothing waits for a
checkpoint: it describes only durable writes, whenever it becomes durable
itself, and an older durable one stays valid meanwhile (recovery walks the
records after it). Explicit syncs (seal, close, recovery) are never lazy.

Companion data and the journal reach the disk in either order, so a crash
during a sync may leave a record on disk without its data (as the kernel's
own writeback always could): such a record is past the checkpoint and was
never confirmed, and its owner's recovery checks it against its data
(shards: batch checksums). No write is confirmed, and no checkpoint
written, before every file of the sync is durable.

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
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

from .errors import FlushFailed
from .header import SLOT_OFFSETS, Checkpoint

log = logging.getLogger(__name__)

CHECKPOINT_LAG_S = 0.5
"""How long a flusher round leaves a written checkpoint unsynced when no
write came after it (see the module docstring)."""
HELPERS: Final = 4
"""Threads that fdatasync journals beside their companions (shared by every journal)."""
_helpers: ThreadPoolExecutor | None = None
_helpers_lock = threading.Lock()


def sync_together(fd: int, companions: list[int]) -> None:
    """fdatasync ``fd`` and every file of ``companions`` at once: the
    companions on this thread, ``fd`` on a helper thread; returns when all
    are durable. OSError if any fdatasync fails (after all have returned)."""
    if not companions:
        os.fdatasync(fd)
        return
    helper = _pool().submit(os.fdatasync, fd)  # os.fdatasync looked up now: a power-cut simulator sees it
    try:
        for companion in companions:
            os.fdatasync(companion)
    finally:
        helper.result()


def _pool() -> ThreadPoolExecutor:
    global _helpers
    with _helpers_lock:
        if _helpers is None:
            _helpers = ThreadPoolExecutor(HELPERS, thread_name_prefix="journal-sync")
        return _helpers


def _forget_pool() -> None:
    """In a forked child: the parent's helper threads do not exist there, and
    a pool that believes it has them would never run a sync (a flush would
    hang). The child makes its own pool when it first needs one."""
    global _helpers, _helpers_lock
    _helpers, _helpers_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


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
        self._written_at = 0.0  # monotonic time it was written
        self._on_change = on_change  # wakes durable waiters
        self.companions: list[int] = []  # data files synced before the journal (see Journal.add_companion)

    @property
    def checkpoint(self) -> Checkpoint:
        return self._checkpoint

    def settled(self, seq: int, lazy: bool) -> bool:
        """Nothing to sync for writes up to ``seq``: they are durable, and so
        is their checkpoint (or, ``lazy``, it may wait: see CHECKPOINT_LAG_S).
        The state recorded at a sync is the state at its ``seq`` (both are
        read under the journal's lock), so no state check is needed."""
        return self.failed is not None or (seq == self.durable_seq and not self._pending(lazy))

    def _pending(self, lazy: bool) -> bool:
        """Is a written checkpoint waiting for an fdatasync that must come now?"""
        return self._unsynced and not (lazy and time.monotonic() - self._written_at < CHECKPOINT_LAG_S)

    def sync(self, seq: int, state: Checkpoint, lazy: bool = False) -> bool:
        """Make writes up to ``seq`` durable and record ``state`` (whose
        generation is ignored). Returns True if fdatasync was called.
        ``lazy``: a checkpoint-only sync may wait (see CHECKPOINT_LAG_S)."""
        if self.failed is not None:
            return False
        changed = not state.same_state(self._checkpoint)
        if seq == self.durable_seq and not changed and not self._pending(lazy):
            return False
        try:
            sync_together(self._fd, self.companions)
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
            self._written_at = time.monotonic()
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
