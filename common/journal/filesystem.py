"""Small filesystem operations with the durability rules the journal needs."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
from collections.abc import Callable
from pathlib import Path

from common.units import MiB

from .config import Preallocate

_ZEROS = bytes(1 * MiB)
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
"""The errnos of a full disk (or quota): callers answer them as "disk full", not as a bug."""
FIT_ALIGN = 4096
"""A growth cut to what fits (see :func:`grow`) is rounded up to this many bytes."""


def fsync_dir(directory: Path) -> None:
    """Make a directory's entries (creates, renames, unlinks) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(directory: Path) -> None:
    """Create ``directory`` (and missing parents) durably: each new entry's
    parent is fsynced, so the directory survives a power cut."""
    directory = Path(directory)
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except FileExistsError:
            continue
        fsync_dir(path.parent)


def create_atomically(path: Path, data: bytes | bytearray) -> None:
    """Create ``path`` holding ``data``, durably, or not at all.

    Writes a temporary sibling, fsyncs it, renames it into place and fsyncs
    the directory. Raises FileExistsError if ``path`` exists; a crash at any
    point leaves either no file or the complete file (plus, at worst, a
    ``.tmp`` sibling that the next create overwrites).
    """
    if path.exists():
        raise FileExistsError(f"{path} already exists")
    tmp = path.with_name(path.name + ".tmp")
    _write_synced(tmp, data)
    try:
        os.link(tmp, path)  # fails if path appeared meanwhile, unlike rename
    finally:
        os.unlink(tmp)
    fsync_dir(path.parent)


def replace_atomically(path: Path, data: bytes | bytearray) -> None:
    """Write ``path`` (replacing it) so that a reader sees the whole old or
    the whole new content, durably: a temporary sibling private to this
    process, fsynced, renamed over it, then the directory fsynced."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    _write_synced(tmp, data)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _write_synced(path: Path, data: bytes | bytearray) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)  # not inside the slice: compiled, its bounds are evaluated twice
            view = view[written:]
        os.fsync(fd)
    except OSError as exc:
        if exc.filename is None:  # os.write and os.fsync name no file: say which (a full disk's log line does)
            exc.filename = str(path)
        raise
    finally:
        os.close(fd)


def free_bytes(fd: int) -> int:
    """Bytes an unprivileged writer may still allocate on ``fd``'s file system."""
    stat = os.fstatvfs(fd)
    return stat.f_bavail * stat.f_frsize


def grow(fd: int, old_size: int, new_size: int, mode: Preallocate, *, at_least: int | None = None) -> int:
    """Extend a file from ``old_size`` to ``new_size`` bytes of zeros; returns the new size.

    ``sparse`` sets the size only; ``fallocate`` also reserves the blocks
    (so a full disk fails here, before any record is written); ``zero``
    writes zeros so later fdatasyncs have no block allocation to commit.
    With ``at_least`` (the bytes the caller needs now), a growth the file
    system's free space cannot hold is cut to ``at_least`` (rounded up to
    FIT_ALIGN): a nearly full disk still takes a small write, and a whole
    extent is not needed free after a restart. OSError (ENOSPC) if even
    that does not fit.
    """
    if new_size <= old_size:
        return old_size
    if at_least is not None and mode != "sparse" and new_size - old_size > free_bytes(fd):
        new_size = max(old_size, min(new_size, -(-at_least // FIT_ALIGN) * FIT_ALIGN))
        if new_size <= old_size:
            return old_size
    if mode == "sparse":
        os.ftruncate(fd, new_size)
    elif mode == "fallocate":
        os.posix_fallocate(fd, old_size, new_size - old_size)
    else:
        pos = old_size
        while pos < new_size:
            pos += os.pwrite(fd, _ZEROS[: min(len(_ZEROS), new_size - pos)], pos)
    return new_size


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """libc's sync_file_range (Linux), or None where there is none."""
    try:
        function = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    sync: Callable[[int, int, int, int], int] = function
    return sync


_SYNC_FILE_RANGE = _sync_file_range()
SYNC_FILE_RANGE_WRITE = 2
"""Linux's flag: start writing out the range's dirty pages, do not wait."""


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``length`` bytes at ``offset`` to the
    disk now, without waiting (sync_file_range(SYNC_FILE_RANGE_WRITE)). A
    hint for bytes an fdatasync will soon be asked for: the write is then
    already under way while the caller does other work. It makes nothing
    durable (no metadata, no cache flush); errors are left to that
    fdatasync, which reports any the write-out met. No-op where the call
    does not exist."""
    if _SYNC_FILE_RANGE is not None and length > 0:
        _SYNC_FILE_RANGE(fd, offset, length, SYNC_FILE_RANGE_WRITE)
