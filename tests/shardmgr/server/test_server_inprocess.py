"""Server machinery with components defined here, in-process."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

from common.wire import framing
from common.wire.client import RpcClient
from common.wire.component import Component, Request
from common.wire.errors import BadRequest, Conflict
from shardmgr.server.config import ServerConfig
from shardmgr.server.connection import Connection
from shardmgr.server.server import Server

from .test_server import raw_connection, read_frame


class SlowStart(Component):
    """Recovers only when told to; then serves 'add' on an owner thread."""

    name = "slow"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.queue: list[Request] = []
        self.closed: list[int] = []
        self._cond = threading.Condition()
        self._owner = threading.Thread(target=self._run, daemon=True)
        self._stop = False

    def commands(self) -> Iterable[str]:
        return ("add", "boom")

    def recover(self) -> None:
        assert self.release.wait(30)

    def start(self) -> None:
        self._owner.start()

    def handle(self, request: Request) -> None:
        if request.cmd == "boom":
            raise RuntimeError("kaboom")
        request.arg("a", int)  # validate on the connection thread, answer on the owner
        with self._cond:
            self.queue.append(request)
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self.queue and not self._stop:
                    self._cond.wait()
                if self._stop and not self.queue:
                    return
                request = self.queue.pop(0)
            a, b = request.arg("a", int), request.arg("b", int, 0)
            if a < 0:
                request.fail(Conflict("negative"))
            else:
                doubled = {"doubled": request.part("x", "<f4") * 2} if "x" in request.parts else None
                request.reply({"sum": a + b}, doubled)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()

    def connection_closed(self, connection_id: int) -> None:
        self.closed.append(connection_id)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_port_opens_only_after_recovery_and_owner_replies(tmp_path: Path) -> None:
    port = free_port()
    component = SlowStart()
    server = Server(ServerConfig(data_dir=tmp_path, port=port), [component])
    starter = threading.Thread(target=server.start)
    starter.start()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2)
    component.release.set()
    starter.join(30)
    try:
        with RpcClient(("127.0.0.1", port)) as client:
            reply = client.call("add", {"a": 2, "b": 3}, {"x": np.arange(4, dtype=np.float32)})
            assert reply.result == {"sum": 5} and reply.parts["doubled"].tolist() == [0, 2, 4, 6]
            with pytest.raises(BadRequest, match="argument 'a' must be int, got str"):
                client.call("add", {"a": "2"})
            with pytest.raises(BadRequest, match="argument 'a' must be int, got bool"):
                client.call("add", {"a": True})
            with pytest.raises(Conflict, match="negative"):
                client.call("add", {"a": -1})
            with pytest.raises(Exception, match="internal error: RuntimeError: kaboom"):
                client.call("boom")
            assert client.call("ping").result == {}
        assert server.stats()["server"]["errors_total"] == 4
    finally:
        server.stop()
    assert component.closed, "the component was not told the connection closed"


def test_duplicate_command_names_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="served by both"):
        Server(ServerConfig(data_dir=tmp_path), [SlowStart(), SlowStart()])


def test_a_stop_while_a_connection_is_being_started_waits_for_it(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    accepted = threading.Event()
    real_start = Connection.start

    def slow_start(conn: Connection) -> None:  # the acceptor thread preempted just before it starts the threads
        accepted.set()
        time.sleep(0.5)
        real_start(conn)

    monkeypatch.setattr(Connection, "start", slow_start)
    server = Server(ServerConfig(data_dir=tmp_path, port=0), [])
    server.start()
    try:
        with socket.create_connection(server.address, timeout=10):
            assert accepted.wait(10)
            server.stop()  # must neither fail nor leave the connection's threads behind
    finally:
        server.stop()
    assert server.stats()["server"]["connections_open"] == 0


def writers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("conn-write")]


def test_a_connection_starts_its_writer_thread_only_when_a_reply_must_wait(tmp_path: Path) -> None:
    """Replies the socket takes at once are written by the thread that made
    them: a connection that is served and idle has no writer thread. Replies
    to a client that stops reading go to the outbox, which starts the writer;
    once the client reads, every reply arrives, in order; the clean stop's
    goaway comes from it too."""
    component = SlowStart()
    component.release.set()
    server = Server(ServerConfig(data_dir=tmp_path, port=0), [component])
    server.start()
    try:
        with RpcClient(server.address) as client:
            for a in range(20):  # answered on the reader thread (ping) and on the component's owner (add)
                assert client.call("ping").result == {}
                assert client.call("add", {"a": a, "b": 1}).result == {"sum": a + 1}
            assert writers() == []
            x = np.arange(1 << 18, dtype=np.float32)  # each reply carries 1 MiB: 48 MiB pile up unread
            ids = [client.send("add", {"a": a}, {"x": x}) for a in range(48)]
            deadline = time.monotonic() + 30
            while not writers():
                assert time.monotonic() < deadline, "no writer thread while replies waited"
                time.sleep(0.01)
            for a, request_id in enumerate(ids):
                reply = client.receive(request_id)
                assert reply.result == {"sum": a} and np.array_equal(reply.parts["doubled"], x * 2)
            assert len(writers()) == 1
        idle = raw_connection(f"{server.address[0]}:{server.address[1]}")
        idle.sendall(b"".join(framing.encode({"id": 1, "cmd": "ping"})))
        assert read_frame(idle) == {"id": 1, "ok": {}} and writers() == []
        stopping = threading.Thread(target=server.stop)
        stopping.start()
        goaway = read_frame(idle)  # written by the writer the stop started
        assert goaway is not None and goaway["id"] == 0 and goaway["error"]["code"] == "unavailable", goaway
        idle.close()
        stopping.join(30)
    finally:
        server.stop()
    assert writers() == [] and server.stats()["server"]["connections_open"] == 0
