"""A lone durable call is synced and answered on the thread that ran it
(common/journal/leader.py): embedded, on the caller's thread; through the
server, on the connection's reader thread. Pipelined durable calls still
share the flusher thread's rounds."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest

from common.journal import FlusherConfig
from shardmgr.server.config import ServerConfig
from shardmgr.server.server import Server
from workq import Broker, QueueClient


@pytest.fixture
def synced_on() -> Iterator[list[str]]:
    """The names of the threads that called fdatasync, in order."""
    names: list[str] = []
    real = os.fdatasync

    def recording(fd: int) -> None:
        names.append(threading.current_thread().name)
        real(fd)

    with mock.patch("os.fdatasync", recording):
        yield names


def test_a_durable_embedded_call_is_synced_on_the_callers_thread(open_broker: Callable[..., Broker],
                                                                 synced_on: list[str]) -> None:
    broker = open_broker(flusher=FlusherConfig(interval=60))  # no timed round runs while the call leads
    broker.enqueue("job", "m", "s", 1, [b"warm-up"], durable=True)  # the job's files made
    here = broker.flusher.stats.here
    synced_on.clear()
    broker.enqueue("job", "m", "s", 1, [b"task"], durable=True)
    assert threading.current_thread().name in synced_on
    items = broker.lease(2)
    broker.complete([i.handle for i in items], [b"result"] * len(items), durable=True)
    assert broker.flusher.stats.here >= here + 2
    broker.enqueue("job", "m", "s", 1, [b"later"], durable=False)  # nothing waits: nothing is synced here
    assert broker.flusher.stats.here >= here + 2


def _server(tmp_path: Path, interval_ms: float) -> Server:
    server = Server(ServerConfig(data_dir=tmp_path / "data", port=0, flush_interval_ms=interval_ms))
    server.start()
    return server


def test_a_durable_enqueue_over_the_wire_is_synced_on_its_connections_reader(tmp_path: Path,
                                                                             synced_on: list[str]) -> None:
    server = _server(tmp_path, 60_000)  # no timed round within the test
    try:
        with QueueClient(server.address) as queue:
            queue.enqueue("job", "m", "s", 1, [b"warm-up"], durable=True)
            synced_on.clear()
            for _ in range(5):
                queue.enqueue("job", "m", "s", 1, [b"task"], durable=True)
            assert synced_on and all(name.startswith("conn-read") for name in synced_on), synced_on
            assert server.stats()["flusher"]["rounds_here_total"] >= 5
    finally:
        server.stop()


def test_pipelined_durable_enqueues_still_share_rounds(tmp_path: Path) -> None:
    real = os.fdatasync
    syncs: list[str] = []

    def slow(fd: int) -> None:  # a slow disk: requests arrive faster than rounds end
        syncs.append(threading.current_thread().name)
        time.sleep(0.02)
        real(fd)

    server = _server(tmp_path, 60_000)
    try:
        with QueueClient(server.address) as queue:
            queue.enqueue("job", "m", "s", 1, [b"warm-up"], durable=True)
            with mock.patch("os.fdatasync", slow):
                with queue.pipeline() as pipe:
                    pending = [pipe.enqueue("job", "m", "s", 1, [b"t%d" % i], durable=True) for i in range(60)]
            assert all(len(p.result()) == 1 for p in pending)
            assert len(syncs) <= 20, f"{len(syncs)} fdatasyncs for 60 pipelined durable enqueues"
            assert queue.job_status("job")["enqueued"] == 61
    finally:
        server.stop()
