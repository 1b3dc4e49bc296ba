"""The service against a real ``shardmgr serve`` process."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import pytest

from common.wire import framing
from common.wire.client import IDLE_CHECK_S, ConnectionLost, RpcClient
from common.wire.errors import BadRequest, Unavailable, UnknownCommand
from shardmgr.server.readiness import NotReady

from .serverproc import ServerProcess


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A server of the test's own: for tests that stop, kill or restart it."""
    proc = ServerProcess(tmp_path / "data").start()
    yield proc
    proc.kill()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the tests that only talk to it (bad bytes included) and
    then check that it still answers: a start costs about a second each."""
    proc = ServerProcess(tmp_path_factory.mktemp("shared") / "data").start()
    yield proc
    proc.kill()


def raw_connection(address: str) -> socket.socket:
    host, port = address.split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(framing.preamble())
    assert framing.parse_preamble(_recv_exact(sock, 8)) == framing.PROTOCOL_VERSION
    return sock


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def read_frame(sock: socket.socket) -> dict | None:
    """One frame's header from a raw socket, or None if the server closed it."""
    try:
        size, header_size = struct.unpack("<II", _recv_exact(sock, 8))
        body = _recv_exact(sock, size)
    except (ConnectionError, OSError):
        return None
    return msgpack.unpackb(body[:header_size])


def raw_frame(header: dict, body: bytes) -> bytes:
    """A frame built by hand (parts as given, unchecked)."""
    head = msgpack.packb(header)
    return struct.pack("<II", len(head) + len(body), len(head)) + head + body


def test_ping_info_and_echo_with_binary_parts(shared: ServerProcess) -> None:
    with RpcClient(shared.address) as client:
        assert client.call("ping").result == {}
        info = client.call("info").result
        assert info["protocol"] == framing.PROTOCOL_VERSION and "stats" in info["commands"]
        vectors = np.random.default_rng(0).standard_normal((100, 768)).astype(np.float32)
        ids = np.arange(100, dtype=np.int64)
        reply = client.call("echo", {"note": "hi", "n": 3}, {"vectors": vectors, "ids": ids,
                                                             "raw": np.frombuffer(b"abc", np.uint8)})
        assert reply.result == {"note": "hi", "n": 3}
        assert np.array_equal(reply.parts["vectors"], vectors) and reply.parts["vectors"].dtype == np.float32
        assert np.array_equal(reply.parts["ids"], ids) and reply.parts["raw"].tobytes() == b"abc"


def test_pipelined_requests_all_answered(shared: ServerProcess) -> None:
    with RpcClient(shared.address) as client:
        ids = [client.send("echo", {"i": i}) for i in range(2000)]
        assert [client.receive(i).result["i"] for i in reversed(ids)] == list(reversed(range(2000)))


def test_unknown_command_and_bad_arguments_keep_the_connection(shared: ServerProcess) -> None:
    with RpcClient(shared.address) as client:
        with pytest.raises(UnknownCommand, match="unknown command 'frobnicate'"):
            client.call("frobnicate")
        sock = raw_connection(shared.address)
        framing.send_buffers(sock, framing.encode({"id": 7, "cmd": "ping", "args": [1, 2]}))
        reply = read_frame(sock)
        assert reply == {"id": 7, "error": {"code": "bad_request",
                                            "message": "request 7: 'cmd' must be a string and 'args' a map"}}
        framing.send_buffers(sock, framing.encode({"id": 8, "cmd": "ping"}))
        assert read_frame(sock) == {"id": 8, "ok": {}}
        assert client.call("ping").result == {}
    assert BadRequest.code == "bad_request"


@pytest.mark.parametrize("garbage, code", [
    (b"\xff" * 64, "frame_too_large"),  # size 0xffffffff
    (struct.pack("<II", 16, 100) + bytes(16), "bad_frame"),  # header larger than the frame
    (struct.pack("<II", 1 << 31, 10), "frame_too_large"),
    (struct.pack("<II", 5, 5) + b"\xc1\xc1\xc1\xc1\xc1", "bad_frame"),  # not msgpack
    (struct.pack("<II", 2, 2) + msgpack.packb([1]), "bad_frame"),  # not a map
    (struct.pack("<II", 20, 10) + msgpack.packb({"id": 1}).ljust(10, b"\0") + b"x" * 10, "bad_frame"),
    # found by the fuzzer: an unhashable dtype in a part spec
    (struct.pack("<II", 31, 31) + msgpack.packb({"id": 1, "cmd": "echo", "parts": [["x", ["<f4"], [1]]]}),
     "bad_frame"),
    # a part of 100 dimensions (numpy stops at 64): the connection used to close without an error frame
    (raw_frame({"id": 1, "cmd": "echo", "parts": [["x", "|u1", [1] * 100]]}, bytes(1)), "bad_frame"),
    (raw_frame({"id": 1, "cmd": "echo", "parts": [["x", "<u8", [1]], ["x", "<u8", [1]]]}, bytes(16)),
     "bad_frame"),  # a part name twice
])
def test_bad_frames_get_an_error_and_a_closed_connection(shared: ServerProcess, garbage: bytes, code: str) -> None:
    sock = raw_connection(shared.address)
    sock.sendall(garbage)
    reply = read_frame(sock)
    assert reply is not None and reply["id"] == 0 and reply["error"]["code"] == code, reply
    assert read_frame(sock) is None  # then closed
    with RpcClient(shared.address) as client:
        assert client.call("ping").result == {}


