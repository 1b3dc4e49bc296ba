"""Full-disk episodes: what an operator hears when writes are refused for lack of space.

A write refused as ``disk_full`` (the disk or a quota full, or the queue's
free-space floor reached) is counted (``disk_full_total``, and
``disk_full`` 1 while an episode lasts, in the component's stats and so in
the metrics). The first refusal of an episode is logged once, at ERROR,
with the file, the bytes the write needed and the bytes free; the episode
ends at the next write that succeeds, which logs one WARNING line saying
how many writes were refused and for how long. A disk that stays full thus
logs one line, not one per request.

Threads: any; ``_lock`` guards the counts. :meth:`FullDisk.wrote` takes no
lock outside an episode (it runs on every write).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path


class FullDisk:
    """One component's full-disk episodes (module docstring); ``what`` names it in log lines."""

    def __init__(self, what: str, log: logging.Logger) -> None:
        self.what = what
        self._log = log
        self._lock = threading.Lock()
        self.refusals = 0
        self._episode: tuple[float, int] | None = None  # (monotonic start, refusals before it)

    def refused(self, path: str | Path, needed: int | None, free: int | None, why: str = "the disk is full") -> None:
        """Count one write refused for lack of space; log it if it starts an episode."""
        with self._lock:
            self.refusals += 1
            if self._episode is not None:
                return
            self._episode = (time.monotonic(), self.refusals - 1)
        self._log.error("%s: disk full: a write to %s needing %s bytes was refused (%s; %s bytes free); writes "
                        "needing space are refused until some is freed (logged again when one succeeds)",
                        self.what, path, "?" if needed is None else needed, why, "?" if free is None else free)

    def refused_write(self, exc: OSError, where: Path, needed: int | None = None) -> None:
        """Count a write that failed with ``exc`` (ENOSPC, EDQUOT) under the directory ``where``: the file is
        the one ``exc`` names (else ``where``), the bytes needed those it names (a WriteFailed's) else
        ``needed``."""
        found = getattr(exc, "needed", None)
        self.refused(exc.filename or where, found if found is not None else needed, free_bytes_under(where),
                     os.strerror(exc.errno) if exc.errno else str(exc))

    def wrote(self) -> None:
        """A write succeeded: the episode, if any, ends."""
        if self._episode is None:
            return
        with self._lock:
            if self._episode is None:
                return
            started, before = self._episode
            self._episode = None
            refused = self.refusals - before
        self._log.warning("%s: disk space again: writes succeed after %d refused for a full disk over %.1f s",
                          self.what, refused, time.monotonic() - started)

    def stats(self) -> dict[str, int]:
        """``disk_full_total`` (refusals so far) and ``disk_full`` (1 during an episode)."""
        with self._lock:
            return {"disk_full_total": self.refusals, "disk_full": int(self._episode is not None)}


def free_bytes_under(directory: Path) -> int | None:
    """Free bytes an unprivileged writer may still use on ``directory``'s file system; None if it cannot be read."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize
