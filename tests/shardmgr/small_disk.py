"""A real, small file system for disk-full tests: a tmpfs of a few MiB.

Mounting needs root (as in CI); elsewhere the tests that use it skip. The
mount is removed when the context ends, whatever the test did.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def small_disk(where: Path, mib: int) -> Iterator[Path]:
    """Mount a ``mib``-MiB tmpfs at ``where`` (created) and yield it."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(where)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fill(path: Path, leave: int) -> None:
    """Write a ballast file at ``path`` so that about ``leave`` bytes stay free
    (none: as much as the file system takes)."""
    with open(path, "ab") as f:
        try:
            f.write(bytes(max(0, free_bytes(path.parent) - leave)))
            f.flush()
        except OSError:  # ENOSPC: the disk is as full as it gets
            pass
