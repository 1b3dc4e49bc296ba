"""A snapshot's copy of the queue's files (shardmgr/snapshots.py drives it).

Every file under ``DATA/workq`` is copied, none linked: input segments and
completion logs change in place after they are sealed (tombstones, delivered
marks), so a link would let the snapshot change with the queue. Open
journals are copied up to their end with their flusher paused
(common/journal/copying.py); files no journal has open (rested completion
logs, quarantined files) are copied whole.

Runs under the broker's owner lock, after a flush: nothing is appended or
marked meanwhile, and the copy's checkpoints cover every record in it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from common.journal import Journal
from common.journal.copying import copy_file, copy_journal
from common.journal.filesystem import make_dirs

LOCK_NAMES = ("LOCK",)


def copy_queue(root: Path, open_journals: Iterable[Journal], dest: Path) -> int:
    """Copy the queue's directory ``root`` to ``dest`` (which must not
    exist), the journals the queue has open through copy_journal; returns bytes copied."""
    journals = {journal.path.resolve(): journal for journal in open_journals}
    copied = 0
    for directory, _, files in os.walk(root):
        target = dest / Path(directory).relative_to(root)
        make_dirs(target)
        for name in sorted(files):
            source = Path(directory) / name
            if name in LOCK_NAMES or name.endswith(".tmp"):  # a lock, or a write a crash cut short
                continue
            journal = journals.get(source.resolve())
            if journal is not None:
                copied += copy_journal(journal, target / name)
            else:
                copied += copy_file(source, target / name)
    return copied
