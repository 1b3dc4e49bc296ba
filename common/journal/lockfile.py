"""An exclusive, advisory lock on a directory, held for a process's life.

Taking it is how every owner of a data directory starts (the server, an
embedded store or queue, ``verify --repair``), so it also refuses a
directory that is not a whole data directory: one holding
``SNAPSHOT_INCOMPLETE``, the mark of a snapshot being built or cut short
(shardmgr/snapshots.py), whose files may be missing.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from common.errors import CommonError

LOCK_NAME = "LOCK"
INCOMPLETE_NAME = "SNAPSHOT_INCOMPLETE"
"""Present in a copy of a data directory until the copy is whole (shardmgr/snapshots.py)."""
SNAPSHOT_SUFFIX = ".tmp"
"""A snapshot is built in ``DEST`` + this suffix, beside ``DEST``, and renamed to ``DEST`` once whole
(shardmgr/snapshots.py)."""


class DirectoryLocked(CommonError):
    """Another process holds the directory's lock."""


class IncompleteCopy(CommonError):
    """The directory is a snapshot being built, or one a crash cut short: not a data directory."""


def incomplete(directory: Path) -> bool:
    """True if ``directory`` holds the mark of a copy that is not whole."""
    return (Path(directory) / INCOMPLETE_NAME).exists()


class LockFile:
    """``flock`` on ``DIR/LOCK``; the file holds the owner's pid for humans.

    The lock dies with the process (kill -9 included), so a stale LOCK file
    never blocks a restart.
    """

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise DirectoryLocked naming the holder's pid;
        IncompleteCopy (creating nothing) for a copy that is not whole."""
        if incomplete(self.path.parent):
            raise IncompleteCopy(f"{self.path.parent} is a snapshot that is not complete ({INCOMPLETE_NAME}: being "
                                 f"built, or cut short by a crash): files may be missing, so it is not a data "
                                 f"directory; remove it and take the snapshot again")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DirectoryLocked(f"{self.path.parent} is in use by another process (pid {holder})") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)  # closing drops the lock too
            raise
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    @staticmethod
    def held(directory: Path) -> bool:
        """True if some process holds the lock now (without taking it)."""
        path = Path(directory) / LOCK_NAME
        if not path.exists():
            return False
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False
