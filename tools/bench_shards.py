"""Vector-store benchmark: every figure against a baseline measured in the same run.

(a) append: 768-d and 128-d float32 vectors (+ int64 ids) in batches of 1000,
    ``durable=True`` (each append waits for its flush) from one writer and
    from four (sharing group commits), and default (durable at the next
    group commit; one flush at the end), vs raw ``os.write`` + ``fdatasync``
    of the same bytes per batch; medians of three interleaved runs;
(b) exact search, 1000 queries, k=10, over 1M x 128 and 200k x 768, vs plain
    faiss ``IndexFlatL2`` over the same data in the same process; embedded,
    over several sealed shards, and over the network (``shardmgr serve``);
    plus the recall of the optional HNSW index (``--hnsw``);
(c) start-up with ``--startup-gib`` GiB of sealed shards plus one mid-build
    shard (embedded open, and ``shardmgr serve`` until ready);
(d) the same ingest and search through LanceDB (PyPI ``lancedb``).

Usage: python tools/bench_shards.py [--dir DIR] [--startup-gib 10] [--hnsw] [--json]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from emit import emit  # tools/emit.py, beside this file
from rich.console import Console
from rich.table import Table

import shardmgr
from shardmgr.server import readiness

BATCH = 1000
QUERIES = 1000
K = 10


def data(rows: int, dim: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, dim), dtype=np.float32)


def raw_append(directory: Path, vectors: np.ndarray) -> float:
    """MB/s of os.write + fdatasync per batch of the same vector and id bytes."""
    ids = np.arange(len(vectors), dtype=np.int64)
    fd = os.open(directory / "raw", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    started = time.perf_counter()
    for i in range(0, len(vectors), BATCH):
        os.write(fd, vectors[i:i + BATCH].tobytes())
        os.write(fd, ids[i:i + BATCH].tobytes())
        os.fdatasync(fd)
    elapsed = time.perf_counter() - started
    os.close(fd)
    os.unlink(directory / "raw")
    return (vectors.nbytes + ids.nbytes) / elapsed / 1e6


def store_append(directory: Path, vectors: np.ndarray, durable: bool, writers: int = 1) -> float:
    """MB/s of Store.append in batches of BATCH from ``writers`` threads
    (each its own share of the batches), then one flush."""
    ids = np.arange(len(vectors), dtype=np.int64)
    store = shardmgr.open(directory / "append")
    store.create_collection("c", vectors.shape[1])
    starts = list(range(0, len(vectors), BATCH))

    def write(mine: list[int]) -> None:
        for i in mine:
            store.append("c", vectors[i:i + BATCH], ids[i:i + BATCH], durable=durable)

    threads = [threading.Thread(target=write, args=(starts[w::writers],)) for w in range(writers)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    store.flush()
    elapsed = time.perf_counter() - started
    store.close()
    shutil.rmtree(directory / "append")
    return (vectors.nbytes + ids.nbytes) / elapsed / 1e6


def bench_append(directory: Path, repeats: int = 3) -> list[dict[str, Any]]:
    """Medians of ``repeats`` interleaved runs: this disk's speed drifts."""
    rows = []
    for dim, count in ((768, 100_000), (128, 300_000)):
        vectors = data(count, dim)
        modes = {"durable=True": (True, 1), "durable=True, 4 writers": (True, 4), "async + flush()": (False, 1)}
        runs: dict[str, list[float]] = {"raw": [], **{mode: [] for mode in modes}}
        for _ in range(repeats):
            runs["raw"].append(raw_append(directory, vectors))
            for mode, (durable, writers) in modes.items():
                runs[mode].append(store_append(directory, vectors, durable, writers))
        raw = statistics.median(runs["raw"])
        for mode in modes:
            rate = statistics.median(runs[mode])
            rows.append({"dim": dim, "rows": count, "mode": mode, "MBps": rate, "raw_MBps": raw, "ratio": rate / raw})
    return rows


def faiss_qps(vectors: np.ndarray, queries: np.ndarray) -> float:
    index = faiss.IndexFlatL2(vectors.shape[1])
    index.add(vectors)
    return timed_search(lambda q: index.search(q, K), queries)


def fill(path: Path, vectors: np.ndarray, **config: Any) -> None:
    store = shardmgr.open(path, **config)
    store.create_collection("c", vectors.shape[1])
    for i in range(0, len(vectors), 100_000):
        store.append("c", vectors[i:i + 100_000], np.arange(i, min(i + 100_000, len(vectors))))
    store.close()


def _search(store: Any, queries: np.ndarray) -> Any:
    return store.search("c", queries, k=K)


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


