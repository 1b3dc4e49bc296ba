"""The optional parts of tools/bench_shards.py, one run each: HNSW recall,
start-up time over many sealed shards, and LanceDB on the same workload."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from shard_phases import QUERIES, K, data, start_server  # tools/shard_phases.py, beside this file

import shardmgr

BATCH = 1000


def timed_search(search: Any, queries: np.ndarray, repeats: int = 3) -> float:
    """Queries per second of ``search(queries)``: the best of ``repeats``
    runs after a warm-up (the same rule for the baseline and for us)."""
    search(queries[:10])
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        search(queries)
        best = min(best, time.perf_counter() - started)
    return len(queries) / best


def faiss_qps(vectors: np.ndarray, queries: np.ndarray) -> float:
    index = faiss.IndexFlatL2(vectors.shape[1])
    index.add(vectors)
    return timed_search(lambda q: index.search(q, K), queries)


def bench_hnsw(directory: Path, vectors: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    path = directory / "hnsw"
    store = shardmgr.open(path, seal_bytes=vectors.nbytes // 2)
    store.create_collection("c", vectors.shape[1], "l2", "hnsw")
    for i in range(0, len(vectors), 50_000):
        store.append("c", vectors[i:i + 50_000], np.arange(i, i + 50_000))
    store.append("c", vectors[:1], [0])  # seals the last full shard
    started = time.perf_counter()
    store.wait_for_indexes(timeout=3600)
    built = time.perf_counter() - started
    exact = faiss.IndexFlatL2(vectors.shape[1])
    exact.add(vectors)
    _, truth = exact.search(queries, K)
    qps = timed_search(lambda q: store.search("c", q, k=K), queries)
    _, ids, _ = store.search("c", queries, k=K)
    recall = np.mean([len(set(a) & set(b)) / K for a, b in zip(ids.tolist(), truth.tolist())])
    store.close()
    shutil.rmtree(path)
    return {"rows": len(vectors), "dim": vectors.shape[1], "layout": "2 sealed shards, hnsw", "recall_at_10": recall,
            "hnsw_qps": qps, "faiss_qps": faiss_qps(vectors, queries), "build_s": built}


def bench_startup(directory: Path, gib: float) -> dict[str, Any]:
    path = directory / "startup"
    dim, per_shard = 128, 1 << 30
    store = shardmgr.open(path, seal_bytes=per_shard)
    store.create_collection("c", dim)
    chunk = data(262_144, dim, 3)  # 128 MiB
    written = 0
    while written < gib * (1 << 30):
        store.append("c", chunk, np.arange(len(chunk)))
        written += chunk.nbytes
    store.append("c", chunk[:100_000], np.arange(100_000))  # seals the last full shard ...
    store.append("c", chunk[:100_000], np.arange(100_000))  # ... and leaves a mid-build one
    store.close()
    started = time.perf_counter()
    store = shardmgr.open(path)
    embedded = time.perf_counter() - started
    info = store.collection_info("c")
    store.close()  # the mid-build shard was sealed by that open; build another for the server run
    store = shardmgr.open(path)
    store.append("c", chunk[:100_000], np.arange(100_000))
    store.close()
    started = time.perf_counter()
    server, _ = start_server(path)
    served = time.perf_counter() - started
    server.terminate()
    server.wait(60)
    shutil.rmtree(path)
    return {"sealed_GiB": round(written / (1 << 30), 2), "shards": info["shards"], "rows": info["rows"],
            "embedded_open_s": embedded, "serve_ready_s": served}


def bench_lancedb(directory: Path) -> dict[str, Any]:
    import lancedb
    import pyarrow as pa

    dim, count = 128, 300_000
    vectors, queries = data(count, dim, 4), data(QUERIES, dim, 5)
    db = lancedb.connect(str(directory / "lance"))
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("vector", pa.list_(pa.float32(), dim))])
    table = db.create_table("t", schema=schema)
    started = time.perf_counter()
    for i in range(0, count, BATCH):
        part = vectors[i:i + BATCH]
        table.add(pa.table({"id": pa.array(np.arange(i, i + len(part))),
                            "vector": pa.FixedSizeListArray.from_arrays(pa.array(part.ravel()), dim)}))
    lance_ingest = count / (time.perf_counter() - started)
    lance_qps = timed_search(lambda q: table.search(q).limit(K).to_arrow(), queries)
    store = shardmgr.open(directory / "ours")
    store.create_collection("c", dim)
    ours = {}
    for durable in (False, True):
        started = time.perf_counter()
        for i in range(0, count, BATCH):
            store.append("c", vectors[i:i + BATCH], np.arange(i, i + BATCH), durable=durable)
        store.flush()
        ours[durable] = count / (time.perf_counter() - started)
    our_qps = timed_search(lambda q: store.search("c", q, k=K), queries)
    store.close()
    return {"rows": count, "dim": dim, "lancedb_ingest_rows_s": lance_ingest, "lancedb_qps": lance_qps,
            "ingest_rows_s": ours[False], "durable_ingest_rows_s": ours[True], "qps": our_qps,
            "ingest_ratio": ours[False] / lance_ingest, "durable_ingest_ratio": ours[True] / lance_ingest,
            "search_ratio": our_qps / lance_qps, "lancedb_version": lancedb.__version__}
