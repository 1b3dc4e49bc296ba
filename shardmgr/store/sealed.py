"""A sealed shard's files, as code outside the store sees them (cluster
mode's uploader: shardmgr/cluster/writer/uploader.py).

A :class:`SealedShard` names the files that hold a sealed shard's data and
its row count, read under the store's write lock (``Store.seam.sealed_shards``).
What stays true of them after that lock is let go:

- ``vectors``, ``ids`` and ``journal`` never change again: a sealed shard is
  never appended to, and its row files were cut to size when it was sealed.
  Only a rewrite removes them (the whole directory, after the rewrite that
  replaces it is committed); cluster mode turns rewrites off.
- ``deletes`` (present after the shard's first delete) and ``refs`` (present
  in a rewritten shard) are listed when they exist. ``deletes`` grows with
  every later delete: a copy taken of it is the deletes up to some moment,
  and a reader that checksums it twice may see two lengths.

- ``deleted``: the shard's deleted rows when it was listed (the delete log
  may hold more by the time it is read: ``Store.seam.copy_deletes`` takes a
  consistent, durable copy and says how many it holds).
- ``index_files`` (``index.faiss``, ``index.meta``): listed once the
  shard's approximate index is installed (built and persisted, or loaded at
  open). From then on they never change (an index is rebuilt only at an
  open that finds them unusable, and then the shard has no index until the
  new one is installed).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from . import layout
from .shard import Shard

#: the files a sealed shard has when they exist, beside layout.ALWAYS
SOMETIMES = (layout.DELETES, layout.REFS)


@dataclasses.dataclass(frozen=True, slots=True)
class SealedShard:
    """One sealed shard of a collection: its id, rows, (name, path) of each
    data file, deleted rows, and (name, path) of its index files (module docstring)."""

    collection: str
    shard_id: int
    rows: int
    files: tuple[tuple[str, Path], ...]
    deleted: int = 0
    index_files: tuple[tuple[str, Path], ...] = ()


def sealed_shard(collection: str, shard: Shard) -> SealedShard:
    """The files of ``shard`` (sealed), checked to exist now; caller holds the store's write lock."""
    assert shard.sealed, f"shard {shard.directory} is growing"
    names = layout.ALWAYS + tuple(name for name in SOMETIMES if (shard.directory / name).exists())
    index = layout.INDEX_FILES if shard.index is not None else ()
    return SealedShard(collection, shard.id, shard.rows, tuple((name, shard.directory / name) for name in names),
                       shard.deletes.count, tuple((name, shard.directory / name) for name in index))
