"""Pipelined calls through a real ``shardmgr serve``: ``enqueue_async``,
``pipeline()``, the in-flight bound, errors per request, lost connections,
and a worker's ``held`` set under pipelined completes."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError
from pathlib import Path

import numpy as np
import pytest

import workq.client
import workq.worker
from common.wire.client import IDLE_CHECK_S, ConnectionLost, RpcClient
from common.wire.errors import BadRequest, Unavailable
from common.wire.framing import Frame
from common.wire.pipeline import Batch, Pending, Pipe, Request
from tests.shardmgr.server.serverproc import ServerProcess
from workq import Handle, Item, NotLeased, PayloadTooLarge, QueueClient, UnknownHandle, Worker

WORKQ = "[workq]\nlease_s = 30.0\nreconnect_window_s = 2.0\nmax_payload_bytes = 1000\n"
SLOW_FLUSH = "flush_interval_ms = 60000\n"  # durable enqueues wait a minute: answered after everything else


def serve(tmp_path: Path, config: str, name: str = "data") -> ServerProcess:
    path = tmp_path / f"{name}.toml"
    path.write_text(config)
    return ServerProcess(tmp_path / name, "--config", str(path)).start()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = serve(tmp_path, WORKQ)
    yield proc
    proc.kill()


@pytest.fixture
def slow_flush(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = serve(tmp_path, SLOW_FLUSH + WORKQ)
    yield proc
    proc.kill()


def payloads_by_handle(address: str, count: int) -> dict[Handle, bytes]:
    """Lease everything enqueued: what each handle names."""
    with Worker(address, "reader") as worker:
        items = worker.lease(count + 1)
    assert len(items) == count
    return {item.handle: item.payload for item in items}


def test_pipelined_enqueues_answer_each_call_with_its_own_handles(server: ServerProcess) -> None:
    with QueueClient(server.address) as client:
        sequential = [client.enqueue("seq", "m", "s", 1, [b"s%d" % i]) for i in range(50)]
        pending = [client.enqueue_async("job", "m", "s", 1, [b"a%d" % i, b"b%d" % i]) for i in range(100)]
        with client.pipeline() as pipe:
            queued = [pipe.enqueue("job", "m", "s", 1, [b"p%d" % i]) for i in range(100)]
        async_handles = [p.result() for p in pending]
        piped_handles = [p.result() for p in queued]
        assert client.in_flight == 0
        assert [len(h) for h in sequential] == [1] * 50
        assert [len(h) for h in async_handles] == [2] * 100 and [len(h) for h in piped_handles] == [1] * 100
        flat = [h for hs in async_handles + piped_handles for h in hs]
        assert flat == sorted(flat)  # one key, one connection: appended in the order sent
        assert client.job_status("job")["enqueued"] == 300
    named = payloads_by_handle(server.address, 350)
    for i, (a, b) in enumerate(async_handles):
        assert (named[a], named[b]) == (b"a%d" % i, b"b%d" % i)
    assert [named[h] for [h] in piped_handles] == [b"p%d" % i for i in range(100)]


def test_answers_out_of_order_reach_their_own_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A durable enqueue waits for the next flush (1 s away); the plain ones
    sent behind it are answered first, and each call gets its own handles."""
    server = serve(tmp_path, "flush_interval_ms = 1000\n" + WORKQ)
    arrived: list[int] = []

    class Recording(RpcClient):
        def _read_frame(self) -> Frame | None:
            frame = super()._read_frame()
            if frame is not None:
                arrived.append(frame.header["id"])
            return frame

    monkeypatch.setattr(workq.client, "RpcClient", Recording)
    try:
        with QueueClient(server.address) as client:
            pipe = client.pipeline()
            for i in range(20):
                pipe.enqueue("job", "m", "s", 1, [b"%d" % i], durable=(i % 10 == 0))
            answers = pipe.execute()
        assert sorted(arrived) != arrived, "every answer came in order: nothing was matched out of order"
        assert [len(a) for a in answers] == [1] * 20
        named = payloads_by_handle(server.address, 20)
        assert [named[h] for [h] in answers] == [b"%d" % i for i in range(20)]
    finally:
        server.kill()


