"""``shardmgr verify`` speed against a raw sequential read of the same files.

Builds, through the public APIs, ``--gib`` GiB of sealed vector shards (128-d,
1 GiB shards, plus a mid-build one) and ``--queue-gib`` GiB of work-queue
segments (4 KiB tasks, half completed, their results partly delivered), then
times in the same run:

* the default run (structure, headers, sealed checkpoints, sizes, tails);
* the ``--deep`` run (every record, batch and index checksum, all padding);
* a raw sequential read of every file of the directory (16 MiB ``readinto``),
  the baseline: deep GB/s / raw GB/s is the ratio that matters.

Each is measured warm (files in the page cache; best of three) and cold (each
file evicted with ``posix_fadvise(DONTNEED)`` first; needs no root).

Usage: python tools/bench_verify.py [--dir DIR] [--gib 10] [--queue-gib 1] [--keep] [--json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from emit import emit  # tools/emit.py, beside this file
from rich.console import Console
from rich.table import Table

import shardmgr
import workq

DIM = 128
CHUNK_ROWS = 262_144  # 128 MiB of vectors per append
TASK_BYTES = 4096


def build(root: Path, gib: float, queue_gib: float) -> None:
    rng = np.random.default_rng(0)
    chunk = rng.standard_normal((CHUNK_ROWS, DIM), dtype=np.float32)
    with shardmgr.open(root) as store:
        store.create_collection("c", DIM)
        written = 0
        while written < gib * (1 << 30):
            store.append("c", chunk, np.arange(written // chunk.itemsize // DIM, written // chunk.itemsize // DIM
                                               + CHUNK_ROWS, dtype=np.int64))
            written += chunk.nbytes
        store.append("c", chunk[:100_000], np.arange(100_000, dtype=np.int64))  # a mid-build shard
    tasks = int(queue_gib * (1 << 30)) // TASK_BYTES
    payloads = [bytes(rng.integers(0, 256, TASK_BYTES, dtype=np.uint8)) for _ in range(1000)]
    with workq.open(root, reconnect_window_s=0.0, disk_floor_bytes=0) as broker:
        for _ in range(0, tasks, 1000):
            broker.enqueue("job", "m", "s", 0, payloads)
        done = 0
        while done < tasks // 2:
            leased = broker.lease(1000, worker="w")
            broker.complete([i.handle for i in leased], [b"r" * 64] * len(leased))
            done += len(leased)
        broker.results("job", max_items=tasks // 4)


def files_of(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "LOCK")


def evict(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def raw_read(files: list[Path]) -> int:
    buf = bytearray(16 << 20)
    total = 0
    for path in files:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                total += n
    return total


def timed(fn: Callable[[], int], files: list[Path], cold: bool, repeats: int) -> tuple[float, int]:
    """Best (shortest) time of ``repeats`` runs, and the bytes read."""
    best, nbytes = float("inf"), 0
    for _ in range(repeats):
        if cold:
            evict(files)
        started = time.perf_counter()
        nbytes = fn()
        best = min(best, time.perf_counter() - started)
    return best, nbytes


def verified(root: Path, deep: bool) -> Callable[[], int]:
    def run() -> int:
        report = shardmgr.verify(root, deep=deep)
        if report.exit_code != 0:
            raise SystemExit(f"verify found problems in a fresh directory: {report.problems[:5]}")
        return report.bytes_read
    return run


def measure(root: Path) -> dict[str, Any]:
    files = files_of(root)
    size = sum(p.stat().st_size for p in files)
    sealed = sum(p.stat().st_size for p in root.glob("shards/c/*/vectors"))
    results: dict[str, Any] = {"files": len(files), "bytes": size, "runs": []}
    for cold in (False, True):
        repeats = 1 if cold else 3
        raw_s, raw_bytes = timed(lambda: raw_read(files), files, cold, repeats)
        default_s, default_bytes = timed(verified(root, False), files, cold, repeats)
        deep_s, deep_bytes = timed(verified(root, True), files, cold, repeats)
        results["runs"].append({
            "cache": "cold" if cold else "warm", "raw_s": raw_s, "raw_GBps": raw_bytes / raw_s / 1e9,
            "default_s": default_s, "default_bytes": default_bytes,
            "deep_s": deep_s, "deep_GBps": deep_bytes / deep_s / 1e9, "deep_bytes": deep_bytes,
            "deep_ratio": (deep_bytes / deep_s) / (raw_bytes / raw_s)})
    results["vectors_bytes"] = sealed
    return results


def show(results: dict[str, Any]) -> None:
    console = Console()
    table = Table(title=f"verify over {results['bytes'] / (1 << 30):.2f} GiB in {results['files']} files "
                        f"({results['vectors_bytes'] / (1 << 30):.2f} GiB of vectors)")
    for col in ("cache", "raw read GB/s", "default s", "deep s", "deep GB/s", "deep / raw"):
        table.add_column(col, justify="right")
    for run in results["runs"]:
        table.add_row(run["cache"], f"{run['raw_GBps']:.2f}", f"{run['default_s']:.3f}", f"{run['deep_s']:.2f}",
                      f"{run['deep_GBps']:.2f}", f"{run['deep_ratio']:.2f}")
    console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path.cwd())
    parser.add_argument("--gib", type=float, default=10.0, help="GiB of sealed vectors")
    parser.add_argument("--queue-gib", type=float, default=1.0, help="GiB of queue tasks")
    parser.add_argument("--keep", action="store_true", help="keep the data directory (printed)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-verify-", dir=args.dir)) / "data"
    try:
        started = time.perf_counter()
        build(root, args.gib, args.queue_gib)
        built = time.perf_counter() - started
        results = measure(root)
        results["build_s"] = built
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root.parent, ignore_errors=True)
    emit(results, args.json, show)


if __name__ == "__main__":
    main()
