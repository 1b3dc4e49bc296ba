"""Shards that failed their checks on open, moved aside: ``DATA/shards/<name>/quarantine/``.

Each moved shard directory keeps its files untouched and gains a
``QUARANTINED`` file saying why; nothing is ever deleted, so an operator
(or ``shardmgr verify``) can look at what failed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from common.journal.check import read_regular
from common.journal.errors import FormatError
from common.journal.filesystem import create_atomically, fsync_dir, make_dirs

from . import layout


def quarantine(shard_dir: Path, reason: str) -> Path:
    """Move a shard directory to its collection's ``quarantine/`` (durably,
    with a layout.QUARANTINED saying why); returns where it went. Nothing is deleted."""
    target = shard_dir.parent / layout.QUARANTINE / f"{shard_dir.name}-{time.strftime('%Y%m%dT%H%M%S')}"
    make_dirs(target.parent)
    if not (shard_dir / layout.QUARANTINED).exists():
        create_atomically(shard_dir / layout.QUARANTINED, reason.encode())
    os.rename(shard_dir, target)
    fsync_dir(shard_dir.parent)
    fsync_dir(target.parent)
    return target


def quarantine_reason(moved: Path) -> str:
    """Why a quarantined shard was moved, as recorded when it was."""
    try:  # read_regular: verify reads this too, and a FIFO in its place must not block it
        return read_regular(moved / layout.QUARANTINED).decode(errors="replace").strip() or "no reason recorded"
    except (OSError, FormatError):
        return "no reason recorded"
