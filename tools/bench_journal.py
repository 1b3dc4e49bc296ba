"""Journal benchmark: append bandwidth, durable-wait latency, recovery speed.

Every figure is printed with the ratio to a raw baseline measured in the
same run on the same disk:

(a) raw sequential ``os.write`` + ``fdatasync`` per 1 MiB batch;
(b) journal ``append_batch`` of 1 MiB batches with group commit (the shared
    flusher, 5 ms) at record sizes 512 B, 4 KiB and 64 KiB, in each
    preallocation mode; plus the latency of ``wait_durable`` for single
    appends (target: p99 <= 2 x flush interval);
(c) recovery of a 1 GiB journal (read-only open: walk, recount, tail
    checksums) vs a raw sequential read of the same file, warm cache; and
    the worst case where no checkpoint is valid (every record's checksum
    is verified).

Usage: python tools/bench_journal.py [--dir DIR] [--size-mib N] [--json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from emit import emit  # tools/emit.py, beside this file
from rich.console import Console
from rich.table import Table

from common.journal import Flusher, FlusherConfig, Journal, JournalConfig
from common.journal.header import SLOT_OFFSETS, SLOT_SIZE
from common.journal.record import RECORD_HEADER_SIZE
from common.units import MiB

BATCH_BYTES = 1 * MiB
INTERVAL = 0.005


def raw_write_bandwidth(directory: Path, total: int, repeats: int) -> float:
    """MB/s of os.write + fdatasync per 1 MiB batch (median of repeats)."""
    data = os.urandom(BATCH_BYTES)
    rates = []
    for _ in range(repeats):
        path = directory / "raw"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        started = time.perf_counter()
        for _ in range(total // BATCH_BYTES):
            os.write(fd, data)
            os.fdatasync(fd)
        rates.append(total / (time.perf_counter() - started) / 1e6)
        os.close(fd)
        path.unlink()
    return statistics.median(rates)


def raw_group_commit_bandwidth(directory: Path, total: int, repeats: int) -> float:
    """MB/s of os.write of 1 MiB batches with one fdatasync every flush interval:
    the journal's own durability policy with no journal work at all."""
    data = os.urandom(BATCH_BYTES)
    rates = []
    for _ in range(repeats):
        path = directory / "raw"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        started = last_sync = time.perf_counter()
        for _ in range(total // BATCH_BYTES):
            os.write(fd, data)
            if time.perf_counter() - last_sync >= INTERVAL:
                os.fdatasync(fd)
                last_sync = time.perf_counter()
        os.fdatasync(fd)
        rates.append(total / (time.perf_counter() - started) / 1e6)
        os.close(fd)
        path.unlink()
    return statistics.median(rates)


def drop_caches() -> bool:
    """Evict the page cache (needs root); False if not allowed here."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def journal_append_bandwidth(directory: Path, total: int, record: int, preallocate: str, repeats: int) -> float:
    """MB/s of record bodies appended in 1 MiB batches, all durable at the end."""
    per_batch = max(1, BATCH_BYTES // (record + RECORD_HEADER_SIZE))
    bodies = np.frombuffer(os.urandom(per_batch * record), dtype=np.uint8).reshape(per_batch, record)
    batches = total // (per_batch * record)
    rates = []
    for _ in range(repeats):
        path = directory / "bench.journal"
        with Flusher(FlusherConfig(interval=INTERVAL)) as flusher:
            journal = Journal.create(path, kind=b"BNCH", flusher=flusher,
                                     config=JournalConfig(preallocate=preallocate, extent_bytes=64 * MiB))
            started = time.perf_counter()
            ticket = None
            for _ in range(batches):
                _, ticket = journal.append_batch(bodies)
            journal.wait_durable(ticket)
            rates.append(batches * per_batch * record / (time.perf_counter() - started) / 1e6)
            journal.close()
        path.unlink()
    return statistics.median(rates)


def durable_latency(directory: Path, samples: int) -> tuple[float, float]:
    """p50 and p99 (ms) from append to wait_durable returning, one record at a time."""
    path = directory / "latency.journal"
    latencies = []
    with Flusher(FlusherConfig(interval=INTERVAL)) as flusher:
        journal = Journal.create(path, kind=b"BNCH", flusher=flusher)
        body = os.urandom(4096)
        for i in range(samples):
            time.sleep((i % 7) / 7 * INTERVAL)  # arrive at every phase of the flush cycle
            started = time.perf_counter()
            _, ticket = journal.append(body)
            journal.wait_durable(ticket)
            latencies.append((time.perf_counter() - started) * 1e3)
        journal.close()
    path.unlink()
    return float(np.percentile(latencies, 50)), float(np.percentile(latencies, 99))


def build_journal(path: Path, size: int, record: int) -> None:
    per_batch = max(1, 8 * MiB // (record + RECORD_HEADER_SIZE))
    bodies = np.frombuffer(os.urandom(per_batch * record), dtype=np.uint8).reshape(per_batch, record)
    with Flusher(FlusherConfig(interval=INTERVAL)) as flusher:
        journal = Journal.create(path, kind=b"BNCH", flusher=flusher, config=JournalConfig(extent_bytes=64 * MiB))
        while journal.end < size:
            journal.append_batch(bodies)
        journal.close()


def raw_read_bandwidth(path: Path) -> float:
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    buf = bytearray(8 * MiB)
    started = time.perf_counter()
    while os.readv(fd, [buf]):
        pass
    elapsed = time.perf_counter() - started
    os.close(fd)
    return size / elapsed / 1e6


def recovery_bandwidth(path: Path) -> tuple[float, int]:
    size = path.stat().st_size
    started = time.perf_counter()
    journal = Journal.open(path, writable=False)
    elapsed = time.perf_counter() - started
    count = journal.count
    journal.close()
    return size / elapsed / 1e6, count


def without_checkpoint(path: Path, copy: Path) -> None:
    shutil.copyfile(path, copy)
    with open(copy, "r+b") as f:
        for off in SLOT_OFFSETS:
            f.seek(off)
            f.write(bytes(SLOT_SIZE))


def run(directory: Path, size_mib: int, repeats: int) -> dict:
    total = size_mib * MiB
    results: dict = {"flush_interval_ms": INTERVAL * 1e3, "batch_bytes": BATCH_BYTES, "bytes": total}
    raw = raw_write_bandwidth(directory, total, repeats)
    results["raw_write_fdatasync_MBps"] = raw
    group = raw_group_commit_bandwidth(directory, total, repeats)
    results["raw_group_commit_MBps"] = group
    results["append"] = []
    for record in (512, 4096, 65536):
        for mode in ("sparse", "fallocate", "zero"):
            rate = journal_append_bandwidth(directory, total, record, mode, repeats)
            results["append"].append({"record": record, "preallocate": mode, "MBps": rate, "ratio": rate / raw,
                                      "ratio_group": rate / group})
    p50, p99 = durable_latency(directory, 600)
    results["durable_wait_ms"] = {"p50": p50, "p99": p99, "p99_over_interval": p99 / (INTERVAL * 1e3)}
    results["recovery"] = []
    for record in (512, 4096):
        path, bare = directory / f"recover-{record}.journal", directory / "bare.journal"
        build_journal(path, 1024 * MiB, record)
        raw_read_bandwidth(path)  # warm the cache for both
        raw_read = statistics.median(raw_read_bandwidth(path) for _ in range(3))
        rec = statistics.median(recovery_bandwidth(path)[0] for _ in range(3))
        without_checkpoint(path, bare)
        raw_read_bandwidth(bare)
        full = statistics.median(recovery_bandwidth(bare)[0] for _ in range(3))
        results["recovery"].append({"record": record, "raw_read_MBps": raw_read, "recovery_MBps": rec,
                                    "ratio": rec / raw_read, "no_checkpoint_MBps": full,
                                    "no_checkpoint_ratio": full / raw_read})
        if drop_caches():
            raw_cold = raw_read_bandwidth(path)
            drop_caches()
            rec_cold = recovery_bandwidth(path)[0]
            results["recovery"][-1].update(cold_raw_read_MBps=raw_cold, cold_recovery_MBps=rec_cold,
                                           cold_ratio=rec_cold / raw_cold)
        path.unlink()
        bare.unlink()
    return results


def show(results: dict) -> None:
    console = Console()
    raw = results["raw_write_fdatasync_MBps"]
    group = results["raw_group_commit_MBps"]
    table = Table(title=f"(a, b) append, 1 MiB batches, flush every {results['flush_interval_ms']:g} ms")
    for col in ("what", "MB/s", "x raw write+fdatasync", "x raw group commit"):
        table.add_column(col, justify="right")
    table.add_row("raw os.write + fdatasync per batch", f"{raw:,.0f}", "1.00", f"{raw / group:.2f}")
    table.add_row("raw os.write, fdatasync per interval", f"{group:,.0f}", f"{group / raw:.2f}", "1.00")
    for row in results["append"]:
        table.add_row(f"journal {row['record']} B records, {row['preallocate']}", f"{row['MBps']:,.0f}",
                      f"{row['ratio']:.2f}", f"{row['ratio_group']:.2f}")
    console.print(table)
    lat = results["durable_wait_ms"]
    console.print(f"durable wait, single 4 KiB appends: p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms "
                  f"= {lat['p99_over_interval']:.2f} x flush interval")
    table = Table(title="(c) recovery of a 1 GiB journal (warm cache)")
    for col in ("records", "raw read MB/s", "recovery MB/s", "x raw", "no checkpoint MB/s", "x raw"):
        table.add_column(col, justify="right")
    for row in results["recovery"]:
        table.add_row(f"{row['record']} B", f"{row['raw_read_MBps']:,.0f}", f"{row['recovery_MBps']:,.0f}",
                      f"{row['ratio']:.2f}", f"{row['no_checkpoint_MBps']:,.0f}", f"{row['no_checkpoint_ratio']:.2f}")
    console.print(table)
    cold = [row for row in results["recovery"] if "cold_ratio" in row]
    for row in cold:
        console.print(f"cold cache, {row['record']} B records: raw read {row['cold_raw_read_MBps']:,.0f} MB/s, "
                      f"recovery {row['cold_recovery_MBps']:,.0f} MB/s = {row['cold_ratio']:.2f} x raw")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="where to write (the disk under test)")
    parser.add_argument("--size-mib", type=int, default=256, help="bytes written per append measurement")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (the median is shown)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="bench-journal-", dir=args.dir))
    try:
        results = run(directory, args.size_mib, args.repeats)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    emit(results, args.json, show)


if __name__ == "__main__":
    main()
