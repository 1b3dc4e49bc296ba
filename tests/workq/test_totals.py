"""The queue's totals in ``stats`` when its owner thread cannot answer
(workq/totals.py), through a real in-process server's ``stats`` command:
while a freeze holds the owner (as a snapshot's copy does) and after the
queue closed, ``stats`` answers the last totals marked stale and counts
the failures, logs one line per episode, and is fresh again once the owner
answers. It used to answer ``{}``: the queue's metrics went blank, silently.
An answer that came after its read gave up is never served as fresh later,
and its age counts from when it was computed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.wire.client import RpcClient
from shardmgr.server.config import ServerConfig
from shardmgr.server.server import Server
from workq import QueueClient
from workq.service import WorkqService


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    server = Server(ServerConfig(data_dir=tmp_path / "data", port=0))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def queue_stats(server: Server) -> dict[str, float]:
    with RpcClient(server.address, timeout=30) as rpc:
        found: dict[str, float] = rpc.call("stats").result["workq"]
        return found


def test_stats_answers_the_last_totals_marked_stale_while_the_owner_cannot_answer(
        server: Server, caplog: pytest.LogCaptureFixture) -> None:
    [service] = [c for c in server.components if isinstance(c, WorkqService)]
    service.totals.wait_s = 0.2  # instead of 10 s, so that the test does not wait that long
    with QueueClient(server.address) as queue:
        queue.enqueue("j", "m", "s", 1, [b"a", b"b"], durable=True)
    fresh = queue_stats(server)
    assert (fresh["pending"], fresh["stats_stale"], fresh["stats_failures_total"]) == (2, 0, 0)

    release, frozen = threading.Event(), threading.Event()

    def hold() -> None:
        frozen.set()
        release.wait(60)

    holder = threading.Thread(target=service.broker.frozen, args=(hold,), daemon=True)
    holder.start()
    assert frozen.wait(30)
    try:
        with caplog.at_level(logging.INFO, logger="workq.totals"):
            stale = [queue_stats(server) for _ in range(3)]
    finally:
        release.set()
        holder.join(30)
    for n, answer in enumerate(stale, 1):
        assert (answer["pending"], answer["stats_stale"], answer["stats_failures_total"]) == (2, 1, n), answer
        assert answer["stats_age_seconds"] >= 0
    assert {k: v for k, v in stale[0].items() if not k.startswith("stats_")} == \
        {k: v for k, v in fresh.items() if not k.startswith("stats_")}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "did not answer within 0.2 s" in warned[0] and "marked stale" in warned[0]

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="workq.totals"):
        again = queue_stats(server)
    assert (again["stats_stale"], again["stats_failures_total"]) == (0, 3)
    assert [r.getMessage() for r in caplog.records if "answered again" in r.getMessage()]

    service.broker.close()  # as at a stop: the owner is gone, the last totals are still known
    with caplog.at_level(logging.INFO, logger="workq.totals"):
        closed = service.stats()
    assert (closed["pending"], closed["stats_stale"], closed["stats_failures_total"]) == (2, 1, 4)
    assert any("Unavailable" in r.getMessage() for r in caplog.records)


class Freeze:
    """The owner thread held (as a snapshot's copy holds it) until ``release()``."""

    def __init__(self, service: WorkqService) -> None:
        self._release, frozen = threading.Event(), threading.Event()

        def hold() -> None:
            frozen.set()
            self._release.wait(60)

        self._holder = threading.Thread(target=service.broker.frozen, args=(hold,), daemon=True)
        self._holder.start()
        assert frozen.wait(30)

    def release(self) -> None:
        self._release.set()
        self._holder.join(30)


def test_an_answer_that_came_after_its_read_gave_up_is_never_served_as_fresh(server: Server) -> None:
    [service] = [c for c in server.components if isinstance(c, WorkqService)]
    service.totals.wait_s = 0.2
    with QueueClient(server.address) as queue:
        queue.enqueue("j", "m", "s", 1, [b"a", b"b"], durable=True)
        freeze = Freeze(service)
        try:
            assert queue_stats(server)["stats_stale"] == 1  # its request stays queued behind the freeze
        finally:
            freeze.release()
        # the owner answers that request (pending 2) before this enqueue, which it runs after it
        queue.enqueue("j", "m", "s", 1, [b"c", b"d"], durable=True)
        now = queue_stats(server)
        assert (now["pending"], now["stats_stale"]) == (4, 0), now  # asked again: not the late answer's 2

        freeze = Freeze(service)
        try:
            queue_stats(server)  # unanswered again
        finally:
            freeze.release()
        queue.enqueue("j", "m", "s", 1, [b"e", b"f"], durable=True)  # after the late answer (pending 4)
        computed_by = time.monotonic()
        time.sleep(0.3)  # so that its age shows
        freeze = Freeze(service)
        try:
            asked_at = time.monotonic()
            late = queue_stats(server)
        finally:
            freeze.release()
    # the late answer is the last known: stale, aged from when the owner computed it, not from this read
    assert (late["pending"], late["stats_stale"]) == (4, 1), late
    assert late["stats_age_seconds"] >= asked_at - computed_by - 0.001, late
