"""RPC benchmark: the real server vs a plain socket echo server, same run.

Both servers run as subprocesses on loopback and are driven by the same
client code (common.wire.client.RpcClient, one connection):

* small requests, one at a time: p50/p99 round-trip latency and requests/s
  (server: ``ping``; baseline: the same frame echoed back);
* small requests pipelined, 64 in flight: requests/s;
* 4 MiB bodies: MB/s of request body (server: ``echo`` with a 4 MiB part,
  which the server decodes and sends back; baseline: the frame echoed).

The echo baseline is a thread-per-connection Python server that reads each
frame (8-byte head, then the rest) and writes it back with sendall: the
floor for any framed protocol served by CPython on this machine.

Targets (issue 3): >= 0.5 x the baseline's requests/s, >= 0.8 x its MB/s for
4 MiB bodies.

Usage: python tools/bench_rpc.py [--requests N] [--json]
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from emit import emit  # tools/emit.py, beside this file
from rich.console import Console
from rich.table import Table

from common.wire.client import RpcClient
from shardmgr.server import readiness

WINDOW = 64
BIG = 4 << 20


def serve_echo(port_file: str) -> None:
    """Baseline: echo the 8-byte preamble, then every frame, unchanged."""
    listener = socket.create_server(("127.0.0.1", 0))
    Path(port_file).write_text(str(listener.getsockname()[1]))
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_echo, args=(conn,), daemon=True).start()


def _echo(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    view = memoryview(bytearray(BIG + (1 << 20)))
    if not _fill(sock, view, 0, 8):
        return
    sock.sendall(view[:8])
    while _fill(sock, view, 0, 8):
        size = struct.unpack_from("<I", view, 0)[0]
        if not _fill(sock, view, 8, size):
            return
        sock.sendall(view[:8 + size])


def _fill(sock: socket.socket, view: memoryview, start: int, size: int) -> bool:
    got = 0
    while got < size:
        k = sock.recv_into(view[start + got:start + size])
        if k == 0:
            return False
        got += k
    return True


def start_echo() -> tuple[subprocess.Popen[bytes], tuple[str, int]]:
    port_file = tempfile.mktemp()
    proc = subprocess.Popen([sys.executable, __file__, "--serve-echo", port_file])
    deadline = time.monotonic() + 30
    while not os.path.exists(port_file) or not Path(port_file).read_text():
        if time.monotonic() > deadline:
            raise RuntimeError("echo server did not start")
        time.sleep(0.02)
    port = int(Path(port_file).read_text())
    os.unlink(port_file)
    return proc, ("127.0.0.1", port)


def start_server(data: Path) -> tuple[subprocess.Popen[bytes], tuple[str, int]]:
    """``shardmgr serve`` on a free port; returns once its ready file says where."""
    ready, log = data.with_name(data.name + ".ready"), data.with_name(data.name + ".log")
    with open(log, "wb") as stderr:  # the server's log: kept beside the data, shown if it fails to start
        proc = subprocess.Popen([sys.executable, "-m", "shardmgr", "serve", "--data", str(data), "--port", "0",
                                 "--ready-file", str(ready)], stderr=stderr)
    return proc, readiness.wait(ready, proc, 3600, log=log.read_text)


def sequential(client: RpcClient, cmd: str, n: int) -> dict[str, float]:
    latencies = np.empty(n)
    started = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        client.call(cmd)
        latencies[i] = time.perf_counter() - t
    elapsed = time.perf_counter() - started
    return {"rps": n / elapsed, "p50_us": float(np.percentile(latencies, 50) * 1e6),
            "p99_us": float(np.percentile(latencies, 99) * 1e6)}


def pipelined(client: RpcClient, cmd: str, n: int) -> float:
    started = time.perf_counter()
    inflight: list[int] = []
    for _ in range(n):
        inflight.append(client.send(cmd))
        if len(inflight) >= WINDOW:
            client.receive(inflight.pop(0))
    for request_id in inflight:
        client.receive(request_id)
    return n / (time.perf_counter() - started)


def big_bodies(client: RpcClient, n: int) -> float:
    body = np.frombuffer(os.urandom(BIG), dtype=np.uint8)
    client.call("echo", parts={"b": body})  # warm up
    started = time.perf_counter()
    for _ in range(n):
        reply = client.call("echo", parts={"b": body})
        assert reply.parts["b"].nbytes == BIG
    return n * BIG / (time.perf_counter() - started) / 1e6


def measure(address: tuple[str, int], cmd: str, requests: int) -> dict[str, float]:
    with RpcClient(address) as client:
        sequential(client, cmd, 500)  # warm up
        result = sequential(client, cmd, requests)
        result["pipelined_rps"] = pipelined(client, cmd, requests * 3)
        result["big_MBps"] = big_bodies(client, 100)
    return result


def run(requests: int) -> dict[str, dict[str, float]]:
    echo, echo_address = start_echo()
    with tempfile.TemporaryDirectory() as data:
        server, address = start_server(Path(data) / "data")
        try:
            baseline = measure(echo_address, "ping", requests)
            ours = measure(address, "ping", requests)
        finally:
            server.terminate()
            server.wait(30)
            echo.kill()
    return {"echo": baseline, "server": ours,
            "ratio": {k: ours[k] / baseline[k] for k in ours}}


def show(results: dict[str, dict[str, float]]) -> None:
    table = Table(title="RPC over loopback, one connection (client and server share 2 cores)")
    for col in ("what", "echo baseline", "shardmgr serve", "ratio"):
        table.add_column(col, justify="right")
    rows = [("sequential requests/s", "rps", "{:,.0f}"), ("p50 round trip (us)", "p50_us", "{:,.1f}"),
            ("p99 round trip (us)", "p99_us", "{:,.1f}"), ("pipelined requests/s (64 in flight)",
                                                           "pipelined_rps", "{:,.0f}"),
            ("4 MiB bodies, MB/s", "big_MBps", "{:,.0f}")]
    for label, key, fmt in rows:
        table.add_row(label, fmt.format(results["echo"][key]), fmt.format(results["server"][key]),
                      f"{results['ratio'][key]:.2f}")
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000, help="sequential requests per server")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve-echo", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo:
        serve_echo(args.serve_echo)
        return
    results = run(args.requests)
    emit(results, args.json, show)


if __name__ == "__main__":
    main()
