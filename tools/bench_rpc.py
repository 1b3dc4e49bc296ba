"""RPC benchmark: the real server vs a plain socket echo server, same run.

Both servers run as subprocesses on loopback and are driven by the same
client code (common.wire.client.RpcClient, one connection):

* small requests, one at a time: p50/p99 round-trip latency, requests/s
  and the server process's CPU time per request (user + system, /proc)
  (server: ``ping``; baseline: the same frame echoed back);
* small requests pipelined, 64 in flight: requests/s;
* 4 MiB bodies: MB/s of request body (server: ``echo`` with a 4 MiB part,
  which the server decodes and sends back; baseline: the frame echoed).

The echo baseline is a thread-per-connection Python server that reads each
frame (8-byte head, then the rest) and writes it back with sendall: the
floor for any framed protocol served by CPython on this machine.

Targets (issue 3): >= 0.5 x the baseline's requests/s, >= 0.8 x its MB/s for
4 MiB bodies.

The cost of security (issue 11), three more servers, measured in
``--runs`` interleaved rounds (plain, token, TLS, plain, token, TLS, ...),
each figure the median over the rounds with its min-max spread:

* auth per connection: connect + preamble (+ ``auth``) + close, on a server
  without a tokens file vs one with a tokens file and a token;
* TLS: the same connection cost with a TLS handshake, and throughput of
  small requests (sequential and pipelined) and 4 MiB bodies over TLS as a
  ratio to plain TCP, and the CPU time (server process + client) each
  pipelined request and each 4 MiB echo costs, which other load on the
  machine does not change the way it changes throughput (a throwaway CA and certificate, ECDSA P-256,
  made with tests/shardmgr/server/certs.py, which needs the [test] extra).

Instructions (issue 24, ``--callgrind``, needs valgrind): server and client
instructions (callgrind Ir) per sequential ``ping``, shardmgr serve and the
echo baseline, counted after a warm-up (tools/instructions.py: how, and the
flush interval they are counted with); stable where seconds are not.

Usage: python tools/bench_rpc.py [--requests N] [--runs R] [--only echo|security|callgrind] [--callgrind]
       [--callgrind-requests N] [--json]
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import instructions  # tools/instructions.py, beside this file
import numpy as np
from emit import emit  # tools/emit.py, beside this file
from rich.console import Console
from rich.table import Table

from common.wire.client import RpcClient
from shardmgr.server import readiness
from shardmgr.server.auth import add_token

WINDOW = 64
BIG = 4 << 20
CALLGRIND_WARMUP = 200  # requests before counting: imports, first-call caches, the connection's buffers
ECHO_TICK_S = 0.05  # the echo baseline's wake-up under callgrind (serve_echo)


def serve_echo(port_file: str, tick: float | None = None) -> None:
    """Baseline: echo the 8-byte preamble, then every frame, unchanged. ``tick``: wake the
    accepting thread that often (under callgrind: vgdb reaches a process whose threads all
    block only through ptrace, which containers may refuse; tools/instructions.py)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(tick)
    Path(port_file).write_text(str(listener.getsockname()[1]))
    while True:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
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


def start_echo(prefix: Sequence[str] = (), *extra: str,
               timeout: float = 30.0) -> tuple[subprocess.Popen[bytes], tuple[str, int]]:
    """The echo baseline (``prefix``: what to run it under); returns once it listens."""
    port_file = tempfile.mktemp()
    proc = subprocess.Popen([*prefix, sys.executable, __file__, "--serve-echo", port_file, *extra])
    deadline = time.monotonic() + timeout
    while not os.path.exists(port_file) or not Path(port_file).read_text():
        if time.monotonic() > deadline:
            raise RuntimeError("echo server did not start")
        time.sleep(0.02)
    port = int(Path(port_file).read_text())
    os.unlink(port_file)
    return proc, ("127.0.0.1", port)


def start_server(data: Path, *extra: str,
                 prefix: Sequence[str] = ()) -> tuple[subprocess.Popen[bytes], tuple[str, int]]:
    """``shardmgr serve`` (``prefix``: what to run it under) on a free port; returns once its ready file says where."""
    ready, log = data.with_name(data.name + ".ready"), data.with_name(data.name + ".log")
    with open(log, "wb") as stderr:  # the server's log: kept beside the data, shown if it fails to start
        proc = subprocess.Popen([*prefix, sys.executable, "-m", "shardmgr", "serve", "--data", str(data), "--port", "0",
                                 "--ready-file", str(ready), "--log-level", "WARNING", *extra], stderr=stderr)
    return proc, readiness.wait(ready, proc, 3600, log=log.read_text)


