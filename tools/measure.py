"""One measured run of tools/bench_workq.py: a fresh server, its phases, its CPU.

Each run starts the peer's server with a fresh data directory (under
``$BENCH_DIR``, default the current directory), measures, then stops the
server and removes the directory. Server CPU is read from /proc (psutil:
user + system time of the server process) at the start and end of each
phase; per item it is that difference over the phase's item count.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from peer import Peer
from peers import peer

PAYLOAD = 512
RESULT = 256
WORKERS = 2
BARRIER_TIMEOUT = 120.0  # s for every process of a run to connect; a dead one breaks the barrier instead of hanging

_fork = mp.get_context("fork")  # drivers and their bound methods go to the children as they are, unpickled


@dataclass(frozen=True)
class Phases:
    """Enqueue ``items`` with one producer, ``batch`` per call, then work them off with WORKERS workers."""

    peer: str
    batch: int
    items: int

    def __str__(self) -> str:
        return f"{self.peer} B={self.batch} ({self.items:,} items)"


@dataclass(frozen=True)
class Producers:
    """``producers`` processes each enqueue one item per call for ``seconds``."""

    peer: str
    producers: int
    seconds: float

    def __str__(self) -> str:
        return f"{self.peer} x{self.producers} producers"


class Mark:
    """Wall clock and the server's CPU time at one instant."""

    def __init__(self, server: psutil.Process) -> None:
        cpu = server.cpu_times()
        self.cpu = cpu.user + cpu.system
        self.clock = time.perf_counter()


def phase(start: Mark, end: Mark, items: int, prefix: str) -> dict[str, float]:
    return {f"{prefix}_per_s": items / (end.clock - start.clock),
            f"{prefix}_cpu_us": (end.cpu - start.cpu) / items * 1e6}


class RssSampler(threading.Thread):
    """Peak RSS of a process, and peak anonymous RSS (RSS less file-backed
    pages, e.g. mapped segments the kernel can drop), sampled every 50 ms."""

    def __init__(self, process: psutil.Process) -> None:
        super().__init__(daemon=True)
        self.process = process
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


def _serving(driver: Peer) -> Path:
    base = Path(tempfile.mkdtemp(prefix=f"bench-{driver.name.replace(' ', '-')}-",
                                 dir=os.environ.get("BENCH_DIR", os.getcwd())))
    try:
        driver.start(base)
    except BaseException:
        shutil.rmtree(base, ignore_errors=True)
        raise
    return base


def measure_phases(config: Phases) -> dict[str, float]:
    """The enqueue phase, then the work phase (until the consumer has every result), of one fresh server."""
    driver = peer(config.peer)
    base = _serving(driver)
    try:
        server = psutil.Process(driver.pid)
        sampler = RssSampler(server)
        sampler.start()
        marks: dict[str, Mark] = {}
        driver.produce(config.items, config.batch, PAYLOAD, lambda: marks.setdefault("enqueue", Mark(server)))
        enqueued = Mark(server)
        row = {"disk_after_enqueue_MB": dir_bytes(base) / 1e6, "rss_after_enqueue_MB": sampler.peak / 1e6}
        _work(driver, config, server, marks)
        done = Mark(server)
        sampler.stop.set()
        row |= phase(marks["enqueue"], enqueued, config.items, "enqueue")
        row |= phase(marks["work"], done, config.items, "work")
        # Phases back to back: the sum of their times, without the set-up between them.
        total = (enqueued.clock - marks["enqueue"].clock) + (done.clock - marks["work"].clock)
        row |= {"end_to_end_per_s": config.items / total,
                "end_to_end_cpu_us": row["enqueue_cpu_us"] + row["work_cpu_us"],
                "rss_peak_MB": sampler.peak / 1e6, "anon_peak_MB": sampler.peak_anon / 1e6}
        leftover = driver.leftover()
        if leftover is not None:
            row["leftover"] = leftover
        return row
    finally:
        driver.stop()
        shutil.rmtree(base, ignore_errors=True)


def _work(driver: Peer, config: Phases, server: psutil.Process, marks: dict[str, Mark]) -> None:
    """WORKERS worker processes and this process's consumer start the clock together; a
    worker that dies stops the server, so the consumer fails instead of waiting forever."""
    barrier = _fork.Barrier(WORKERS + 1, timeout=BARRIER_TIMEOUT)
    stop = _fork.Event()
    workers = [_fork.Process(target=driver.work, args=(i, config.batch, RESULT, barrier.wait, stop))
               for i in range(WORKERS)]
    for proc in workers:
        proc.start()
    watchdog = threading.Thread(target=_watch, args=(workers, stop, driver), daemon=True)
    watchdog.start()

    def begin() -> None:
        barrier.wait()
        marks["work"] = Mark(server)

    try:
        driver.consume(config.items, begin)
    finally:
        stop.set()
        for proc in workers:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    failed = [proc.exitcode for proc in workers if proc.exitcode]
    if failed:
        raise RuntimeError(f"{config}: worker exit codes {failed}")


def _watch(workers: list[Any], stop: Any, driver: Peer) -> None:
    while not stop.wait(0.5):
        if any(proc.exitcode for proc in workers):
            driver.stop()
            return


def _producer(driver: Peer, seconds: float, barrier_wait: Any, counts: Any) -> None:
    """One producer process: puts (items enqueued, its own CPU seconds after the barrier)."""
    started: list[float] = []

    def begin() -> None:
        barrier_wait()
        started.append(time.process_time())

    items = driver.produce_single(seconds, PAYLOAD, begin)
    counts.put((items, time.process_time() - started[0]))


def measure_producers(config: Producers) -> dict[str, float]:
    """Enqueues/s and server CPU per item while ``config.producers`` processes enqueue one item per call."""
    driver = peer(config.peer)
    base = _serving(driver)
    procs: list[Any] = []
    try:
        server = psutil.Process(driver.pid)
        barrier = _fork.Barrier(config.producers + 1, timeout=BARRIER_TIMEOUT)
        counts = _fork.Queue()
        procs = [_fork.Process(target=_producer, args=(driver, config.seconds, barrier.wait, counts))
                 for _ in range(config.producers)]
        for proc in procs:
            proc.start()
        barrier.wait()
        start = Mark(server)
        reports = [counts.get(timeout=config.seconds + BARRIER_TIMEOUT) for _ in procs]
        end = Mark(server)
        items = sum(n for n, _ in reports)
        # The producers share the 2 cores with the server: their CPU says when they, not it, are the limit.
        return {"items": items, "client_cpu_us": sum(cpu for _, cpu in reports) / items * 1e6} | phase(
            start, end, items, "enqueue")
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        driver.stop()
        shutil.rmtree(base, ignore_errors=True)