def bench_search(directory: Path, hnsw: bool) -> list[dict[str, Any]]:
    rows = []
    for count, dim in ((1_000_000, 128), (200_000, 768)):
        vectors, queries = data(count, dim, 1), data(QUERIES, dim, 2)
        baseline = faiss_qps(vectors, queries)
        for label, config in (("one growing shard", {}), ("8 sealed shards", {"seal_bytes": vectors.nbytes // 8})):
            path = directory / f"search-{dim}"
            fill(path, vectors, **config)
            store = shardmgr.open(path, **config)
            embedded = timed_search(functools.partial(_search, store), queries)
            store.close()
            row = {"rows": count, "dim": dim, "layout": label, "faiss_qps": baseline, "embedded_qps": embedded,
                   "embedded_ratio": embedded / baseline}
            if not config:
                server, address = start_server(path)
                with shardmgr.connect(address, timeout=600) as client:
                    network = timed_search(lambda q: client.search("c", q, k=K), queries)
                server.terminate()
                server.wait(60)
                row.update(network_qps=network, network_ratio=network / baseline)
            rows.append(row)
            shutil.rmtree(path)
        if hnsw and dim == 128:
            rows.append(bench_hnsw(directory, vectors[:200_000], queries))
    return rows


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


def start_server(path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``shardmgr serve`` on a free port; returns once its ready file says where."""
    ready, log = path.with_name(path.name + ".ready"), path.with_name(path.name + ".log")
    with open(log, "wb") as stderr:  # the server's log: kept beside the data, shown if it fails to start
        proc = subprocess.Popen([sys.executable, "-m", "shardmgr", "serve", "--data", str(path), "--port", "0",
                                 "--ready-file", str(ready)], stderr=stderr)
    host, port = readiness.wait(ready, proc, 3600, log=log.read_text)
    return proc, f"{host}:{port}"


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


def show(results: dict[str, Any]) -> None:
    console = Console()
    table = Table(title="(a) append, batches of 1000, vs raw write+fdatasync per batch")
    for col in ("dim", "mode", "MB/s", "raw MB/s", "ratio"):
        table.add_column(col, justify="right")
    for row in results["append"]:
        table.add_row(str(row["dim"]), row["mode"], f"{row['MBps']:,.0f}",
                      f"{row['raw_MBps']:,.0f}", f"{row['ratio']:.2f}")
    console.print(table)
    table = Table(title=f"(b) search, {QUERIES} queries, k={K}, vs faiss IndexFlatL2 in the same process")
    for col in ("data", "layout", "faiss q/s", "embedded q/s", "x", "network q/s", "x"):
        table.add_column(col, justify="right")
    for row in results["search"]:
        if "recall_at_10" in row:
            console.print(f"hnsw, {row['rows']:,} x {row['dim']}: recall@10 {row['recall_at_10']:.3f}, "
                          f"{row['hnsw_qps']:,.0f} q/s vs exact faiss {row['faiss_qps']:,.0f} q/s, "
                          f"built in {row['build_s']:.1f} s")
            continue
        table.add_row(f"{row['rows']:,} x {row['dim']}", row["layout"], f"{row['faiss_qps']:,.0f}",
                      f"{row['embedded_qps']:,.0f}", f"{row['embedded_ratio']:.2f}",
                      f"{row.get('network_qps', 0):,.0f}" if "network_qps" in row else "",
                      f"{row['network_ratio']:.2f}" if "network_ratio" in row else "")
    console.print(table)
    if results.get("startup"):
        s = results["startup"]
        console.print(f"(c) start-up with {s['sealed_GiB']} GiB sealed + a mid-build shard ({s['shards']} shards, "
                      f"{s['rows']:,} rows): embedded open {s['embedded_open_s']:.3f} s, serve ready "
                      f"{s['serve_ready_s']:.3f} s")
    if results.get("lancedb"):
        s = results["lancedb"]
        console.print(f"(d) {s['rows']:,} x {s['dim']} in batches of {BATCH}: ingest {s['ingest_rows_s']:,.0f} rows/s "
                      f"({s['ingest_ratio']:.1f} x LanceDB {s['lancedb_ingest_rows_s']:,.0f}), durable "
                      f"{s['durable_ingest_rows_s']:,.0f} ({s['durable_ingest_ratio']:.1f} x); search {s['qps']:,.0f} "
                      f"q/s ({s['search_ratio']:.1f} x LanceDB {s['lancedb_qps']:,.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path.cwd())
    parser.add_argument("--startup-gib", type=float, default=10.0, help="0 skips the start-up measurement")
    parser.add_argument("--hnsw", action="store_true", help="also build HNSW indexes and measure recall")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: append,search,startup,lancedb")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    skip = set(args.skip.split(","))
    directory = Path(tempfile.mkdtemp(prefix="bench-shards-", dir=args.dir))
    results: dict[str, Any] = {}
    try:
        results["append"] = [] if "append" in skip else bench_append(directory)
        results["search"] = [] if "search" in skip else bench_search(directory, args.hnsw)
        results["startup"] = None if "startup" in skip or not args.startup_gib else bench_startup(directory,
                                                                                                  args.startup_gib)
        results["lancedb"] = None if "lancedb" in skip else bench_lancedb(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    emit(results, args.json, show)


if __name__ == "__main__":
    main()