def sequential(client: RpcClient, cmd: str, n: int, pid: int) -> dict[str, float]:
    latencies = np.empty(n)
    cpu = cpu_seconds(pid)
    started = time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        client.call(cmd)
        latencies[i] = time.perf_counter() - t
    elapsed = time.perf_counter() - started
    return {"rps": n / elapsed, "p50_us": float(np.percentile(latencies, 50) * 1e6),
            "p99_us": float(np.percentile(latencies, 99) * 1e6),
            "server_cpu_us": (cpu_seconds(pid) - cpu) / n * 1e6}


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


def measure(address: tuple[str, int], pid: int, cmd: str, requests: int) -> dict[str, float]:
    with RpcClient(address) as client:
        sequential(client, cmd, 500, pid)  # warm up
        result = sequential(client, cmd, requests, pid)
        result["pipelined_rps"] = pipelined(client, cmd, requests * 3)
        result["big_MBps"] = big_bodies(client, 100)
    return result


def run(requests: int) -> dict[str, dict[str, float]]:
    echo, echo_address = start_echo()
    with tempfile.TemporaryDirectory() as data:
        server, address = start_server(Path(data) / "data")
        try:
            baseline = measure(echo_address, echo.pid, "ping", requests)
            ours = measure(address, server.pid, "ping", requests)
        finally:
            server.terminate()
            server.wait(30)
            echo.kill()
    return {"echo": baseline, "server": ours,
            "ratio": {k: ours[k] / baseline[k] for k in ours}}


def ping_client(address: str) -> Callable[[], object]:
    """The counted client's call (tools/instructions.py): one ``ping`` on one connection to ``address``."""
    host, port = address.rsplit(":", 1)
    client = RpcClient((host, int(port)))
    client.connect()
    return functools.partial(client.call, "ping")


def run_callgrind(requests: int) -> dict[str, Any]:
    """Server and client instructions per ``ping``: shardmgr serve, then the echo baseline (same frame)."""
    windows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        starts: dict[str, tuple[str, Callable[[Path], tuple[subprocess.Popen[bytes], tuple[str, int]]]]] = {
            "ping": ("ping, shardmgr serve", lambda out: start_server(
                root / "data", "--flush-interval-ms", instructions.FLUSH_INTERVAL_MS, prefix=instructions.prefix(out))),
            "echo": ("ping frame, echo baseline", lambda out: start_echo(
                instructions.prefix(out), "--echo-tick", str(ECHO_TICK_S), timeout=instructions.START_TIMEOUT_S))}
        for label, (what, start) in starts.items():
            out = root / f"{label}.server"
            proc, (host, port) = start(out)
            with instructions.Counted(proc, out) as server:
                windows.append(instructions.count(server, "bench_rpc:ping_client", f"{host}:{port}", root, label=label,
                                                  what=what, warmup=CALLGRIND_WARMUP, requests=requests))
    return instructions.report(windows)


def show_instructions(results: dict[str, Any]) -> None:
    instructions.show(results, "RPC over loopback, one connection, sequential", baseline="echo")


def connects(address: tuple[str, int], n: int, **options: object) -> float:
    """Median seconds for one connect + handshake (+ auth) + close."""
    times = np.empty(n)
    for i in range(n):
        t = time.perf_counter()
        client = RpcClient(address, **options)  # type: ignore[arg-type]
        client.connect()
        client.close()
        times[i] = time.perf_counter() - t
    return float(np.median(times))


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def security_round(address: tuple[str, int], pid: int, requests: int, big: int,
                   **options: object) -> dict[str, float]:
    """Throughputs, and CPU (server + client) per request and per MiB: CPU time
    is what the work costs whatever else the machine is doing."""
    with RpcClient(address, **options) as client:  # type: ignore[arg-type]
        sequential(client, "ping", 200, pid)  # warm up
        result = {"connect_us": connects(address, 200, **options) * 1e6,
                  "rps": sequential(client, "ping", requests, pid)["rps"]}
        cpu = cpu_seconds(pid) + time.process_time()
        result["pipelined_rps"] = pipelined(client, "ping", requests * 3)
        result["cpu_us_per_request"] = (cpu_seconds(pid) + time.process_time() - cpu) / (requests * 3) * 1e6
        cpu = cpu_seconds(pid) + time.process_time()
        result["big_MBps"] = big_bodies(client, big)
        result["cpu_ms_per_4MiB_echo"] = (cpu_seconds(pid) + time.process_time() - cpu) / (big + 1) * 1e3
    return result


