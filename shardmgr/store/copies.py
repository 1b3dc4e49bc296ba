"""A snapshot's copy of the vector store's files (shardmgr/snapshots.py drives it).

Per collection: its ``collection`` metadata file (copied: it is small). Per
shard in the store's shard list:

* files never written again are hard-linked (copied across file systems):
  a sealed shard's vectors, ids, journal, refs and index files;
* the delete log (it grows after sealing) and the growing shard's journal
  are copied up to their end with their flusher paused;
* the growing shard's vectors and ids are copied up to its rows (not its
  preallocated space); it gets no clean-close marker, so the snapshot seals
  it at its first open, as after a crash, with exactly these rows.

Quarantined shards are linked too (they are evidence). Directories a
creation or a rewrite is still building (``.tmp``) and shards the store does
not hold are left out. Runs under the store's write lock, after a flush.
"""

from __future__ import annotations

from pathlib import Path

from common.journal.copying import copy_journal, copy_prefix, link_or_copy
from common.journal.filesystem import make_dirs

from . import layout
from .collection import Collection
from .rows import HEADER_SIZE
from .shard import Shard


def copy_collections(collections: list[Collection], dest: Path) -> int:
    """Copy every collection to ``dest/shards``; returns the bytes copied (links count 0)."""
    copied = 0
    for collection in collections:
        target = dest / layout.SHARDS / collection.directory.name
        make_dirs(target)
        copied += link_or_copy(collection.directory / layout.COLLECTION, target / layout.COLLECTION)
        for shard in sorted(collection.shards.values(), key=lambda s: s.id):
            copied += _copy_shard(shard, target / shard.directory.name)
        quarantine = collection.directory / layout.QUARANTINE
        for moved in sorted(quarantine.iterdir()) if quarantine.is_dir() else []:
            make_dirs(target / layout.QUARANTINE / moved.name)
            for path in sorted(p for p in moved.iterdir() if p.is_file()):
                copied += link_or_copy(path, target / layout.QUARANTINE / moved.name / path.name)
    return copied


def _copy_shard(shard: Shard, target: Path) -> int:
    make_dirs(target)
    copied = 0
    log = shard.deletes.journal
    if log is not None:
        copied += copy_journal(log, target / layout.DELETES)
    if shard.journal is not None and not shard.sealed:  # growing: only what its journal vouches for
        copied += copy_journal(shard.journal, target / layout.JOURNAL)
        for column in (shard.vectors, shard.ids):
            copied += copy_prefix(column.path, target / column.path.name,
                                  HEADER_SIZE + shard.rows * column.header.row_bytes)
        return copied
    # index files only once installed: before that the index thread may be writing them
    skip = {layout.DELETES, layout.CLOSED} | (set() if shard.index is not None else {layout.INDEX,
                                                                                       layout.INDEX_META})
    for path in sorted(p for p in shard.directory.iterdir() if p.is_file()):
        if path.name not in skip and not path.name.endswith(".tmp"):
            copied += link_or_copy(path, target / path.name)
    return copied
