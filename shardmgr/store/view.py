"""A consistent snapshot of one shard for readers (Shard.view makes them).

Searches, gets and rewrites read rows through a view: its arrays are
read-only, in place over the shard's mappings, and cover the rows the shard
held when the view was taken, so appends, seals and deletes on the writer's
thread never disturb a reader holding one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from shardmgr.errors import RowDeleted, UnknownRef

from .deletes import Selector, over
from .lineage import Lineage
from .refs import ref_of


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    """A consistent snapshot of a shard for readers."""

    shard: int
    rows: int
    vectors: np.ndarray  # [rows, dim] float32, read-only, in place
    ids: np.ndarray  # [rows] int64, read-only, in place
    index: Any = None  # an approximate faiss index over the rows, if built (index.py)
    sealed: bool = False
    deleted: np.ndarray | None = None  # bool mask of deleted rows (rows past its end are live); None: none deleted
    deleted_count: int = 0
    refs: np.ndarray | None = None  # [rows] int64, the rows' refs (rewritten shards); None: shard << 40 | row
    lineage: Lineage | None = None
    keep: Selector | None = None  # faiss's selector of the live rows; None: none deleted

    @property
    def live(self) -> int:
        return self.rows - self.deleted_count

    def dead(self) -> np.ndarray:
        """Deleted or not, per row: bool [rows]."""
        return over(self.deleted, self.rows) if self.deleted is not None else np.zeros(self.rows, dtype=bool)

    def refs_at(self, rows: np.ndarray) -> np.ndarray:
        """The refs of some of this shard's rows."""
        return self.refs[rows] if self.refs is not None else ref_of(self.shard, rows)


def gather(by_id: Mapping[int, View], shards: np.ndarray, rows: np.ndarray, refs: np.ndarray, dim: int,
           collection: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vectors [n, dim], ids [n], found [n]) of the rows (``shards``, ``rows``)
    that ``refs`` name, read from the views ``by_id`` holds (refs of other
    shards: not found, zeros). One pass per shard, not per row. UnknownRef
    for a row past its shard's end, RowDeleted for a deleted one (each naming
    the first such ref)."""
    vectors = np.zeros((len(refs), dim), np.float32)
    ids = np.full(len(refs), -1, np.int64)
    found = np.zeros(len(refs), bool)
    for shard_id in np.unique(shards).tolist():
        view = by_id.get(shard_id)
        if view is None:
            continue
        mine = np.flatnonzero(shards == shard_id)
        wanted = rows[mine]
        if (past := wanted >= view.rows).any():
            raise UnknownRef(f"collection {collection!r}: ref {int(refs[mine][np.argmax(past)])} names no stored row")
        if view.deleted is not None and (dead := view.dead()[wanted]).any():
            raise RowDeleted(f"collection {collection!r}: ref {int(refs[mine][np.argmax(dead)])} was deleted")
        vectors[mine], ids[mine], found[mine] = view.vectors[wanted], view.ids[wanted], True
    return vectors, ids, found
