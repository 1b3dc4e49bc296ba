"""A job nothing was enqueued for yet, embedded and through a real server:
zeros, no results, a results call that waits for it, nothing created."""

from __future__ import annotations

from pathlib import Path

import pytest

import shardmgr
import workq
from common.wire.errors import BadRequest
from tests.shardmgr.server.serverproc import ServerProcess
from workq import Broker, QueueClient, Worker
from workq.protocol import decode_results

ZEROS = {"enqueued": 0, "pending": 0, "in_flight": 0, "completed": 0, "delivered": 0, "buried": 0}


def job_files(data: Path) -> list[Path]:
    return sorted((data / "workq" / "results").glob("*"))


def test_an_unknown_job_answers_zeros_and_asking_creates_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with workq.open(data, reconnect_window_s=0.0, disk_floor_bytes=0) as broker:
        assert broker.job_status("later") == ZEROS
        assert broker.results("later") == []
        assert broker.results("later", max_items=5, wait=0.2) == []  # waited, found nothing
        assert broker.kick("later") == 0
        for bad in ("", "x\0y", "j" * 300):
            with pytest.raises(ValueError, match="job must be"):
                broker.job_status(bad)
            with pytest.raises(ValueError, match="job must be"):
                broker.results(bad, wait=30)  # refused at once, not after the wait
            with pytest.raises(ValueError, match="job must be"):
                broker.kick(bad)
        assert job_files(data) == []
        assert broker.stats()["keys"] == []
    with workq.open(data, reconnect_window_s=0.0, disk_floor_bytes=0) as broker:
        assert broker.recovery is not None and broker.recovery.jobs == 0
    assert shardmgr.verify(data, deep=True).exit_code == 0


def test_results_wait_for_a_job_that_does_not_exist_yet(broker: Broker) -> None:
    waiting = broker.results_async("later", max_items=10, wait=60)
    broker.job_status("later")  # operations run in order: the results call has looked, and waits
    assert not waiting.done()
    [handle] = broker.enqueue("later", "m", "s", 1, [b"task"])
    [item] = broker.lease(1)
    assert not waiting.done()  # leased, not completed: still nothing to deliver
    assert broker.complete([item.handle], [b"result"]) == ["completed"]
    delivery = waiting.result(timeout=30)
    delivery.confirm().result(timeout=30)
    assert [(r.handle, r.payload) for r in delivery.results()] == [(handle, b"result")]
    assert broker.job_status("later") == {**ZEROS, "enqueued": 1, "completed": 1, "delivered": 1}


def test_an_unknown_job_over_the_wire(queue_server: ServerProcess) -> None:
    with QueueClient(queue_server.address) as client, QueueClient(queue_server.address) as producer:
        assert client.job_status("later") == ZEROS
        assert client.results("later", wait=0.2) == []
        assert client.kick("later") == 0
        with pytest.raises(BadRequest, match="job must be"):
            client.job_status("")
        with pytest.raises(BadRequest, match="job must be"):
            client.results("", wait=30)
        assert job_files(queue_server.data_dir) == []
        # one connection's requests run in order: once job_status answers, the results call waits
        waiting = client.rpc.send("workq.results", {"job": "later", "max_items": 10, "wait": 60.0})
        assert client.job_status("later") == ZEROS
        [handle] = producer.enqueue("later", "m", "s", 1, [b"task"])
        with Worker(queue_server.address, "w") as worker:
            [item] = worker.lease(1)
            assert worker.complete(item.handle, b"result") == "completed"
        reply = client.rpc.receive(waiting, wait=60)
        assert [(r.handle, r.payload) for r in decode_results(reply.parts)] == [(handle, b"result")]
