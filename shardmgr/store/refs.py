"""Refs: how a row is named for the life of its data.

A ref is ``shard << ROW_BITS | row`` (int64): the shard and row an append
put the row in. Rows a rewrite moves keep their refs (lineage.py).
"""

from __future__ import annotations

import numpy as np

ROW_BITS = 40
"""A ref is ``shard << ROW_BITS | row``: 2**40 rows per shard, 2**23 shards."""
ROW_MASK = (1 << ROW_BITS) - 1
MAX_SHARD = 2 ** (63 - ROW_BITS) - 1


def ref_of(shard: int, rows: np.ndarray) -> np.ndarray:
    """The refs of ``rows`` of shard ``shard`` (int64; one numpy operation: search's fixed cost)."""
    return np.asarray(rows, dtype=np.int64) | (int(shard) << ROW_BITS)


def split_refs(refs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(shard ids, rows) of int64 refs."""
    refs = np.asarray(refs, dtype=np.int64)
    return refs >> np.int64(ROW_BITS), refs & np.int64(ROW_MASK)
