"""workq as a peer of tools/bench_workq.py: ``shardmgr serve`` and the workq clients.

Group commit is the server's default (5 ms): ``Workq`` enqueues and
completes without waiting for the flush (each acknowledged write is durable
at the next round, as Redis ``everysec`` acknowledges before its fsync);
``WorkqDurable`` passes ``durable=True`` to every enqueue and completion, so
each call returns after the flush that covers it (as Redis ``always``).
Workers use ``Worker.lease`` and ``Worker.complete`` (which stores the
result and retires the task in one call).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
from peer import JOB, SYNCED, Begin, Peer

import workq
from shardmgr.server import readiness


class Workq(Peer):
    name = "workq"
    durable = False
    pipelined = False  # clients send without waiting for each answer (WorkqPipelined)
    one_trip = False  # workers complete and lease in one call (WorkqOneTrip)
    #: options ``shardmgr serve`` is started with (WorkqEverySecond: a longer group-commit interval)
    serve_options: tuple[str, ...] = ()

    def start(self, base: Path, prefix: Sequence[str] = (), extra: Sequence[str] = ()) -> None:
        """``shardmgr serve`` (``prefix``: what to run it under; ``extra``: more options) on a free port."""
        ready, log = base / "data.ready", base / "data.log"
        with open(log, "wb") as stderr:  # the server's log: kept beside the data, shown if it fails to start
            command = [sys.executable, "-m", "shardmgr", "serve", "--data", str(base / "data"), "--port", "0",
                       "--ready-file", str(ready), *self.serve_options, *extra]
            self.proc = subprocess.Popen([*prefix, *command], stderr=stderr)
        host, port = readiness.wait(ready, self.proc, 3600, log=log.read_text)
        self.address = f"{host}:{port}"

    def produce(self, items: int, batch: int, size: int, begin: Begin) -> None:
        payloads = [os.urandom(size) for _ in range(batch)]
        with workq.connect(self.address) as client:
            enqueue = client.enqueue_async if self.pipelined else client.enqueue
            begin()
            for start in range(0, items, batch):
                enqueue(JOB, "m", "s", 1, payloads[: min(batch, items - start)], durable=self.durable)
            client.settle()  # the answers still in flight (pipelined)

    def work(self, index: int, batch: int, size: int, begin: Begin, stop: Any) -> None:
        result = os.urandom(size)
        with workq.Worker(self.address, f"w{index}", models=["m"]) as worker:
            complete = worker.complete_async if self.pipelined else worker.complete
            begin()
            if self.one_trip:
                self._work_one_trip(worker, batch, result, stop, self.durable)
                return
            while True:
                items = worker.lease(batch, wait=0.2)
                if not items:
                    worker.settle()  # the completions still in flight (pipelined)
                    if stop.is_set():
                        return
                elif batch == 1:  # the single-item form a new user writes
                    complete(items[0].handle, result, self.durable)
                else:
                    complete([i.handle for i in items], [result] * len(items), self.durable)

    @staticmethod
    def _work_one_trip(worker: workq.Worker, batch: int, result: bytes, stop: Any, durable: bool) -> None:
        """The documented one-item loop (docs/workq.md, "One round trip per
        item"): each call completes the last items and leases the next."""
        items = worker.lease(batch, wait=0.2)
        while items or not stop.is_set():
            if not items:
                items = worker.lease(batch, wait=0.2)
            elif batch == 1:
                _, items = worker.complete_and_lease(items[0].handle, result, 1, wait=0.2, durable=durable)
            else:
                _, items = worker.complete_and_lease([i.handle for i in items], [result] * len(items), batch,
                                                     wait=0.2, durable=durable)

    def consume(self, items: int, begin: Begin) -> None:
        got = 0
        with workq.connect(self.address) as client:
            begin()
            while got < items:
                got += len(client.results(JOB, max_items=5000, wait=1.0))

    def produce_single(self, seconds: float, size: int, begin: Begin) -> int:
        payload = [os.urandom(size)]
        count = 0
        with workq.connect(self.address) as client:
            begin()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                client.enqueue(JOB, "m", "s", 1, payload, durable=self.durable)
                count += 1
        return count

    def leftover(self) -> int | None:
        with workq.connect(self.address) as client:
            status = client.job_status(JOB)
        return int(status["pending"]) + int(status["in_flight"])


class WorkqDurable(Workq):
    name = "workq durable"
    durable = True
    durability = SYNCED


class WorkqEverySecond(Workq):
    """Group commit at Redis ``everysec``'s interval: ``shardmgr serve
    --flush-interval-ms 1000``, so an acknowledged write may wait up to a
    second for its flush, as Redis's may. Not the default (5 ms, 200 rounds
    a second): this is how much of a gap to ``everysec`` is the fsync rate."""

    name = "workq 1s"
    serve_options = ("--flush-interval-ms", "1000")


class WorkqPipelined(Workq):
    """Still one item per call, but the clients do not wait for each reply
    (docs/workq.md, "Pipelining"): the producer calls ``enqueue_async``, the
    worker leases as before and completes with ``complete_async``. The code
    keeps the per-call shape; only the method names change."""

    name = "workq pipelined"
    pipelined = True
    worker_trips = 1  # the worker waits for its leases only


class WorkqOneTrip(Workq):
    """Still one item per call, with the one-item loop docs/workq.md shows:
    ``Worker.complete_and_lease`` completes an item and leases the next in
    one round trip (the producer enqueues as ``workq`` does)."""

    name = "workq one-trip"
    one_trip = True
    worker_trips = 1


def _memory(process: psutil.Process, queued: int) -> dict[str, Any]:
    info = process.memory_info()
    return {"queued": queued, "rss_MB": round(info.rss / 1e6, 1), "anon_MB": round((info.rss - info.shared) / 1e6, 1)}


def backlog_rss(items: int, batch: int, size: int) -> dict[str, Any]:
    """workq's server RSS as a backlog of ``items`` builds up (sampled each 10%),
    then the time a restart takes to be ready with all of it pending."""
    base = Path(tempfile.mkdtemp(prefix="bench-rss-", dir=os.environ.get("BENCH_DIR", os.getcwd())))
    peer = Workq()
    peer.start(base)
    samples = []
    try:
        payloads = [os.urandom(size) for _ in range(batch)]
        process = psutil.Process(peer.pid)
        started = time.perf_counter()
        with workq.connect(peer.address) as client:
            for start in range(0, items, batch):
                client.enqueue(JOB, "m", "s", 1, payloads)
                if (start // batch) % max(1, items // batch // 10) == 0:
                    samples.append(_memory(process, start + batch))
            samples.append(_memory(process, items))
            status = client.job_status(JOB)
        elapsed = time.perf_counter() - started
        disk = sum(f.stat().st_size for f in base.rglob("*") if f.is_file())
        peer.stop()
        restarted = time.perf_counter()
        peer.start(base)  # recovers the whole backlog before it listens
        restart_s = time.perf_counter() - restarted
        return {"items": items, "enqueue_per_s": round(items / elapsed), "disk_GB": round(disk / 1e9, 2),
                "pending": status["pending"], "restart_to_ready_s": round(restart_s, 2),
                "rss_after_restart": _memory(psutil.Process(peer.pid), items), "rss": samples}
    finally:
        peer.stop()
        shutil.rmtree(base, ignore_errors=True)
