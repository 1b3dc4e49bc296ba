"""Work-queue benchmark: workq against real peers on the same machine, same workload.

Every server is started by this script on loopback, with a fresh data
directory on the disk under test:

* workq (``shardmgr serve``), group commit (5 ms) and ``durable=True``;
* Redis 7 streams with a consumer group, ``appendonly yes`` with
  ``appendfsync everysec`` and ``always``;
* beanstalkd with its binlog and ``-f 5`` (fsync at most every 5 ms);
* NATS JetStream, file storage, work-queue retention (default sync).

Workload (the same batching and pipelining for all): one producer enqueues
N items of 512 bytes in batches of 1000; then 2 worker processes lease
batches of up to 1000, publish a 256-byte result per item and ack; a
consumer collects results until all N are delivered. Printed: items/s of the
enqueue phase, of the work phase and end to end, the server's peak RSS and
its data directory's size after the enqueue phase, and workq's ratios to
each peer.

Usage: python tools/bench_workq.py [--items N] [--peers redis,beanstalkd,nats] [--json]
       python tools/bench_workq.py --rss-items 10000000   # workq RSS with a 10M backlog
Needs redis-server, beanstalkd and nats-server on PATH (Debian packages),
and the Python clients redis, greenstalk-free raw sockets, nats-py.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
from peers import PEERS, Peer  # noqa: E402  (tools/peers.py, beside this file)
from rich.console import Console
from rich.table import Table

PAYLOAD = 512
RESULT = 256
BATCH = 1000
WORKERS = 2


class RssSampler(threading.Thread):
    """Peak RSS of a process, and peak anonymous RSS (RSS less file-backed
    pages, e.g. mapped segments the kernel can drop), sampled every 50 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process(pid)
        self.peak = self.peak_anon = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                info = self.process.memory_info()
            except psutil.Error:
                return
            self.peak = max(self.peak, info.rss)
            self.peak_anon = max(self.peak_anon, info.rss - info.shared)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_peer(peer: Peer, items: int) -> dict[str, Any]:
    base = Path(tempfile.mkdtemp(prefix=f"bench-{peer.name}-", dir=os.environ.get("BENCH_DIR", os.getcwd())))
    try:
        peer.start(base)
        sampler = RssSampler(peer.pid)
        sampler.start()
        started = time.perf_counter()
        peer.produce(items, BATCH, PAYLOAD)
        enqueued = time.perf_counter()
        backlog_bytes = dir_bytes(base)
        backlog_rss = sampler.peak
        stop = mp.Event()
        workers = [mp.Process(target=peer.work, args=(i, BATCH, RESULT, stop)) for i in range(WORKERS)]
        for proc in workers:
            proc.start()
        peer.consume(items)
        done = time.perf_counter()
        stop.set()
        for proc in workers:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
        sampler.stop.set()
        return {"peer": peer.name, "enqueue_per_s": items / (enqueued - started),
                "work_per_s": items / (done - enqueued), "end_to_end_per_s": items / (done - started),
                "rss_after_enqueue_MB": backlog_rss / 1e6, "rss_peak_MB": sampler.peak / 1e6,
                "anon_peak_MB": sampler.peak_anon / 1e6,
                "disk_after_enqueue_MB": backlog_bytes / 1e6}
    finally:
        peer.stop()
        shutil.rmtree(base, ignore_errors=True)


def show(rows: list[dict[str, Any]], items: int) -> None:
    table = Table(title=f"{items:,} items of {PAYLOAD} B, batches of {BATCH}, {WORKERS} workers, results of {RESULT} B")
    for col in ("system", "enqueue/s", "work/s", "end-to-end/s", "RSS after enqueue", "RSS peak", "anon peak",
                "disk"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(row["peer"], f"{row['enqueue_per_s']:,.0f}", f"{row['work_per_s']:,.0f}",
                      f"{row['end_to_end_per_s']:,.0f}", f"{row['rss_after_enqueue_MB']:,.0f} MB",
                      f"{row['rss_peak_MB']:,.0f} MB", f"{row['anon_peak_MB']:,.0f} MB",
                      f"{row['disk_after_enqueue_MB']:,.0f} MB")
    console = Console()
    console.print(table)
    ours = {r["peer"]: r for r in rows if r["peer"].startswith("workq")}
    ratios = Table(title="workq / peer")
    for col in ("workq mode", "peer", "enqueue", "work", "end-to-end"):
        ratios.add_column(col, justify="right")
    for name, mine in ours.items():
        for row in rows:
            if not row["peer"].startswith("workq"):
                ratios.add_row(name, row["peer"], *(f"{mine[k] / row[k]:.2f}" for k in
                                                    ("enqueue_per_s", "work_per_s", "end_to_end_per_s")))
    console.print(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=200_000)
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, from {','.join(PEERS)}")
    parser.add_argument("--rss-items", type=int, default=0, help="only measure workq's RSS with this backlog")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.rss_items:
        from peers import backlog_rss

        print(json.dumps(backlog_rss(args.rss_items, BATCH, PAYLOAD), indent=2))
        return
    rows = [run_peer(PEERS[name](), args.items) for name in args.peers.split(",")]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        show(rows, args.items)


if __name__ == "__main__":
    main()
