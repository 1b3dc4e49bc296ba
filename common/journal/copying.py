"""Copies of live files for snapshots: journals, file prefixes, hard links.

A snapshot (shardmgr/snapshots.py) copies a data directory at one durable
point while the service keeps its files open. What each file needs:

* a live journal (``copy_journal``): its bytes up to its end, read while
  its flusher lock is held, so that no checkpoint is written into the
  header meanwhile; the caller keeps appends and marker changes away (the
  queue's owner lock, the store's write lock) and has flushed first, so the
  copy's checkpoint covers every record in it;
* a file still growing past what its owner vouches for (``copy_prefix``):
  its first ``length`` bytes;
* a file never written again (``link_or_copy``): a hard link when the
  destination is on the same file system, else a copy.

Every copy is synced before the function returns; directories are synced
by the caller once all its files are in place (``sync_tree``).
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from .filesystem import fsync_dir
from .journal import Journal

CHUNK = 8 << 20


def copy_journal(journal: Journal, dest: Path) -> int:
    """Copy ``journal`` as it is now (header, checkpoints, records up to
    its end) to the new file ``dest``; returns the bytes copied."""
    with journal.syncs_paused():  # no checkpoint write, and no close, while we read
        return copy_prefix(journal.path, dest, journal.end)


#: copy_file_range's answers for "not between these two files" (another file system: EXDEV since Linux 5.19)
NO_RANGE_COPY = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


def copy_prefix(source: Path, dest: Path, length: int) -> int:
    """Copy the first ``length`` bytes of ``source`` to the new file ``dest``
    (synced), by copy_file_range, or by reads and writes where the kernel
    refuses it (``dest`` on another file system)."""
    with open(source, "rb") as src, open(dest, "xb") as out:
        left, ranged = length, True
        while left:
            moved = 0
            if ranged:
                try:  # copy_file_range: the kernel copies (or shares extents) without a pass through Python
                    moved = os.copy_file_range(src.fileno(), out.fileno(), min(left, CHUNK))
                except OSError as exc:
                    if exc.errno not in NO_RANGE_COPY or left != length:
                        raise
                    ranged = False
            if not ranged:
                moved = out.write(src.read(min(left, CHUNK)))
            if not moved:
                raise OSError(errno.EIO, f"{source} ended {left} bytes short of {length}")
            left -= moved
        out.flush()
        os.fsync(out.fileno())
    return length


def link_or_copy(source: Path, dest: Path) -> int:
    """Hard-link ``source`` (a file never written again) at ``dest``, or copy
    it where links cannot cross file systems; returns the bytes copied (0 for a link)."""
    try:
        os.link(source, dest)
        return 0
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
    return copy_file(source, dest)


def copy_file(source: Path, dest: Path) -> int:
    """Copy ``source`` whole to the new file ``dest`` (synced); returns the bytes copied."""
    shutil.copyfile(source, dest)
    with open(dest, "rb+") as out:
        os.fsync(out.fileno())
    return dest.stat().st_size


def sync_tree(root: Path) -> None:
    """fsync every directory under ``root`` (and root), deepest first."""
    for directory, _, _ in sorted(os.walk(root), key=lambda entry: -entry[0].count(os.sep)):
        fsync_dir(Path(directory))