def test_wrong_preamble_and_wrong_version(shared: ServerProcess) -> None:
    host, port = shared.address.split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(b"GET / HTTP/1.1\r\n\r\n")
    assert sock.recv(100) == b""  # not our protocol: closed without a word
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(framing.PREAMBLE.pack(framing.MAGIC, 99))
    assert framing.parse_preamble(_recv_exact(sock, 8)) == framing.PROTOCOL_VERSION
    reply = read_frame(sock)
    assert reply is not None and reply["error"]["code"] == "unsupported_version"
    with RpcClient(shared.address) as client:
        assert client.call("ping").result == {}


def test_disconnect_mid_frame_and_silent_clients(shared: ServerProcess) -> None:
    for cut in (1, 8, 20):
        sock = raw_connection(shared.address)
        sock.sendall(framing.encode({"id": 1, "cmd": "echo", "args": {"x": "y" * 100}})[0][:cut])
        sock.close()
    idle = [socket.create_connection(("127.0.0.1", shared.port)) for _ in range(5)]  # never send a preamble
    with RpcClient(shared.address) as client:
        assert client.call("ping").result == {}
    for sock in idle:
        sock.close()


def test_client_that_never_reads_is_closed_and_others_continue(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text("max_outbox_bytes = 8388608\nmax_frame_bytes = 4194304\nsend_timeout_s = 2.0\n")
    proc = ServerProcess(tmp_path / "data", "--config", str(config)).start()
    try:
        hog = raw_connection(proc.address)
        hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        body = np.zeros(1 << 20, dtype=np.uint8)
        stop = time.monotonic() + 20
        closed = False
        while time.monotonic() < stop and not closed:
            try:
                framing.send_buffers(hog, framing.encode({"id": 1, "cmd": "echo"}, {"b": body}))
            except OSError:
                closed = True
        assert closed, "the server kept a client that never reads"
        with RpcClient(proc.address) as client:
            assert client.call("ping").result == {}
        proc.wait_log("closing .*(not read|send failed|send blocked)")
    finally:
        proc.kill()


def test_sigterm_exits_zero_after_answering_in_flight(server: ServerProcess) -> None:
    client = RpcClient(server.address)
    ids = [client.send("echo", {"i": i}) for i in range(500)]
    assert client.receive(ids[0]).result == {"i": 0}  # the server is serving this connection
    server.signal(signal.SIGTERM)
    answered = 1
    try:
        for i, request_id in enumerate(ids[1:], 1):
            assert client.receive(request_id).result == {"i": i}  # answers stay correct to the end
            answered += 1
    except Unavailable as exc:  # the goaway: requests it had not answered were not applied
        assert not isinstance(exc, ConnectionLost), exc
    assert server.wait(30) == 0
    server.wait_log("stopped")
    assert answered >= 1


SIGTERM_TO_ANOTHER_THREAD = """
import signal, sys, threading, time
from pathlib import Path
from shardmgr.server import readiness
from shardmgr.server.config import ServerConfig
from shardmgr.server.server import Server

ready = Path(sys.argv[2])
server = Server(ServerConfig(data_dir=Path(sys.argv[1]), port=0, ready_file=ready))

def kick() -> None:
    while readiness.read(ready) is None:
        time.sleep(0.01)
    time.sleep(0.3)  # the main thread waits for a signal by now
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)  # as the kernel may: to a thread not the main one

threading.Thread(target=kick, daemon=True).start()
sys.exit(server.run())
"""


def test_a_sigterm_another_thread_receives_stops_the_server(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_TO_ANOTHER_THREAD, str(tmp_path / "data"),
                             str(tmp_path / "ready")], stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        raise AssertionError("the server never handled the SIGTERM") from None
    assert proc.returncode == 0, stderr
    assert not (tmp_path / "ready").exists()


def test_sigkill_then_restart_and_client_reconnects(server: ServerProcess) -> None:
    client = RpcClient(server.address, retry_for=30)
    restarts: list[threading.Timer] = []

    def restart_soon() -> None:  # come back while the client retries
        restarts.append(threading.Timer(0.5, server.start))
        restarts[-1].start()

    try:
        assert client.call("ping").result == {}
        in_flight = client.send("workq.results", {"job": "j", "wait": 30.0})
        server.signal(signal.SIGKILL)
        server.wait()
        with pytest.raises(ConnectionLost):  # it was in flight: it may or may not have applied
            client.receive(in_flight)
        restart_soon()
        assert client.call("ping").result == {}
        server.signal(signal.SIGKILL)  # now idle: its next call finds the connection ended and reconnects
        server.wait()
        time.sleep(IDLE_CHECK_S)
        restart_soon()
        assert client.call("ping").result == {}
    finally:
        for timer in restarts:
            timer.join(60)  # a server it started is then the fixture's to stop
        client.close()


def test_second_server_on_the_same_directory_is_refused(shared: ServerProcess) -> None:
    out = subprocess.run([sys.executable, "-m", "shardmgr", "serve", "--data", str(shared.data_dir), "--port", "0"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "in use by another process" in out.stderr
    with RpcClient(shared.address) as client:
        assert client.call("ping").result == {}


def test_stats_cli_and_metrics_endpoint(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    proc = ServerProcess(tmp_path / "data", "--metrics-port", str(metrics_port)).start()
    try:
        with RpcClient(proc.address) as client:
            client.call("ping")
        out = subprocess.run([sys.executable, "-m", "shardmgr", "stats", "--port", str(proc.port), "--json"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        stats = json.loads(out.stdout)
        assert stats["server"]["requests_total"] >= 1 and "flusher" in stats
        table = subprocess.run([sys.executable, "-m", "shardmgr", "stats", "--port", str(proc.port)],
                               capture_output=True, text=True, timeout=60)
        assert table.returncode == 0 and "requests_total" in table.stdout
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        assert "shardmgr_server_requests_total" in text
    finally:
        proc.kill()


def test_stats_cli_reports_an_unreachable_server(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "shardmgr", "stats", "--port", "1", "--timeout", "0.3"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "cannot reach" in out.stderr


def test_a_connection_over_max_connections_gets_unavailable(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text("max_connections = 3\n")
    proc = ServerProcess(tmp_path / "data", "--config", str(config)).start()
    clients = [RpcClient(proc.address) for _ in range(3)]
    try:
        for client in clients:
            client.call("ping")
        extra = RpcClient(proc.address, retry_for=0)
        with pytest.raises(Unavailable) as refused:
            extra.call("ping")
        assert type(refused.value) is Unavailable and "max_connections" in str(refused.value)
        clients.pop().close()  # room again: a new client is served
        deadline = time.monotonic() + 10
        while True:
            try:
                assert RpcClient(proc.address, retry_for=0).call("ping").result == {}
                break
            except Unavailable:
                assert time.monotonic() < deadline, "the freed slot was never reused"
                time.sleep(0.05)
    finally:
        for client in clients:
            client.close()
        proc.kill()


def test_a_taken_metrics_port_ends_the_start_before_the_service_port_opens(tmp_path: Path) -> None:
    with socket.socket() as taken, socket.socket() as spare:
        taken.bind(("127.0.0.1", 0))
        taken.listen()  # another process's metrics port, say
        spare.bind(("127.0.0.1", 0))
        metrics_port, port = taken.getsockname()[1], spare.getsockname()[1]
        spare.close()
        proc = ServerProcess(tmp_path / "data", "--metrics-port", str(metrics_port), port=port)
        answered = []

        def start() -> None:
            with contextlib.suppress(NotReady):  # (it must exit before it is ready: asserted below)
                proc.start()

        starting = threading.Thread(target=start)
        starting.start()
        try:
            while starting.is_alive():  # until it exits: the service port never takes a connection
                with socket.socket() as probe:
                    probe.settimeout(1.0)
                    if probe.connect_ex(("127.0.0.1", port)) == 0:
                        answered.append(port)
                starting.join(0.01)
        finally:
            starting.join(60)
            proc.kill()
    assert proc.proc is not None and proc.proc.returncode == 1, proc.log
    assert proc.log[-1].startswith(f"shardmgr serve: cannot bind the metrics port 127.0.0.1:{metrics_port}: "
                                   "Address already in use"), proc.log
    assert answered == [] and not proc.ready_file.exists()