def test_a_bad_request_fails_its_own_entry_and_the_others_apply(server: ServerProcess) -> None:
    with QueueClient(server.address) as client:
        pipe = client.pipeline()
        pipe.enqueue("job", "m", "s", 1, [b"first"])
        pipe.enqueue("job", "", "s", 1, [b"no model"])
        pipe.enqueue("job", "m", "s", 1, [b"x" * 1001])
        pipe.enqueue("job", "m", "s", 1, [b"last"], durable=True)
        with pytest.raises(TypeError):
            pipe.enqueue("job", "m", "s", 1, [5])  # type: ignore[list-item]  # refused here, nothing queued
        assert len(pipe) == 4
        first, no_model, too_large, last = pipe.execute(raise_on_error=False)
        assert isinstance(no_model, BadRequest) and "model must be a non-empty string" in str(no_model)
        assert isinstance(too_large, PayloadTooLarge)
        assert len(first) == 1 and len(last) == 1
        assert client.job_status("job")["enqueued"] == 2

        with pytest.raises(BadRequest, match="model must be"), client.pipeline() as raising:
            entries = [raising.enqueue("job", "m" if i != 3 else "", "s", 1, [b"%d" % i]) for i in range(6)]
        assert [e.exception() is None for e in entries] == [True, True, True, False, True, True]
        assert client.job_status("job")["enqueued"] == 7  # all answered before the first error was raised

        async_bad = client.enqueue_async("job", "m", "s", 1, [b"y" * 2000])
        async_good = client.enqueue_async("job", "m", "s", 1, [b"y"])
        assert len(async_good.result()) == 1
        with pytest.raises(PayloadTooLarge):
            async_bad.result()
        assert isinstance(async_bad.exception(), PayloadTooLarge)  # asked again: the same answer


def test_a_block_that_raises_sends_nothing_it_queued(server: ServerProcess) -> None:
    with QueueClient(server.address) as client:
        client.enqueue("job", "m", "s", 1, [b"before"])
        with pytest.raises(RuntimeError, match="changed my mind"), client.pipeline() as pipe:
            entry = pipe.enqueue("job", "m", "s", 1, [b"never"])
            raise RuntimeError("changed my mind")
        with pytest.raises(CancelledError):
            entry.result()
        assert client.job_status("job")["enqueued"] == 1


def test_a_producer_that_never_reads_answers_stays_within_the_bound(server: ServerProcess) -> None:
    bound = 64
    kept: list[Pending[list[Handle]]] = []
    with QueueClient(server.address, max_in_flight=bound) as client:
        peak = 0
        for i in range(10 * bound):
            pending = client.enqueue_async("job", "m", "s", 1, [b"%d" % i], durable=(i % 7 == 0))
            peak = max(peak, client.in_flight)
            if i % 50 == 0:
                kept.append(pending)  # the rest are dropped unread
        assert 0 < peak <= bound
        with client.pipeline() as pipe:
            for _ in range(5 * bound):  # a pipeline sends in writes of half the bound
                pipe.enqueue("job", "m", "s", 1, [b"p"])
                peak = max(peak, client.in_flight)
        assert peak <= bound
        assert all(len(p.result()) == 1 for p in kept)
        assert client.job_status("job")["enqueued"] == 15 * bound
    assert client.in_flight == 0
    with pytest.raises(ValueError, match="max_in_flight must be an integer >= 1"):
        QueueClient(server.address, max_in_flight=0)


def test_close_waits_for_answers_so_nothing_sent_is_dropped(server: ServerProcess) -> None:
    client = QueueClient(server.address)
    pending = [client.enqueue_async("job", "m", "s", 1, [b"%d" % i], durable=True) for i in range(200)]
    client.close()
    assert all(p.done() and len(p.result()) == 1 for p in pending)
    with QueueClient(server.address) as again:
        assert again.job_status("job")["enqueued"] == 200


