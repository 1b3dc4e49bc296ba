"""Thread per connection or one selector thread: what each costs a Python server per request.

A question for the server's I/O design (issue 24), asked without the rest
of the server: a bare echo of 64-byte frames, served in Python either by
one thread per connection (blocking ``recv``, as ``shardmgr serve``'s
readers) or by one thread over a ``selectors`` loop (non-blocking sockets),
with ``--clients`` client processes each sending a frame and waiting for
its echo, ``--requests`` times. Printed per model and client count:
requests/s, the server's CPU per request (user + system, /proc), and with
``perf`` its context switches and futex calls per request. Models and
client counts alternate within each of ``--runs`` rounds.

    PYTHONPATH=. python tools/bench_io_model.py --clients 1,2 --runs 3
"""

from __future__ import annotations

import argparse
import multiprocessing
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psutil

FRAME = b"x" * 64


def _threads(listener: socket.socket) -> None:
    def serve(conn: socket.socket) -> None:
        while data := conn.recv(65536):
            conn.sendmsg([data])

    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def _selector(listener: socket.socket) -> None:
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is listener:
                conn, _ = listener.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ)
                continue
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                continue
            if not data:
                sel.unregister(sock)
                sock.close()
                continue
            sock.sendmsg([data])  # 64 bytes into an empty send buffer: never blocks


def _server(model: str, ports: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    ports.put(listener.getsockname()[1])
    (_threads if model == "threads" else _selector)(listener)


def _client(port: int, requests: int, done: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(requests):
        sock.sendall(FRAME)
        got = 0
        while got < len(FRAME):
            got += len(sock.recv(65536))
    done.put(1)


def measure(model: str, clients: int, requests: int, out: Path) -> dict[str, float]:
    ports: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
    server = multiprocessing.Process(target=_server, args=(model, ports), daemon=True)
    server.start()
    try:
        port = ports.get(timeout=30)
        proc = psutil.Process(server.pid)
        perf = None
        if shutil.which("perf"):
            perf = subprocess.Popen(["perf", "stat", "-x", ",", "-e", "context-switches,syscalls:sys_enter_futex",
                                     "-p", str(server.pid), "-o", str(out)], stderr=subprocess.DEVNULL)
            time.sleep(0.3)
        done: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        procs = [multiprocessing.Process(target=_client, args=(port, requests, done)) for _ in range(clients)]
        before, started = proc.cpu_times(), time.perf_counter()
        for p in procs:
            p.start()
        for _ in procs:
            done.get(timeout=600)
        seconds, after = time.perf_counter() - started, proc.cpu_times()
        for p in procs:
            p.join()
        total = clients * requests
        result = {"requests/s": total / seconds,
                  "server CPU µs": (after.user + after.system - before.user - before.system) / total * 1e6}
        if perf is not None:
            perf.send_signal(signal.SIGINT)
            perf.wait()
            for line in out.read_text().splitlines():
                fields = line.split(",")
                if len(fields) > 2 and fields[0].isdigit():
                    result[fields[2].removeprefix("syscalls:sys_enter_")] = int(fields[0]) / total
        return result
    finally:
        server.kill()
        server.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="1,2", help="comma-separated client process counts")
    parser.add_argument("--requests", type=int, default=10_000, help="per client")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    counts = [int(c) for c in args.clients.split(",")]
    seen: dict[tuple[str, int], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        for _ in range(args.runs):
            for model in ("threads", "selector"):
                for clients in counts:
                    result = measure(model, clients, args.requests, Path(scratch) / "perf.csv")
                    seen.setdefault((model, clients), []).append(result)
    for (model, clients), runs in seen.items():
        cells = []
        for key in runs[0]:
            values = [r[key] for r in runs if key in r]
            cells.append(f"{key} {statistics.median(values):,.2f} [{min(values):,.2f}-{max(values):,.2f}]")
        print(f"{model:>8}, {clients} clients: " + "; ".join(cells))


if __name__ == "__main__":
    main()
