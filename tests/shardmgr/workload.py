"""A small but complete data directory for verify tests: every file kind.

``build(root)`` writes, through the public APIs, a vector store with sealed
shards, a mid-build shard and an HNSW collection with built indexes, and a
work queue with several input segments (one of them finished), completion
logs with results handed out and ledger entries. It returns what was
durably stored, so a test can check that every undamaged row is served.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import shardmgr
import workq

DIM = 8
ROWS_PER_BATCH = 64
SEAL_BYTES = 4 * ROWS_PER_BATCH * DIM * 4  # four batches per shard


class Workload:
    """What went in: per collection, refs -> (vector, id); the job names."""

    def __init__(self, vectors: dict[str, dict[int, tuple[np.ndarray, int]]], jobs: list[str]) -> None:
        self.vectors, self.jobs = vectors, jobs

    def __repr__(self) -> str:  # short: hypothesis prints it with every failing case
        return f"<Workload of {sum(map(len, self.vectors.values()))} rows, jobs {self.jobs}>"


def build(root: Path, *, batches: int = 10, items: int = 300) -> Workload:
    stored: dict[str, dict[int, tuple[np.ndarray, int]]] = {"flat": {}, "graph": {}}
    rng = np.random.default_rng(7)
    with shardmgr.open(root, seal_bytes=SEAL_BYTES, extent_bytes=4096) as store:
        store.create_collection("flat", DIM, "l2")
        store.create_collection("graph", DIM, "ip", "hnsw")
        for name, count in (("flat", batches), ("graph", 9)):
            for b in range(count):
                vectors = rng.standard_normal((ROWS_PER_BATCH, DIM)).astype(np.float32)
                ids = np.arange(b * ROWS_PER_BATCH, (b + 1) * ROWS_PER_BATCH, dtype=np.int64) + 1000
                refs = store.append(name, vectors, ids, durable=True)
                stored[name].update({int(r): (v, int(i)) for r, v, i in zip(refs, vectors, ids)})
        store.wait_for_indexes(timeout=120)
    with workq.open(root, segment_bytes=64 << 10, reconnect_window_s=0.0, disk_floor_bytes=0) as broker:
        for job in ("alpha", "beta"):
            for start in range(0, items, 50):  # an enqueue must fit one (small) segment
                payloads = [b"task-%06d" % i * 40 for i in range(start, min(items, start + 50))]
                broker.enqueue(job, "m", "s", 0, payloads, durable=True)
        for _ in range(3):
            leased = broker.lease(items // 2, worker="w")
            broker.complete([item.handle for item in leased], [b"result" * 10] * len(leased))
        broker.results("alpha", max_items=items // 3)
    return Workload(stored, ["alpha", "beta"])


def file_kinds(root: Path) -> dict[str, list[Path]]:
    """The files of a built directory, by kind."""
    shards = root / "shards"
    kinds = {
        "segment": sorted((root / "workq" / "segments").glob("*.wqsg")),
        "completion_log": sorted((root / "workq" / "results").glob("*/*.wqcl")),
        "catalog": [root / "workq" / "catalog.wqct"],
        "shard_journal": sorted(shards.glob("*/[0-9]*/journal")),
        "vectors": sorted(shards.glob("*/[0-9]*/vectors")),
        "ids": sorted(shards.glob("*/[0-9]*/ids")),
        "collection_meta": sorted(shards.glob("*/collection")),
        "index_faiss": sorted(shards.glob("*/[0-9]*/index.faiss")),
        "index_meta": sorted(shards.glob("*/[0-9]*/index.meta")),
    }
    assert all(kinds.values()), {k: len(v) for k, v in kinds.items()}
    return kinds
