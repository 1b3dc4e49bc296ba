"""What it costs the disk to make one shard batch durable, at the syscall
level: the layouts a durable append could use, against a raw ``os.writev``
of the same bytes plus ``fdatasync`` per batch to one new file (the baseline
of tools/bench_shards.py). No store code runs: only the writes and syncs of
each layout, so the figures say what the file layout allows, not what the
store's Python adds.

Layouts (each batch: float32 vectors of DIM and int64 ids; files as a shard
has them, the vectors file ``fallocate``d unless said, the journal and the
ids file grown by writing zeros and synced once before the timed loop):

* ``v1``: vectors, ids and a 40-byte record, three fdatasyncs in a row (the
  version 1 batch record: the ids file synced with every flush);
* ``v2-seq``: vectors and a record carrying the ids, two fdatasyncs in a row;
* ``v2``: the same two fdatasyncs at once, the journal's on a helper thread
  (what common/journal/syncer.py does);
* ``zero-free``: ``v2-seq`` with the vectors file's zeros written and synced
  before the timed loop (what zero-filling ahead could give at best);
* ``zero-inline``: ``v2-seq`` writing and syncing the zeros in 8 MiB steps
  inside the loop;
* ``zero-thread``: ``v2-seq`` with a thread writing zeros 8 MiB ahead of
  the writer and syncing them in 1 MiB steps.

Usage: ``python tools/bench_syncs.py [--dir DIR] [--batches 300] [--dim 128]
[--batch 1000] [--runs 7] [--layouts raw,v1,v2-seq,v2,...]``; DIR defaults to
$BENCH_DIR, else the current directory. Printed: MB/s of vector + id bytes,
median [min-max] of interleaved runs (tools/rounds.py), and ratios of
medians to ``raw``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rounds import interleave, ratio, summarise

ZEROS = bytes(1 << 20)
LAYOUTS = ("raw", "v1", "v2-seq", "v2", "zero-free", "zero-inline", "zero-thread")
RECORD_TRAILER = 24  # a version 2 record carries the ids, then 24 bytes (and a 16-byte journal header)


def zero(fd: int, start: int, length: int) -> None:
    pos = start
    while pos < start + length:
        pos += os.pwrite(fd, ZEROS[:min(len(ZEROS), start + length - pos)], pos)


class Batches:
    """The bytes of one run: ``count`` batches of vectors and ids."""

    def __init__(self, count: int, dim: int, rows: int) -> None:
        self.count = count
        self.vectors = os.urandom(rows * dim * 4)
        self.ids = os.urandom(rows * 8)

    @property
    def megabytes(self) -> float:
        return self.count * (len(self.vectors) + len(self.ids)) / 1e6


def raw(directory: Path, b: Batches) -> float:
    fd = os.open(directory / "raw", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    started = time.perf_counter()
    for _ in range(b.count):
        os.writev(fd, [b.vectors, b.ids])
        os.fdatasync(fd)
    elapsed = time.perf_counter() - started
    os.close(fd)
    return elapsed


def shard(directory: Path, b: Batches, layout: str) -> float:
    """One run of a shard layout; seconds of its timed loop."""
    opened = {name: os.open(directory / name, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
              for name in ("vectors", "ids", "journal")}
    vectors, ids, journal = opened["vectors"], opened["ids"], opened["journal"]
    v1 = layout == "v1"
    record = b"r" * 40 if v1 else b.ids + b"t" * (RECORD_TRAILER + 16)
    zero(journal, 0, 4096 + b.count * len(record))
    zero(ids, 0, 4096 + b.count * len(b.ids))
    total = 4096 + b.count * len(b.vectors)
    if layout == "zero-free":
        zero(vectors, 0, total)
    for fd in opened.values():
        os.fsync(fd)
    started = time.perf_counter()
    if layout != "zero-free":
        os.posix_fallocate(vectors, 0, total + (8 << 20))
    with Runway(vectors, layout) as runway, ThreadPoolExecutor(1) as helper:
        for i in range(b.count):
            at = 4096 + i * len(b.vectors)
            runway.before(at + len(b.vectors))
            os.pwrite(vectors, b.vectors, at)
            runway.wrote(at + len(b.vectors))
            if v1:
                os.pwrite(ids, b.ids, 4096 + i * len(b.ids))
            os.pwrite(journal, record, 4096 + i * len(record))
            if layout == "v2":
                synced = helper.submit(os.fdatasync, journal)
                os.fdatasync(vectors)
                synced.result()
                continue
            os.fdatasync(vectors)
            if v1:
                os.fdatasync(ids)
            os.fdatasync(journal)
    elapsed = time.perf_counter() - started
    for fd in opened.values():
        os.close(fd)
    return elapsed


class Runway:
    """Zeros written ahead of the writer in the vectors file (zero-inline,
    zero-thread); nothing for the other layouts."""

    AHEAD, STEP = 8 << 20, 1 << 20

    def __init__(self, fd: int, layout: str) -> None:
        self.fd, self.layout = fd, layout
        self.zeroed = self.written = 4096
        self.cond = threading.Condition()
        self.stop = False
        self.thread = threading.Thread(target=self._fill) if layout == "zero-thread" else None

    def __enter__(self) -> Runway:
        if self.thread is not None:
            self.thread.start()
            with self.cond:
                self.cond.wait_for(lambda: self.zeroed >= 4096 + self.AHEAD)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.thread is not None:
            with self.cond:
                self.stop = True
                self.cond.notify_all()
            self.thread.join()

    def before(self, end: int) -> None:
        if self.layout == "zero-inline" and self.zeroed < end:
            zero(self.fd, self.zeroed, self.AHEAD)
            os.fdatasync(self.fd)
            self.zeroed += self.AHEAD

    def wrote(self, end: int) -> None:
        if self.thread is not None:
            with self.cond:
                self.written = end
                self.cond.notify_all()

    def _fill(self) -> None:
        while True:
            with self.cond:
                self.cond.wait_for(lambda: self.stop or self.zeroed - self.written < self.AHEAD)
                if self.stop:
                    return
                start = max(self.zeroed, self.written)
            zero(self.fd, start, self.STEP)
            os.fdatasync(self.fd)
            with self.cond:
                self.zeroed = start + self.STEP
                self.cond.notify_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("BENCH_DIR") or Path.cwd()))
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1000, help="rows per batch")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    if layouts[0] != "raw" or not set(layouts) <= set(LAYOUTS):
        parser.error(f"--layouts: raw first, then any of {', '.join(LAYOUTS[1:])}")
    b = Batches(args.batches, args.dim, args.batch)
    with tempfile.TemporaryDirectory(prefix="bench-syncs-", dir=args.dir) as tmp:
        directory = Path(tmp)

        def measure(layout: str) -> dict[str, float]:
            run: Callable[[], float] = (lambda: raw(directory, b)) if layout == "raw" else (
                lambda: shard(directory, b, layout))
            return {"MBps": b.megabytes / run()}

        runs = interleave(layouts, args.runs, measure)
    summaries = [summarise(r)["MBps"] for r in runs]
    print(f"{args.batches} batches of {args.batch:,} x {args.dim}: MB/s of vector + id bytes, median [min-max] "
          f"of {args.runs} interleaved runs; ratio of medians to raw")
    for layout, s in zip(layouts, summaries):
        print(f"  {layout:12s} {s.median:8,.0f} [{s.low:,.0f}-{s.high:,.0f}]  {ratio(s, summaries[0]):.2f}")


if __name__ == "__main__":
    main()