def run_security(requests: int, runs: int) -> dict[str, dict[str, dict[str, float]]]:
    """Plain, token and TLS servers measured in interleaved rounds; medians and spreads."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's tests/, for its throwaway CA
    from tests.shardmgr.server.certs import make_pki  # needs `cryptography` (the [test] extra)

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pki = make_pki(root / "pki")
        token = add_token(root / "tokens", "bench", ["admin"])
        setups: dict[str, tuple[tuple[str, ...], dict[str, object]]] = {  # server options, client options
            "plain": ((), {"token": None}),
            "token": (("--auth-file", str(root / "tokens")), {"token": token}),
            "tls": (("--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)),
                    {"token": None, "ca": str(pki.ca)})}
        servers = {name: start_server(root / name, *args) for name, (args, _) in setups.items()}
        rounds: dict[str, list[dict[str, float]]] = {name: [] for name in setups}
        try:
            for _ in range(runs):
                for name, (_, options) in setups.items():
                    proc, address = servers[name]
                    rounds[name].append(security_round(address, proc.pid, requests, 30, **options))
        finally:
            for proc, _ in servers.values():
                proc.terminate()
                proc.wait(30)
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name, measured in rounds.items():
        results[name] = {key: {"median": statistics.median(r[key] for r in measured),
                               "min": min(r[key] for r in measured), "max": max(r[key] for r in measured)}
                         for key in measured[0]}
    plain = results["plain"]
    results["ratio_to_plain"] = {f"{name}_{key}": {"median": results[name][key]["median"] / plain[key]["median"]}
                                 for name in ("token", "tls") for key in plain}
    return results


def show_security(results: dict[str, dict[str, dict[str, float]]]) -> None:
    table = Table(title="cost of auth and TLS: medians of interleaved rounds (min-max)")
    for col in ("what", "plain TCP", "with a token", "TLS", "token / plain", "TLS / plain"):
        table.add_column(col, justify="right")
    rows = [("connect + handshake + close (us)", "connect_us", "{:,.0f}"),
            ("sequential small requests/s", "rps", "{:,.0f}"),
            ("pipelined small requests/s (64 in flight)", "pipelined_rps", "{:,.0f}"),
            ("4 MiB bodies, MB/s", "big_MBps", "{:,.0f}"),
            ("CPU per pipelined request (us, both ends)", "cpu_us_per_request", "{:,.1f}"),
            ("CPU per 4 MiB echo (ms, both ends)", "cpu_ms_per_4MiB_echo", "{:,.2f}")]
    for label, key, fmt in rows:
        cells = [f"{fmt.format(results[n][key]['median'])} ({fmt.format(results[n][key]['min'])}-"
                 f"{fmt.format(results[n][key]['max'])})" for n in ("plain", "token", "tls")]
        ratios = [f"{results['ratio_to_plain'][f'{n}_{key}']['median']:.2f}" for n in ("token", "tls")]
        table.add_row(label, *cells, *ratios)
    Console().print(table)


def show(results: dict[str, dict[str, float]]) -> None:
    table = Table(title="RPC over loopback, one connection (client and server share 2 cores)")
    for col in ("what", "echo baseline", "shardmgr serve", "ratio"):
        table.add_column(col, justify="right")
    rows = [("sequential requests/s", "rps", "{:,.0f}"), ("p50 round trip (us)", "p50_us", "{:,.1f}"),
            ("p99 round trip (us)", "p99_us", "{:,.1f}"),
            ("server CPU per sequential request (us)", "server_cpu_us", "{:,.1f}"),
            ("pipelined requests/s (64 in flight)", "pipelined_rps", "{:,.0f}"),
            ("4 MiB bodies, MB/s", "big_MBps", "{:,.0f}")]
    for label, key, fmt in rows:
        table.add_row(label, fmt.format(results["echo"][key]), fmt.format(results["server"][key]),
                      f"{results['ratio'][key]:.2f}")
    Console().print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000, help="sequential requests per server")
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds of the security measurements")
    parser.add_argument("--only", choices=("echo", "security", "callgrind"), help="run one part only")
    parser.add_argument("--callgrind", action="store_true",
                        help="also count instructions per request under valgrind (tools/instructions.py)")
    parser.add_argument("--callgrind-requests", type=int, default=2000, help="counted requests per server")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve-echo", help=argparse.SUPPRESS)
    parser.add_argument("--echo-tick", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo:
        serve_echo(args.serve_echo, args.echo_tick)
        return
    counting = args.callgrind or args.only == "callgrind"
    if counting and (reason := instructions.missing()):
        parser.error(f"--callgrind: {reason}")
    results: dict[str, object] = {}
    if args.only in (None, "echo"):
        results["echo"] = run(args.requests)
    if args.only in (None, "security"):
        results["security"] = run_security(args.requests // 4, args.runs)
    if counting:
        results["instructions"] = run_callgrind(args.callgrind_requests)
    emit(results, args.json, show_all)


def show_all(results: dict[str, Any]) -> None:
    """Each part's tables, in the order they ran."""
    for part, shower in (("echo", show), ("security", show_security), ("instructions", show_instructions)):
        if part in results:
            shower(results[part])


if __name__ == "__main__":
    main()
