"""The vector store's configuration: one frozen dataclass, defaults and units here.

``shardmgr.open`` takes it, and ``shardmgr serve`` reads it from the
``[store]`` table of its configuration (shardmgr/server/config.py).
"""

from __future__ import annotations

import dataclasses
import math

from .batch_record import MAX_ROWS


@dataclasses.dataclass(frozen=True, slots=True)
class StoreConfig:
    """Settings of the vector store. ``validate()`` checks them."""

    #: A shard is sealed once its vectors reach this many bytes ...
    seal_bytes: int = 1 << 30
    #: ... or after this many seconds without an append.
    idle_seal_s: float = 300.0
    #: Row files grow in steps of this many bytes (preallocated with fallocate).
    extent_bytes: int = 64 << 20
    #: Largest k a search may ask for.
    max_k: int = 10_000
    #: Largest number of queries in one search call.
    max_queries: int = 100_000
    #: Largest batch one append may carry, in rows (at most batch_record.MAX_ROWS: a batch is one record).
    max_batch_rows: int = 1_000_000
    #: HNSW build parameter M and search breadth efSearch (index = "hnsw").
    hnsw_m: int = 32
    hnsw_ef_search: int = 128
    #: Most rows an index that needs training (IVF, PQ, SQ) is trained on: an even sample of the shard.
    index_train_rows: int = 262_144
    #: A sealed shard whose live rows are fewer than this fraction of its rows is
    #: rewritten without its deleted rows (0 turns rewriting off; rewrite.py) ...
    rewrite_live_fraction: float = 0.5
    #: ... and consecutive sealed shards whose live vectors are each under this
    #: fraction of seal_bytes are merged into one (0 turns merging off).
    merge_below_fraction: float = 0.25

    def validate(self) -> StoreConfig:
        if self.seal_bytes > 1 << 40:  # rows of 1-d vectors must stay below 2**40 (refs: shard << 40 | row)
            raise ValueError(f"seal_bytes must be at most 1 TiB, got {self.seal_bytes}")
        if self.seal_bytes < 4096 or self.extent_bytes < 4096 or self.extent_bytes % 4096:
            raise ValueError(f"seal_bytes must be >= 4096 and extent_bytes a positive multiple of 4096, got "
                             f"{self.seal_bytes} and {self.extent_bytes}")
        if not 0 < self.idle_seal_s < math.inf:  # also NaN
            raise ValueError(f"idle_seal_s must be a positive, finite number of seconds, got {self.idle_seal_s}")
        for name in ("rewrite_live_fraction", "merge_below_fraction"):
            if not 0 <= getattr(self, name) <= 1:  # also NaN
                raise ValueError(f"{name} must be a fraction in 0..1, got {getattr(self, name)}")
        if self.max_batch_rows > MAX_ROWS:  # its ids are one journal record
            raise ValueError(f"max_batch_rows must be at most {MAX_ROWS}, got {self.max_batch_rows}")
        for name in ("max_k", "max_queries", "max_batch_rows", "hnsw_m", "hnsw_ef_search", "index_train_rows"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        return self