def test_requests_in_flight_when_the_server_dies_fail_without_hanging(slow_flush: ServerProcess) -> None:
    with QueueClient(slow_flush.address, timeout=10, retry_for=30) as client:
        plain = [client.enqueue_async("job", "m", "s", 1, [b"p"]) for _ in range(5)]
        durable = [client.enqueue_async("job", "m", "s", 1, [b"d"], durable=True) for _ in range(5)]
        assert all(len(p.result()) == 1 for p in plain)
        slow_flush.signal(signal.SIGKILL)
        slow_flush.wait()
        # a durable enqueue hurries its own flush round, so some may be answered before the kill;
        # the rest fail with ConnectionLost (they may have been applied: never resent), none hangs
        errors = [p.exception() for p in durable]
        assert all(e is None or isinstance(e, ConnectionLost) for e in errors), errors
        slow_flush.start()  # the same port
        # if every call was answered before the kill, the client learns of the closed connection only
        # from its idle check, which looks once IDLE_CHECK_S passed since the last reply (a restart may
        # be quicker): a request sent sooner meets the dead connection and fails, as it must
        time.sleep(IDLE_CHECK_S)
        assert len(client.enqueue_async("job", "m", "s", 1, [b"after"]).result()) == 1  # reconnects

        stale = client.enqueue_async("job", "m", "s", 1, [b"x"], durable=True)
        client.rpc.close()  # the connection goes away under a pending answer
        with pytest.raises(ConnectionLost, match="closed before this request's answer was read"):
            stale.result()


def test_a_clean_stop_fails_unapplied_requests_with_unavailable(server: ServerProcess) -> None:
    """Every pipelined enqueue is answered with handles or Unavailable, never
    ConnectionLost, and exactly the answered ones were applied."""
    pending: list[Pending[list[Handle]]] = []
    client = QueueClient(server.address, max_in_flight=100, retry_for=0.2)
    threading.Timer(0.3, server.signal, (signal.SIGTERM,)).start()
    for i in range(200_000):
        pending.append(client.enqueue_async("job", "m", "s", 1, [b"%d" % i]))
        if pending[i].done() and pending[i].exception() is not None:
            break  # not even sent: the server is gone (each such send spent retry_for trying to connect)
        if i >= 100 and i % 100 == 0 and pending[i - 100].exception() is not None:
            break
    client.close()
    assert server.wait() == 0
    errors = [p.exception() for p in pending]
    answered = sum(e is None for e in errors)
    assert 0 < answered < len(pending)
    assert all(isinstance(e, Unavailable) and not isinstance(e, ConnectionLost) for e in errors if e is not None)
    server.start()
    with QueueClient(server.address) as again:
        assert again.job_status("job")["enqueued"] == answered


def test_pipelined_completes_keep_held_right(server: ServerProcess) -> None:
    with QueueClient(server.address) as client:
        client.enqueue("job", "m", "s", 1, [b"%d" % i for i in range(30)])
    with Worker(server.address, "w") as worker:
        items = worker.lease(30)
        handles = [i.handle for i in items]
        assert worker.held == {h.packed for h in handles}
        stranger = Handle(handles[0].segment, handles[0].offset + 8)
        with worker.pipeline(raise_on_error=False) as pipe:
            completes = [pipe.complete(h, b"r") for h in handles[:10]]
            released = pipe.release(handles[10:15])
            touched = pipe.touch(handles[15:20])
            unknown = pipe.complete(stranger, b"r")
            not_held = pipe.touch(stranger)
            assert worker.held == {h.packed for h in handles}  # nothing answered yet
        assert [c.result() for c in completes] == ["completed"] * 10
        assert released.result() is None and touched.result() is None
        assert isinstance(unknown.exception(), UnknownHandle) and isinstance(not_held.exception(), NotLeased)
        assert worker.held == {h.packed for h in handles[15:]}

        later = [worker.complete_async(h, b"r") for h in handles[15:25]]
        again = worker.complete_async(handles[:2], [b"x", b"y"])
        assert worker.held == {h.packed for h in handles[15:]}  # until the answers are taken
        assert again.result() == ["duplicate", "duplicate"]
        worker.settle()
        assert [p.result() for p in later] == ["completed"] * 10
        assert worker.held == {h.packed for h in handles[25:]}


