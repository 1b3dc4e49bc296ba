"""Journal benchmark: append bandwidth, durable-wait latency, recovery speed.

Every figure is printed with the ratio to a raw baseline measured in the
same run on the same disk:

(a) raw sequential ``os.write`` + ``fdatasync`` per 1 MiB batch;
(b) journal ``append_batch`` of 1 MiB batches with group commit (the shared
    flusher, 5 ms) at record sizes 512 B, 4 KiB and 64 KiB, in each
    preallocation mode, with the journal's default extent (16 MiB, the size
    each preallocation step adds; ``--extent-mib`` measures another); plus the
    latency of ``wait_durable`` for single appends (target: p99 <= 2 x flush
    interval);
(c) recovery of a 1 GiB journal (read-only open: walk, recount, tail
    checksums) vs a raw sequential read of the same file, warm cache; and
    the worst case where no checkpoint is valid (every record's checksum
    is verified).

The append figures (a, b) run ``--repeats`` times in interleaved rounds
(tools/rounds.py: every configuration once per round), and are printed as
the median with its [min-max]; ratios are of the medians.

Usage: python tools/bench_journal.py [--dir DIR] [--size-mib N] [--repeats N] [--extent-mib N] [--json]
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
from rounds import Spread, interleave, ratio, summarise

from common.journal import Flusher, FlusherConfig, Journal, JournalConfig
from common.journal.header import SLOT_OFFSETS, SLOT_SIZE
from common.journal.record import RECORD_HEADER_SIZE
from common.units import MiB

BATCH_BYTES = 1 * MiB
INTERVAL = 0.005


def raw_write_bandwidth(directory: Path, total: int) -> float:
    """MB/s of os.write + fdatasync per 1 MiB batch (one run)."""
    data = os.urandom(BATCH_BYTES)
    path = directory / "raw"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    started = time.perf_counter()
    for _ in range(total // BATCH_BYTES):
        os.write(fd, data)
        os.fdatasync(fd)
    rate = total / (time.perf_counter() - started) / 1e6
    os.close(fd)
    path.unlink()
    return rate


def raw_group_commit_bandwidth(directory: Path, total: int) -> float:
    """MB/s of os.write of 1 MiB batches with one fdatasync every flush interval:
    the journal's own durability policy with no journal work at all (one run)."""
    data = os.urandom(BATCH_BYTES)
    path = directory / "raw"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    started = last_sync = time.perf_counter()
    for _ in range(total // BATCH_BYTES):
        os.write(fd, data)
        if time.perf_counter() - last_sync >= INTERVAL:
            os.fdatasync(fd)
            last_sync = time.perf_counter()
    os.fdatasync(fd)
    rate = total / (time.perf_counter() - started) / 1e6
    os.close(fd)
    path.unlink()
    return rate


def drop_caches() -> bool:
    """Evict the page cache (needs root); False if not allowed here."""
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def journal_append_bandwidth(directory: Path, total: int, record: int, preallocate: str, extent: int) -> float:
    """MB/s of record bodies appended in 1 MiB batches, all durable at the end (one run)."""
    per_batch = max(1, BATCH_BYTES // (record + RECORD_HEADER_SIZE))
    bodies = np.frombuffer(os.urandom(per_batch * record), dtype=np.uint8).reshape(per_batch, record)
    batches = total // (per_batch * record)
    path = directory / "bench.journal"
    with Flusher(FlusherConfig(interval=INTERVAL)) as flusher:
        journal = Journal.create(path, kind=b"BNCH", flusher=flusher,
                                 config=JournalConfig(preallocate=preallocate, extent_bytes=extent))
        started = time.perf_counter()
        ticket = None
        for _ in range(batches):
            _, ticket = journal.append_batch(bodies)
        journal.wait_durable(ticket)
        rate = batches * per_batch * record / (time.perf_counter() - started) / 1e6
        journal.close()
    path.unlink()
    return rate


#: the append configurations of (a, b): the two raw baselines, then (record size, preallocation mode)
APPENDS: list[str | tuple[int, str]] = ["raw", "group",
                                        *((r, m) for r in (512, 4096, 65536) for m in ("sparse", "fallocate", "zero"))]


def append_rounds(directory: Path, total: int, repeats: int, extent: int) -> list[dict[str, Spread]]:
    """Every configuration of APPENDS ``repeats`` times in interleaved rounds; a {"MBps": Spread} each."""
    def measure(config: str | tuple[int, str]) -> dict[str, float]:
        if config == "raw":
            return {"MBps": raw_write_bandwidth(directory, total)}
        if config == "group":
            return {"MBps": raw_group_commit_bandwidth(directory, total)}
        record, mode = config
        return {"MBps": journal_append_bandwidth(directory, total, record, mode, extent)}

    return [summarise(runs) for runs in interleave(APPENDS, repeats, measure)]


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


def build_journal(path: Path, size: int, record: int, extent: int) -> None:
    per_batch = max(1, 8 * MiB // (record + RECORD_HEADER_SIZE))
    bodies = np.frombuffer(os.urandom(per_batch * record), dtype=np.uint8).reshape(per_batch, record)
    with Flusher(FlusherConfig(interval=INTERVAL)) as flusher:
        journal = Journal.create(path, kind=b"BNCH", flusher=flusher, config=JournalConfig(extent_bytes=extent))
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


def run(directory: Path, size_mib: int, repeats: int, extent_mib: int) -> dict:
    total, extent = size_mib * MiB, extent_mib * MiB
    results: dict = {"flush_interval_ms": INTERVAL * 1e3, "batch_bytes": BATCH_BYTES, "bytes": total,
                     "extent_bytes": extent, "repeats": repeats}
    raw, group, *journals = append_rounds(directory, total, repeats, extent)
    results["raw_write_fdatasync_MBps"] = raw["MBps"].as_dict()
    results["raw_group_commit_MBps"] = group["MBps"].as_dict()
    results["append"] = []
    for (record, mode), spread in zip(APPENDS[2:], journals):
        rate = spread["MBps"]
        results["append"].append({"record": record, "preallocate": mode, "MBps": rate.as_dict(),
                                  "ratio": ratio(rate, raw["MBps"]), "ratio_group": ratio(rate, group["MBps"])})
    p50, p99 = durable_latency(directory, 600)
    results["durable_wait_ms"] = {"p50": p50, "p99": p99, "p99_over_interval": p99 / (INTERVAL * 1e3)}
    results["recovery"] = []
    for record in (512, 4096):
        path, bare = directory / f"recover-{record}.journal", directory / "bare.journal"
        build_journal(path, 1024 * MiB, record, extent)
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


def _cell(figure: dict) -> str:
    """A figure of ``--json``'s shape as median [min–max]."""
    return Spread(figure["median"], figure["min"], figure["max"], tuple(figure["runs"])).cell().replace("\n", " ")


def show(results: dict) -> None:
    console = Console(width=max(Console().width, 120))  # a pipe gets 80 columns: too few for these tables
    raw = results["raw_write_fdatasync_MBps"]
    group = results["raw_group_commit_MBps"]
    table = Table(title=f"(a, b) append, 1 MiB batches, flush every {results['flush_interval_ms']:g} ms, "
                        f"extents of {results['extent_bytes'] // MiB} MiB; MB/s median [min–max] of "
                        f"{results['repeats']} interleaved rounds, ratios of the medians")
    for col in ("what", "MB/s", "x raw write+fdatasync", "x raw group commit"):
        table.add_column(col, justify="right")
    table.add_row("raw os.write + fdatasync per batch", _cell(raw), "1.00", f"{raw['median'] / group['median']:.2f}")
    table.add_row("raw os.write, fdatasync per interval", _cell(group), f"{group['median'] / raw['median']:.2f}",
                  "1.00")
    for row in results["append"]:
        table.add_row(f"journal {row['record']} B records, {row['preallocate']}", _cell(row["MBps"]),
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
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (the median is shown)")
    parser.add_argument("--extent-mib", type=int, default=JournalConfig().extent_bytes // MiB,
                        help="the journals' preallocation step (default: the journal's own default)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="bench-journal-", dir=args.dir))
    try:
        results = run(directory, args.size_mib, args.repeats, args.extent_mib)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    emit(results, args.json, show)


if __name__ == "__main__":
    main()
