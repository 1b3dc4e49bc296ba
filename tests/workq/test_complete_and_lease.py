"""One round trip per item: complete, then lease, in one call (Worker.complete_and_lease)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

import workq
from common.wire.errors import BadRequest
from tests.shardmgr.server.serverproc import ServerProcess
from workq import Handle, QueueClient, UnknownHandle, Worker
from workq.protocol import Leased, pack_handles
from workq.state.dispatch import Filters


def test_a_worker_loop_takes_every_item_once_with_one_call_per_item(queue_server: ServerProcess) -> None:
    payloads = [f"task {i}".encode() for i in range(25)]
    with QueueClient(queue_server.address) as client:
        client.enqueue("j", "m", "s", 1, payloads)
    seen = []
    with Worker(queue_server.address, "w", models=["m"]) as worker:
        items = worker.lease(1)
        while items:
            [item] = items
            seen.append(item.payload)
            assert worker.held == {item.handle.packed}
            status, items = worker.complete_and_lease(item.handle, item.payload.upper())
            assert status == "completed"
        assert worker.held == set()
    assert seen == payloads
    with QueueClient(queue_server.address) as client:
        assert [r.payload for r in client.results("j", max_items=100)] == [p.upper() for p in payloads]
        assert client.job_status("j")["pending"] == 0


def test_a_failed_completion_leases_nothing(queue_server: ServerProcess) -> None:
    with QueueClient(queue_server.address) as client:
        [h, _] = client.enqueue("j", "m", "s", 1, [b"a", b"b"])
        with Worker(queue_server.address, "w") as worker:
            [item] = worker.lease(1)
            with pytest.raises(UnknownHandle):
                worker.complete_and_lease(Handle(h.segment, h.offset + 8), b"r")
            with pytest.raises(ValueError, match="max_items must be at least 1"):
                worker.complete_and_lease(item.handle, b"r", max_items=0)
            request, _ = worker._complete(item.handle, b"r")
            with pytest.raises(BadRequest, match="max_items"):  # refused before anything is written
                worker.rpc.call("workq.complete", {"lease": -1}, request.parts)
            status = client.job_status("j")
            assert (status["in_flight"], status["pending"], status["completed"]) == (1, 1, 0)
            statuses, items = worker.complete_and_lease([item.handle, item.handle], [b"r", b"r2"], max_items=5)
            assert statuses == ["completed", "duplicate"] and [i.payload for i in items] == [b"b"]


def test_the_lease_waits_for_work_after_the_completion(queue_server: ServerProcess) -> None:
    with QueueClient(queue_server.address) as client:
        client.enqueue("j", "m", "s", 1, [b"first"])
        with Worker(queue_server.address, "w") as worker:
            [item] = worker.lease(1)
            later = threading.Timer(0.3, lambda: client.enqueue("j", "m", "s", 1, [b"second"]))
            later.start()
            started = time.monotonic()
            status, items = worker.complete_and_lease(item.handle, b"r", wait=10)
            later.join()
            assert status == "completed" and [i.payload for i in items] == [b"second"]
            assert 0.2 < time.monotonic() - started < 5
            status, items = worker.complete_and_lease(items[0].handle, b"r", wait=0.1)
            assert status == "completed" and items == []


def test_embedded_complete_and_lease_answers_statuses_and_items(tmp_path: Path) -> None:
    with workq.open(tmp_path / "q") as broker:
        broker.enqueue("j", "m", "s", 1, [b"a", b"b", b"c"])
        [item] = broker.lease(1, worker="w")
        future: Future[tuple[list[str], list[Leased]]] = Future()
        broker.complete_and_lease_into(future, "w", Filters.of(None, None, None), pack_handles([item.handle]),
                                       [b"r"], 2)
        statuses, batches = future.result(10)
        assert statuses == ["completed"] and [p for b in batches for p in b.payloads] == [b"b", b"c"]


def test_a_completion_not_waited_for_returns_before_the_flush(tmp_path: Path) -> None:
    """durable=False answers at once; the result reaches consumers after the
    next timed round (here 0.5 s); a completion waited for hurries its round."""
    config = tmp_path / "server.toml"
    config.write_text("flush_interval_ms = 500\n")
    server = ServerProcess(tmp_path / "data", "--config", str(config)).start()
    try:
        with QueueClient(server.address) as client, Worker(server.address, "w") as worker:
            client.enqueue("j", "m", "s", 1, [b"a", b"b", b"c"], durable=True)
            [a] = worker.lease(1)
            started = time.monotonic()
            status, [b] = worker.complete_and_lease(a.handle, b"ra", durable=False)
            assert status == "completed" and time.monotonic() - started < 0.3
            assert worker.complete(b.handle, b"rb", durable=False) == "completed"
            assert worker.complete(b.handle, b"rb2", durable=False) == "duplicate"
            [c] = worker.lease(1)
            assert worker.complete(c.handle, b"rc") == "completed"  # durable: its round is hurried
            got: list[bytes] = []
            deadline = time.monotonic() + 10
            while len(got) < 3 and time.monotonic() < deadline:
                got += [r.payload for r in client.results("j", max_items=10, wait=1)]
            assert sorted(got) == [b"ra", b"rb", b"rc"]  # each once; the not-waited-for ones too, after a round
    finally:
        server.kill()