def test_pipelined_completes_cut_by_a_restart_are_sent_again(tmp_path: Path) -> None:
    """Completes cut off by a server kill are sent again (they are
    idempotent) after the worker reconnects and says hello: each answers
    'completed', or 'duplicate' if its result became durable before the kill
    (a complete hurries a flush round, so that race is the kill's to win)."""
    config = tmp_path / "data.toml"
    server = serve(tmp_path, WORKQ)
    try:
        with QueueClient(server.address) as client:
            client.enqueue("job", "m", "s", 1, [b"%d" % i for i in range(10)], durable=True)
        server.signal(signal.SIGTERM)
        assert server.wait() == 0
        config.write_text(SLOW_FLUSH + WORKQ)  # no timed flush round: only the completes' own
        server.start()
        worker = Worker(server.address, "w", retry_for=60, timeout=30)
        items: list[Item] = []
        while len(items) < 10:  # after the reconnect window (recovered items wait for their holders)
            got = worker.lease(10, wait=10)
            assert got, "no lease within 10 s"
            items += got
        pending = [worker.complete_async(i.handle, b"r") for i in items]
        server.signal(signal.SIGKILL)
        server.wait()
        config.write_text(WORKQ)
        server.start()
        statuses = [p.result() for p in pending]  # reconnected, said hello, sent again: none lost
        assert set(statuses) <= {"completed", "duplicate"} and len(statuses) == 10
        assert worker.held == set()
        worker.close()
        with QueueClient(server.address) as client:
            assert client.job_status("job")["completed"] == 10
    finally:
        server.kill()


def test_a_pipe_reads_replies_while_it_sends_so_big_ones_cannot_jam_it(tmp_path: Path) -> None:
    """``echo`` is answered on the server's reader thread, which reads nothing
    more until its reply is written: a client that only sent would jam both
    sides until the server's send timeout (5 s here) closed it. The Pipe
    under QueueClient and Worker reads what arrived as it goes."""
    server = serve(tmp_path, "send_timeout_s = 5.0\n")
    body = {"body": np.zeros(64 << 10, np.uint8)}
    try:
        with RpcClient(server.address) as rpc:
            pipe = Pipe(rpc, max_in_flight=1000)
            sent = [pipe.submit(Request("echo", None, body), lambda reply: reply.parts["body"].nbytes)
                    for _ in range(300)]
            batch = Batch(pipe)
            for _ in range(300):
                batch.add(Request("echo", None, body), lambda reply: reply.parts["body"].nbytes)
            assert batch.execute() == [64 << 10] * 300
            assert [p.result() for p in sent] == [64 << 10] * 300
    finally:
        server.kill()


def test_resends_stop_waiting_once_the_server_is_found_gone(slow_flush: ServerProcess,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Completes in flight when the server dies are resent; once one resend
    finds the server unreachable (after ``retry_for``), the others fail with
    that error at once instead of each waiting ``retry_for`` again."""
    with QueueClient(slow_flush.address) as client:
        client.enqueue("job", "m", "s", 1, [b"%d" % i for i in range(5)])
    connects = 0

    class Counting(RpcClient):
        def connect(self) -> None:
            nonlocal connects
            connects += 1
            super().connect()

    monkeypatch.setattr(workq.worker, "RpcClient", Counting)
    worker = Worker(slow_flush.address, "w", retry_for=0.5)
    items = worker.lease(5)
    # the server is stopped before the completes are sent, so none can be answered before the kill (a
    # durable complete hurries its own flush: with the server running, the first could win the race)
    assert slow_flush.proc is not None
    os.kill(slow_flush.proc.pid, signal.SIGSTOP)
    pending = [worker.complete_async(i.handle, b"r") for i in items]
    connects = 0
    slow_flush.kill()
    worker.settle()
    errors = [p.exception() for p in pending]
    assert all(isinstance(e, Unavailable) and not isinstance(e, ConnectionLost) for e in errors), errors
    assert connects == 1
    assert worker.held == {i.handle.packed for i in items}  # unanswered: still held
    worker.close()
