"""Part (c) of tools/bench_recall.py: the largest set, at the store's default seal_bytes.

One store, two collections over the same rows (clustered, recall_data.py's
``Clustered``, or i.i.d. Gaussian): ``flat`` (exact, the
reference and the exact answers) and an IVF index string. The rows are
generated chunk by chunk (never all in memory) and appended to both; the
store's default seal_bytes (1 GiB) cuts them into several shards and a short
idle time seals the last one, so every shard of the IVF collection gets its
own index. Then: recall@10 per nprobe, and queries/s of each setting against
exact search over the same store, in interleaved rounds.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from recall_data import Clustered, K, gaussian, nlist_for
from recall_systems import Search, measure
from rounds import interleave, summarise

import shardmgr
from shardmgr.store.config import StoreConfig

CHUNK = 100_000
IDLE_SEAL_S = 3.0


def _rows(kind: str, count: int, dim: int, seed: object) -> np.ndarray:
    if kind == "clustered":
        return Clustered(dim).rows(count, seed)
    return np.random.default_rng(seed).standard_normal((count, dim), dtype=np.float32)  # type: ignore[arg-type]


def _fill(store: Any, kind: str, rows: int, dim: int) -> None:
    for start in range(0, rows, CHUNK):
        end = min(start + CHUNK, rows)
        # chunk by chunk from its own seed: the same rows in every run, without holding them all
        chunk = _rows(kind, end - start, dim, (1, start))
        ids = np.arange(start, end)
        store.append("flat", chunk, ids)
        store.append("ivf", chunk, ids)
        if start % (20 * CHUNK) == 0:
            print(f"large: {start:,} rows appended", file=sys.stderr, flush=True)


def _sealed(store: Any, timeout: float) -> None:
    """Until neither collection has a growing shard (the idle seal), or TimeoutError."""
    deadline = time.monotonic() + timeout
    while any(store.collection_info(c)["growing"] for c in ("flat", "ivf")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the last shards were not sealed after {timeout} s")
        time.sleep(0.5)


def bench_large(directory: Path, rows: int, dim: int, queries: int, nprobes: list[int], runs: int,
                single: int, single_s: float, kind: str = "clustered") -> dict[str, Any]:
    """The large set's figures: per setting its recall and its summarised runs; the chosen setting."""
    rows_per_shard = StoreConfig().seal_bytes // (4 * dim)
    spec = f"IVF{nlist_for(min(rows, rows_per_shard))},Flat"
    path = directory / "large"
    started = time.perf_counter()
    store = shardmgr.open(path, idle_seal_s=IDLE_SEAL_S)
    try:
        store.create_collection("flat", dim, "l2", "flat")
        store.create_collection("ivf", dim, "l2", spec)
        _fill(store, kind, rows, dim)
        filled = time.perf_counter()
        _sealed(store, 600)
        store.wait_for_indexes(timeout=7200)
        built = time.perf_counter()
        q = _rows(kind, queries, dim, 2) if kind == "clustered" else gaussian(queries, dim, 2)
        truth = store.search("flat", q, K)[1]

        def searcher(nprobe: int) -> Search:
            name, params = ("flat", None) if nprobe == 0 else ("ivf", {"nprobe": nprobe})
            return lambda batch: np.asarray(store.search(name, batch, K, params)[1])

        settings = [0, *nprobes]  # 0: exact, over the flat collection
        measured = interleave(settings, runs, lambda n: measure(searcher(n), q, truth, single, single_s),
                              lambda n: f"large {'exact' if n == 0 else f'nprobe {n}'}")
        info = store.collection_info("ivf")
    finally:
        store.close()
        shutil.rmtree(path, ignore_errors=True)
    out: list[dict[str, Any]] = [{"nprobe": n, "summary": summarise(r), "runs": r} for n, r in zip(settings, measured)]
    good = [row for row in out[1:] if row["summary"]["recall"].median >= 0.95]
    return {"rows": rows, "dim": dim, "kind": kind, "queries": queries, "spec": spec, "shards": info["sealed"],
            "fill_s": filled - started, "build_s": built - filled, "settings": out,
            "chosen": min(good, key=lambda r: r["nprobe"])["nprobe"] if good else None}
