"""workq through a real ``shardmgr serve`` process: wire errors, workers
that vanish, workers that outlive a server restart, the operator CLI."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from common.wire.errors import BadRequest, NotFound
from tests.shardmgr.server.serverproc import ServerProcess
from workq import Handle, NotLeased, PayloadTooLarge, QueueClient, UnknownHandle, Worker

CONFIG = ("[workq]\nlease_s = 30.0\ndisconnect_grace_s = 0.5\nreconnect_window_s = 2.0\n"
          "max_payload_bytes = 1000\nmax_deliveries = 2\n")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    config = tmp_path / "server.toml"
    config.write_text(CONFIG)
    proc = ServerProcess(tmp_path / "data", "--config", str(config)).start()
    yield proc
    proc.kill()


def test_wire_errors_name_the_problem(server: ServerProcess) -> None:
    with QueueClient(server.address) as client:
        with pytest.raises(BadRequest, match="argument 'job' must be str, got int"):
            client.rpc.call("workq.enqueue", {"job": 5, "model": "m", "shape": "s", "lane": 1},
                            {"data": np.zeros(1, np.uint8), "lengths": np.ones(1, np.uint32)})
        with pytest.raises(BadRequest, match="sum to the 3 data bytes"):
            client.rpc.call("workq.enqueue", {"job": "j", "model": "m", "shape": "s", "lane": 1},
                            {"data": np.zeros(3, np.uint8), "lengths": np.array([1, 1], np.uint32)})
        with pytest.raises(BadRequest, match="non-negative and sum to the 3 data bytes"):  # a sum that fits
            client.rpc.call("workq.enqueue", {"job": "j", "model": "m", "shape": "s", "lane": 1},
                            {"data": np.zeros(3, np.uint8), "lengths": np.array([4, -1], np.int32)})
        with pytest.raises(BadRequest, match="part 'data' must have 1 dimensions"):
            client.rpc.call("workq.enqueue", {"job": "j", "model": "m", "shape": "s", "lane": 1},
                            {"data": np.zeros((1, 1), np.uint8), "lengths": np.ones(1, np.uint32)})
        with pytest.raises(BadRequest, match="part 'lengths' must have dtype"):
            client.rpc.call("workq.enqueue", {"job": "j", "model": "m", "shape": "s", "lane": 1},
                            {"data": np.zeros(1, np.uint8), "lengths": np.ones(1, np.float32)})
        with pytest.raises(BadRequest, match="model must be a non-empty string"):
            client.enqueue("j", "", "s", 1, [b"x"])
        with pytest.raises(PayloadTooLarge, match="payload 0 has 1001 bytes"):
            client.enqueue("j", "m", "s", 1, [b"x" * 1001])
        assert client.job_status("j")["enqueued"] == 0  # nothing was written by the refused calls
        assert client.stats()["keys"] == []
        with pytest.raises(BadRequest, match="send workq.hello first"):
            client.rpc.call("workq.lease", {"max_items": 1})
        [h] = client.enqueue("j", "m", "s", 1, [b"ok"])
    with Worker(server.address, "w", models=["m"]) as worker:
        [item] = worker.lease(1)
        with pytest.raises(UnknownHandle):
            worker.complete(Handle(h.segment, h.offset + 8), b"r")
        with pytest.raises(NotFound):  # UnknownHandle is a NotFound for generic handlers
            worker.complete(Handle(h.segment + 7, h.offset), b"r")
        with pytest.raises(NotLeased):
            worker.touch(Handle(h.segment, h.offset + 8))
        for bad in (-1.0, float("nan"), float("inf"), 1e308):  # the broker's one rule, over the wire too
            with pytest.raises(BadRequest, match="delay must be a number of seconds in 0..604800"):
                worker.release(item.handle, delay=bad)  # the lease stays
            with pytest.raises(BadRequest, match="wait must be a number of seconds in 0..3600"):
                worker.lease(1, wait=bad)
        with QueueClient(server.address) as client, pytest.raises(BadRequest, match="wait must be"):
            client.results("j", wait=float("inf"))  # answered at once, not a client timeout
        assert worker.complete(item.handle, b"r") == "completed"
        assert worker.complete(item.handle, b"again") == "duplicate"
        with pytest.raises(NotLeased, match="not leased by worker 'w'"):
            worker.release(item.handle)


def test_vanished_worker_loses_its_leases_after_the_grace(server: ServerProcess) -> None:
    with QueueClient(server.address) as client:
        client.enqueue("j", "m", "s", 1, [b"a", b"b"])
    first = Worker(server.address, "gone", models=["m"])
    assert len(first.lease(2)) == 2
    first.close()  # no goodbye
    with Worker(server.address, "other", models=["m"]) as other:
        items = other.lease(2, wait=10)
        assert {i.payload for i in items} == {b"a", b"b"} and all(i.deliveries == 2 for i in items)


def test_responses_never_exceed_a_frame(tmp_path: Path) -> None:
    config = tmp_path / "small.toml"
    config.write_text("max_frame_bytes = 65536\n[workq]\nreconnect_window_s = 0.0\ndisk_floor_bytes = 0\n"
                      "max_payload_bytes = 20000\nmax_result_bytes = 40000\n")
    server = ServerProcess(tmp_path / "data", "--config", str(config)).start()
    try:
        with QueueClient(server.address) as client, Worker(server.address, "w") as worker:
            for i in range(10):  # requests are frames too
                client.enqueue("j", "m", "s", 1, [bytes([i]) * 15_000])
            sizes = []
            while sum(sizes) < 10:
                items = worker.lease(10)
                assert items, "a lease came back empty while items were pending"
                sizes.append(len(items))
                for item in items:
                    worker.complete(item.handle, bytes(30_000))
            assert max(sizes) == 3  # what fits 64 KiB less the response reserve (header, names)
            got = []
            while len(got) < 10:
                batch = client.results("j", 1000)
                assert 0 < len(batch) <= 2  # 2 x 30 kB fit
                got += batch
            assert client.job_status("j")["completed"] == 10
    finally:
        server.kill()

def test_a_small_frame_caps_payloads_so_one_always_fits(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", "--max-frame-bytes", "65536").start()
    try:
        with QueueClient(server.address) as client:
            with pytest.raises(PayloadTooLarge, match="limit is 59328"):  # 64 KiB less the response reserve
                client.enqueue("j", "m", "s", 1, [bytes(60_000)])
            client.enqueue("j", "m", "s", 1, [bytes(59_328)])
        with Worker(server.address, "w") as worker:
            assert len(worker.lease(1)[0].payload) == 59_328
    finally:
        server.kill()


def test_workers_keep_their_items_across_a_server_restart(server: ServerProcess) -> None:
    with QueueClient(server.address) as client:
        client.enqueue("j", "m", "s", 1, [b"x", b"y", b"z"], durable=True)
    holder = Worker(server.address, "holder", models=["m"], retry_for=60)
    held = holder.lease(2)
    server.signal(signal.SIGKILL)
    server.wait()
    server.start()
    with Worker(server.address, "rival", models=["m"]) as rival:
        assert rival.lease(10) == []  # the reconnect window: recovered items wait for their holders
        statuses = holder.complete([i.handle for i in held], [b"r1", b"r2"])  # reconnects, reports, completes
        assert statuses == ["completed", "completed"]
        rest = rival.lease(10, wait=10)
        assert [i.payload for i in rest] == [b"z"]  # after the window: only the item nobody held
        rival.complete(rest[0].handle, b"r3")
    with QueueClient(server.address) as client:
        results = client.results("j", wait=5)
        assert sorted(r.payload for r in results) == [b"r1", b"r2", b"r3"]
        # "delivered" is recorded just after the response is written: a status query may race it
        deadline = time.monotonic() + 5
        while client.job_status("j")["delivered"] < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.job_status("j") == {"enqueued": 3, "pending": 0, "in_flight": 0, "completed": 3,
                                          "delivered": 3, "buried": 0}
    holder.close()


def test_queue_stats_and_kick_commands(server: ServerProcess) -> None:
    with QueueClient(server.address) as client:
        client.enqueue("poison-job", "m", "s", 1, [b"p"])
    for name in ("a", "b"):  # two deliveries that never finish: buried (max_deliveries = 2)
        worker = Worker(server.address, name, models=["m"])
        assert len(worker.lease(1, wait=10)) == 1
        worker.close()
        time.sleep(0.8)
    cli = [sys.executable, "-m", "shardmgr", "queue"]
    deadline = time.monotonic() + 10
    while True:
        out = subprocess.run([*cli, "stats", "--port", str(server.port), "--json"], capture_output=True, text=True)
        stats = json.loads(out.stdout)
        if stats["totals"]["buried"] == 1 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert stats["totals"]["buried"] == 1
    key = stats["keys"][0]
    assert (key["model"], key["buried"], key["segments"]) == ("m", 1, 1)
    assert key["pinned_by"]["job"] == "poison-job" and key["pinned_by"]["state"] == "buried"
    lines = subprocess.run([*cli, "stats", "--port", str(server.port)], capture_output=True, text=True)
    [row] = [line.split("\t") for line in lines.stdout.splitlines() if line.startswith("key\t")]  # piped: lines
    assert lines.returncode == 0 and row[:7] == ["key", "m", "s", "1", "0", "0", "1"]
    assert "poison-job, buried" in row[11]
    kicked = subprocess.run([*cli, "kick", "poison-job", "--port", str(server.port)], capture_output=True, text=True)
    assert kicked.returncode == 0 and "kicked 1" in kicked.stdout
    with Worker(server.address, "c", models=["m"]) as worker:
        assert [i.payload for i in worker.lease(1)] == [b"p"]


def test_a_wait_longer_than_the_client_timeout_is_answered(tmp_path: Path) -> None:
    """The client adds the wait it asked for to its timeout: a long poll is not a lost connection."""
    server = ServerProcess(tmp_path / "data").start()
    try:
        with QueueClient(server.address, timeout=0.5) as client:
            client.enqueue("job", "m", "s", 1, [b"x"])
            started = time.monotonic()
            assert client.results("job", wait=1.5) == []
            assert time.monotonic() - started >= 1.4
        worker = Worker(server.address, "w", timeout=0.5)
        assert len(worker.lease(1, wait=1.5)) == 1
        assert worker.lease(1, wait=1.5) == []
        worker.close()
    finally:
        server.kill()
