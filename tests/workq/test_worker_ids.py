"""One live connection per worker id, through a real server: a second
Worker with the same id is refused, the same Worker reconnecting takes its
id over."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest

from common.wire.errors import BadRequest
from tests.shardmgr.server.serverproc import ServerProcess
from workq import QueueClient, Worker, WorkerIdInUse


def test_a_second_live_worker_with_the_same_id_is_refused(queue_server: ServerProcess) -> None:
    with QueueClient(queue_server.address) as client:
        client.enqueue("j", "m", "s", 1, [b"a", b"b"])
    first = Worker(queue_server.address, "gpu-1")
    [item] = first.lease(1)
    second = Worker(queue_server.address, "gpu-1")  # another process with the same id
    for _ in range(2):  # refused each time it connects, changing nothing
        with pytest.raises(WorkerIdInUse, match="worker id 'gpu-1' is in use by another live connection"):
            second.lease(1)
    first.touch(item.handle)  # still the first one's
    with QueueClient(queue_server.address) as client:  # a client that sends no session is refused too
        with pytest.raises(WorkerIdInUse):
            client.rpc.call("workq.hello", {"worker": "gpu-1"})
    assert first.complete(item.handle, b"r") == "completed"
    first.close()
    [other] = second.lease(1)  # the id is free once its connection closed
    assert other.payload == b"b"
    second.close()


def test_a_worker_id_closed_and_used_again_at_once_is_not_refused(queue_server: ServerProcess) -> None:
    for _ in range(20):  # the hello waits (CLAIM_WAIT_S) for the server to handle the close
        with Worker(queue_server.address, "again") as worker:
            assert worker.lease(1) == []


def test_a_connection_that_renames_itself_frees_its_old_id(queue_server: ServerProcess) -> None:
    with QueueClient(queue_server.address) as raw:
        raw.rpc.call("workq.hello", {"worker": "old", "session": "s1"})
        raw.rpc.call("workq.hello", {"worker": "old", "session": "s1"})  # saying hello again is fine
        raw.rpc.call("workq.hello", {"worker": "new", "session": "s1"})
        with Worker(queue_server.address, "old") as worker:
            assert worker.lease(1) == []
        with Worker(queue_server.address, "new") as worker, pytest.raises(WorkerIdInUse):
            worker.lease(1)
        with pytest.raises(BadRequest, match="session must be"):
            raw.rpc.call("workq.hello", {"worker": "x", "session": ""})


class FreezingProxy:
    """A loopback TCP relay to a server whose open connections can be
    frozen: kept open but relaying nothing, as a network fault leaves them
    (the server sees a live connection, the client a silent one)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.pairs: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.port))
            frozen = threading.Event()
            with self._lock:
                self.pairs.append((client, upstream, frozen))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._relay, args=(src, dst, frozen), daemon=True).start()

    @staticmethod
    def _relay(src: socket.socket, dst: socket.socket, frozen: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if not frozen.is_set():
                    dst.sendall(data)
            if not frozen.is_set():
                dst.shutdown(socket.SHUT_WR)

    def freeze(self) -> None:
        """Stop relaying on every connection open now (new ones relay)."""
        with self._lock:
            for _, _, frozen in self.pairs:
                frozen.set()

    def end_frozen(self) -> None:
        """Close the frozen connections: now the server sees them end."""
        with self._lock:
            for client, upstream, frozen in self.pairs:
                if frozen.is_set():
                    client.close()
                    upstream.close()

    def close(self) -> None:
        self.listener.close()
        with self._lock:
            for client, upstream, _ in self.pairs:
                client.close()
                upstream.close()


def test_a_worker_reconnecting_before_the_server_saw_its_old_connection_die_keeps_its_id_and_leases(
        queue_server: ServerProcess) -> None:
    with QueueClient(queue_server.address) as client:
        client.enqueue("j", "m", "s", 1, [b"a"])
    proxy = FreezingProxy(queue_server.port)
    try:
        worker = Worker(proxy.address, "gpu-1", timeout=1.0)
        [item] = worker.lease(1)
        proxy.freeze()  # half-open: the server still holds the old connection
        worker.touch(item.handle)  # times out, reconnects, says hello with its session: takes its id over
        with Worker(queue_server.address, "gpu-1") as impostor, pytest.raises(WorkerIdInUse):
            impostor.lease(1)
        proxy.end_frozen()  # now the server sees the old connection close
        time.sleep(1.5)  # well past the disconnect grace: the leases stay, the id is on the new connection
        with Worker(queue_server.address, "rival") as rival:
            assert rival.lease(10) == []
        assert worker.complete(item.handle, b"r") == "completed"
        worker.close()
    finally:
        proxy.close()
