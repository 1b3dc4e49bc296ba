"""Exactly-once observable completion under faults, with real processes.

N tasks are enqueued with durable=True; worker processes lease and complete
them; the test SIGKILLs workers and the server at random points many times
and restarts them, while a consumer collects results. At the end the
consumer has exactly N results, one per handle, each the right one, and the
broker never handed out two different results for one handle.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.journal.check import Findings, Severity
from common.wire.errors import Unavailable
from shardmgr.verification import queue_checks as queue_check
from tests.shardmgr.server.serverproc import ServerProcess
from workq import QueueClient

from .worker_child import result_of

CHILD = Path(__file__).with_name("worker_child.py")


def start_worker(address: str, name: str, seed: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, str(CHILD), address, name, str(seed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def collect(client: QueueClient, job: str, got: dict[int, bytes]) -> None:
    """Read results straight off the wire (no client-side dedupe) and check repeats."""
    try:
        reply = client.rpc.call("workq.results", {"job": job, "max_items": 500, "wait": 0.2})
    except Unavailable:
        return
    parts = reply.parts
    ends = parts["lengths"].cumsum().tolist()
    data = parts["data"].tobytes()
    for h, start, end in zip(parts["handles"].tolist(), [0, *ends[:-1]], ends):
        payload = data[start:end]
        assert got.get(h, payload) == payload, f"two different results for handle {h}"
        got[h] = payload


def run_faults(tmp_path: Path, items: int, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    config = tmp_path / "server.toml"
    config.write_text("[workq]\nlease_s = 1.0\ndisconnect_grace_s = 1.0\nreconnect_window_s = 1.5\n"
                      "max_deliveries = 1000\nsegment_bytes = 1048576\nmax_payload_bytes = 65536\n")
    server = ServerProcess(tmp_path / "data", "--config", str(config)).start()
    workers: dict[str, subprocess.Popen[bytes]] = {}
    client = QueueClient(server.address, retry_for=120.0, timeout=60.0)
    try:
        payloads = {}
        for start in range(0, items, 500):
            batch = [f"task-{i}".encode() * rng.randint(1, 20) for i in range(start, min(items, start + 500))]
            handles = client.enqueue("job", "m", "s", rng.choice([1, 2]), batch, durable=True)
            payloads.update((h.packed, p) for h, p in zip(handles, batch))
        for i in range(3):
            workers[f"w{i}"] = start_worker(server.address, f"w{i}", seed * 100 + i)
        got: dict[int, bytes] = {}
        kills = {"server": 0, "worker": 0}
        for _ in range(rounds):
            deadline = time.monotonic() + rng.uniform(0.2, 1.2)
            while time.monotonic() < deadline:
                collect(client, "job", got)
            if rng.random() < 0.35:
                kills["server"] += 1
                server.signal(signal.SIGKILL)
                server.wait()
                time.sleep(rng.uniform(0, 0.5))
                server.start()
            else:
                kills["worker"] += 1
                name = rng.choice(sorted(workers))
                workers[name].send_signal(signal.SIGKILL)
                workers[name].wait()
                workers[name] = start_worker(server.address, name, rng.randrange(1 << 30))
        assert kills["server"] and kills["worker"], kills  # both kinds of kill -9 happened
        deadline = time.monotonic() + 180
        while len(got) < items and time.monotonic() < deadline:
            collect(client, "job", got)
        assert len(got) == items, f"{len(got)} of {items} results after the faults"
        assert set(got) == set(payloads)
        for handle, payload in payloads.items():
            assert got[handle] == result_of(payload)
        status = client.job_status("job")
        assert status["completed"] == items and status["pending"] == 0 and status["buried"] == 0
        server.signal(signal.SIGKILL)  # one last kill: what it leaves is only for recovery to repair
        server.wait()
        findings = Findings()
        queue_check.check(tmp_path / "data" / "workq", findings, deep=True)
        assert findings.worst() <= Severity.REPAIRABLE, findings.problems
    finally:
        for proc in workers.values():
            proc.kill()
            proc.wait()
        client.close()
        server.kill()


def test_exactly_once_under_sigkill(tmp_path: Path) -> None:
    run_faults(tmp_path, items=1500, rounds=6, seed=7)  # 2 server kills, 4 worker kills (the soak: 120 kills)


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_exactly_once_under_sigkill_soak(tmp_path: Path) -> None:
    run_faults(tmp_path, items=50_000, rounds=120, seed=11)
