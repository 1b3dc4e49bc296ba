"""Resource benchmark: what idle connections and a slow-frame attack cost a real server.

Starts ``shardmgr serve`` (whatever tree PYTHONPATH names) on loopback and measures its RSS
(psutil) and thread count:

* ``idle``: the server alone, then with N connections that did the handshake and send nothing;
  a fresh client's ping latency while they are open. With ``--auth`` the server has a tokens
  file, and two groups of N are measured in turn: connections that sent nothing yet (not
  authenticated), then connections that authenticated and stay idle;
* ``reader``: the CPU time FrameReader.read takes per small (ping) frame, in-process, when
  each recv brings one frame and when frames come in pipelined bursts (the part of the hot
  path the budget and the deadline touch; CPU time, minimum of 15 runs, so other load on
  the machine matters less than for tools/bench_rpc.py);
* ``attack``: N connections each declare a frame of D bytes and send S bytes of it, slowly, in
  64 KiB steps (issue 11: 200 x 256 MiB declared, 8 MiB sent). Reported: the server's RSS
  before and at its peak, a well-behaved client's pings and 1 KiB echoes per second and
  its slowest call during the attack, and how the attackers' connections ended.

Server settings go in with ``--set key=value`` (ServerConfig TOML keys), so the same
command runs against an older tree without the newer keys.

Usage: python tools/bench_limits.py idle [--connections 2000] [--auth] [--json]
       python tools/bench_limits.py reader [--json]
       python tools/bench_limits.py attack [--connections 200 --declare 268435456 --send 8388608]
                                           [--seconds 30] [--set frame_timeout_s=10] [--json]
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import psutil
from emit import emit  # tools/emit.py, beside this file
from rich.console import Console
from rich.table import Table

from common.wire import framing
from common.wire.client import RpcClient
from common.wire.frame_reader import FrameReader
from shardmgr.server import readiness
from shardmgr.server.auth import add_token

STEP = 64 << 10


def start_server(data: Path, settings: list[str]) -> subprocess.Popen[bytes]:
    """``shardmgr serve`` with the given TOML settings; returns once ready (port in ``proc.port``)."""
    config = data.with_name("server.toml")
    config.write_text("".join(f"{line}\n" for line in settings))
    ready, log = data.with_name("ready"), data.with_name("log")
    with open(log, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "shardmgr", "serve", "--data", str(data), "--port", "0",
                                 "--ready-file", str(ready), "--config", str(config)], stderr=stderr)
    proc.port = readiness.wait(ready, proc, 120, log=log.read_text)[1]  # type: ignore[attr-defined]
    return proc


def connect(port: int, n: int, token: str | None = None, silent: bool = False) -> list[socket.socket]:
    """``n`` connections that completed the handshake (and authenticated with ``token``), or,
    ``silent``, that sent nothing at all."""
    socks = []
    for _ in range(n):
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        if not silent:
            auth = framing.encode({"id": 1, "cmd": "auth", "args": {"token": token}}) if token else []
            sock.sendall(b"".join([framing.preamble(), *auth]))
        socks.append(sock)
    for sock in [] if silent else socks:
        receive(sock, 8)
        if token:
            size, header_size = framing.FRAME_HEAD.unpack(receive(sock, framing.FRAME_HEAD.size))
            reply = msgpack.unpackb(receive(sock, size)[:header_size])
            if "ok" not in reply:
                raise RuntimeError(f"auth refused: {reply}")
    return socks


def receive(sock: socket.socket, n: int) -> bytes:
    got = b""
    while len(got) < n:
        chunk = sock.recv(n - len(got))
        if not chunk:
            raise RuntimeError("the server closed a connection during the handshake")
        got += chunk
    return got


def memory(proc: psutil.Process) -> dict[str, float]:
    return {"rss_MiB": proc.memory_info().rss / 2**20, "threads": proc.num_threads()}


def idle(port: int, server: psutil.Process, connections: int, token: str | None = None) -> dict[str, Any]:
    time.sleep(1)
    results: dict[str, Any] = {}
    socks: list[socket.socket] = []
    if token:  # first the connections that sent nothing (no token yet), on top of them the authenticated ones
        before = memory(server)
        socks += connect(port, connections, silent=True)
        time.sleep(2)
        during = memory(server)
        results.update(silent_during=during, silent_per_connection_KiB=(
            (during["rss_MiB"] - before["rss_MiB"]) * 1024 / max(1, connections)))
    before = memory(server)
    socks += connect(port, connections, token)
    time.sleep(2)  # let every connection's threads start and block
    during = memory(server)
    with RpcClient(("127.0.0.1", port), token=token) as client:
        client.call("ping")
        started = time.perf_counter()
        for _ in range(1000):
            client.call("ping")
        ping_us = (time.perf_counter() - started) / 1000 * 1e6
    for sock in socks:
        sock.close()
    per_connection = (during["rss_MiB"] - before["rss_MiB"]) * 1024 / max(1, connections)
    return {"connections": connections, "before": before, "during": during,
            "per_connection_KiB": per_connection, "ping_us_during": ping_us, **results}


class Polite(threading.Thread):
    """A well-behaved client: pings and 1 KiB echoes, one at a time, until stopped."""

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port, self.calls, self.slowest, self.failure = port, 0, 0.0, ""
        self.stop = threading.Event()

    def run(self) -> None:
        body = np.arange(256, dtype=np.float32)
        try:
            with RpcClient(("127.0.0.1", self.port), timeout=60) as client:
                while not self.stop.is_set():
                    started = time.perf_counter()
                    client.call("ping")
                    client.call("echo", {"n": self.calls}, {"b": body})
                    self.slowest = max(self.slowest, time.perf_counter() - started)
                    self.calls += 1
        except Exception as exc:  # reported, not raised: the benchmark goes on
            self.failure = f"{type(exc).__name__}: {exc}"


def attack(port: int, server: psutil.Process, connections: int, declare: int, send: int,
           seconds: float) -> dict[str, Any]:
    socks = connect(port, connections)
    time.sleep(1)
    before = memory(server)
    header = msgpack.packb({"id": 1, "cmd": "echo", "parts": [["b", "|u1", [declare]]]})
    header = msgpack.packb({"id": 1, "cmd": "echo", "parts": [["b", "|u1", [declare - len(header)]]]})
    head = struct.pack("<II", declare, len(header)) + header  # a frame of exactly ``declare`` bytes
    for sock in socks:
        sock.sendall(head)
        sock.setblocking(False)
    polite = Polite(port)
    polite.start()
    sent = [0] * connections
    ended: dict[str, int] = {}
    open_socks = dict(enumerate(socks))
    chunk = bytes(STEP)
    peak = dict(before)
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        for i, sock in list(open_socks.items()):
            name = _ended(sock)
            if name is None and sent[i] < send:
                try:
                    sent[i] += sock.send(chunk[:min(STEP, send - sent[i])])
                except BlockingIOError:
                    pass
                except OSError as exc:
                    name = _ended(sock) or type(exc).__name__
            if name is not None:
                ended[name] = ended.get(name, 0) + 1
                del open_socks[i]
        now = memory(server)
        peak = {k: max(peak[k], now[k]) for k in peak}
        time.sleep(0.05)  # slowly: about 1.3 MB/s per connection
    polite.stop.set()
    polite.join(60)
    for sock in socks:
        sock.close()
    return {"connections": connections, "declared_bytes": declare, "sent_bytes_each": send,
            "bytes_sent_total": sum(sent), "seconds": seconds, "before": before, "peak": peak,
            "growth_MiB": peak["rss_MiB"] - before["rss_MiB"], "attackers_ended": ended,
            "attackers_still_open": len(open_socks), "polite_calls_per_s": polite.calls / seconds,
            "polite_slowest_s": polite.slowest, "polite_failure": polite.failure}


def _ended(sock: socket.socket) -> str | None:
    """How the server ended this connection (an error code, ``closed``), or None if it did not."""
    try:
        data = sock.recv(1 << 16)
    except BlockingIOError:
        return None
    except OSError as exc:
        return type(exc).__name__
    return _error_code(data) if data else "closed"


def _error_code(data: bytes) -> str:
    """The code of the error frame at the start of ``data`` (``?`` if it is not one)."""
    try:
        size, header_size = struct.unpack_from("<II", data)
        return str(msgpack.unpackb(data[8:8 + header_size])["error"]["code"])
    except Exception:
        return "?"


class _Feed:
    """A socket stand-in that hands out ``n`` copies of ``frame``, one frame
    per recv or as much as fits (a pipelined burst)."""

    def __init__(self, frame: bytes, n: int, burst: bool) -> None:
        self._frame, self._n, self._burst, self._left = frame, n, burst, memoryview(b"")

    def recv_into(self, buffer: memoryview, nbytes: int = 0, flags: int = 0) -> int:
        if not self._left:
            if not self._n:
                return 0
            count = min(self._n, len(buffer) // len(self._frame) or 1) if self._burst else 1
            self._n -= count
            self._left = memoryview(self._frame * count)
        k = min(len(buffer), len(self._left))
        buffer[:k] = self._left[:k]
        self._left = self._left[k:]
        return k


def reader() -> dict[str, Any]:
    frame = b"".join(bytes(b) for b in framing.encode({"id": 1, "cmd": "ping"}))
    n, results = 100_000, {}
    for name, burst in (("one_frame_per_recv_ns", False), ("pipelined_burst_ns", True)):
        runs = []
        for _ in range(15):
            feed = FrameReader(_Feed(frame, n, burst))  # type: ignore[arg-type]
            started = time.process_time()
            while feed.read() is not None:
                pass
            runs.append((time.process_time() - started) / n * 1e9)
        results[name] = min(runs)
    return results


def show(results: dict[str, Any]) -> None:
    table = Table(title=f"shardmgr serve under load: {results['mode']}")
    table.add_column("what")
    table.add_column("value", justify="right")
    for key, value in results.items():
        table.add_row(key, f"{value:,.2f}" if isinstance(value, float) else str(value))
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["idle", "attack", "reader"])
    parser.add_argument("--connections", type=int, default=None, help="idle: 2000, attack: 200")
    parser.add_argument("--declare", type=int, default=256 << 20, help="attack: the frame size each declares")
    parser.add_argument("--send", type=int, default=8 << 20, help="attack: the bytes each sends of it")
    parser.add_argument("--seconds", type=float, default=30.0, help="attack: how long it lasts")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a ServerConfig TOML line, e.g. frame_timeout_s=10")
    parser.add_argument("--auth", action="store_true",
                        help="idle: a tokens file; measure silent, then authenticated connections")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.mode == "reader":
        emit({"mode": "reader", "tree": os.environ.get("PYTHONPATH", ""), **reader()}, args.json, show)
        return
    resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
    with tempfile.TemporaryDirectory() as tmp:
        token = add_token(Path(tmp) / "tokens", "bench", ["read"]) if args.auth else None
        settings = [f'auth_file = "{Path(tmp) / "tokens"}"', "handshake_timeout_s = 300.0"] if args.auth else []
        proc = start_server(Path(tmp) / "data", settings + args.set)
        server = psutil.Process(proc.pid)
        try:
            if args.mode == "idle":
                results = idle(proc.port, server, args.connections or 2000, token)  # type: ignore[attr-defined]
            else:
                results = attack(proc.port, server, args.connections or 200,  # type: ignore[attr-defined]
                                 args.declare, args.send, args.seconds)
        finally:
            proc.terminate()
            proc.wait(60)
    emit({"mode": args.mode, "settings": args.set, "tree": os.environ.get("PYTHONPATH", ""), **results},
         args.json, show)


if __name__ == "__main__":
    main()
