"""An exclusive, advisory lock on a directory, held for a process's life."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from common.errors import CommonError

LOCK_NAME = "LOCK"


class DirectoryLocked(CommonError):
    """Another process holds the directory's lock."""


class LockFile:
    """``flock`` on ``DIR/LOCK``; the file holds the owner's pid for humans.

    The lock dies with the process (kill -9 included), so a stale LOCK file
    never blocks a restart.
    """

    def __init__(self, directory: Path) -> None:
        self.path = Path(directory) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise DirectoryLocked naming the holder's pid."""
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
