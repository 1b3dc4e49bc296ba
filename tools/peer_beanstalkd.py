"""beanstalkd as a peer of tools/bench_workq.py, through a raw protocol client.

``beanstalkd -b DIR -f 5``: a binlog, fsync at most every 5 ms, so a put is
acknowledged before it is durable (as with workq's default group commit).
Tasks go to one tube, results to another. With B > 1 every role pipelines B
commands per round trip (``put``, ``reserve-with-timeout 0``, ``delete``);
with B = 1 a producer sends one ``put`` and waits for its reply, and a worker
sends ``reserve-with-timeout 1``, then the result's ``put`` and the task's
``delete`` in one write (the analogue of Redis's one pipeline per batch).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from peer import JOB, Begin, Peer, free_port, wait_port

RESULTS = b"results"


class _Beanstalk:
    """A raw, pipelining beanstalkd protocol client."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("beanstalkd closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def lines(self, count: int) -> None:
        for _ in range(count):
            self.line()

    def body(self, size: int) -> bytes:
        while len(self.buf) < size + 2:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("beanstalkd closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:size], self.buf[size + 2:]
        return data

    def reserve_many(self, count: int, timeout: int = 0) -> list[bytes]:
        """``count`` pipelined reserve-with-timeout; ids of the jobs reserved."""
        self.send(b"reserve-with-timeout %d\r\n" % timeout * count)
        ids = []
        for _ in range(count):
            reply = self.line().split()
            if reply[0] == b"RESERVED":
                self.body(int(reply[2]))
                ids.append(reply[1])
        return ids


def _put(size: int) -> bytes:
    return b"put 0 0 600 %d\r\n%s\r\n" % (size, os.urandom(size))


class Beanstalkd(Peer):
    name = "beanstalkd -f 5"

    def start(self, base: Path) -> None:
        self.port = free_port()
        (base / "binlog").mkdir()
        self.proc = subprocess.Popen(["beanstalkd", "-l", "127.0.0.1", "-p", str(self.port), "-b",
                                      str(base / "binlog"), "-f", "5", "-z", "65535"])
        wait_port(self.port)

    def _client(self, *commands: bytes) -> _Beanstalk:
        client = _Beanstalk(self.port)
        client.send(b"".join(c + b"\r\n" for c in commands))
        client.lines(len(commands))
        return client

    def produce(self, items: int, batch: int, size: int, begin: Begin) -> None:
        client = self._client(b"use " + JOB.encode())
        put = _put(size)
        begin()
        for start in range(0, items, batch):
            count = min(batch, items - start)
            client.send(put * count)
            client.lines(count)

    def work(self, index: int, batch: int, size: int, begin: Begin, stop: Any) -> None:
        client = self._client(b"watch " + JOB.encode(), b"ignore default", b"use " + RESULTS)
        put = _put(size)
        begin()
        while True:
            ids = client.reserve_many(1, timeout=1) if batch == 1 else client.reserve_many(batch)
            if not ids:
                if stop.is_set():
                    return
                if batch > 1:
                    time.sleep(0.01)
                continue
            client.send(b"".join(put + b"delete " + job_id + b"\r\n" for job_id in ids))
            client.lines(2 * len(ids))

    def consume(self, items: int, begin: Begin) -> None:
        client = self._client(b"watch " + RESULTS, b"ignore default")
        begin()
        got = 0
        while got < items:
            ids = client.reserve_many(min(1000, items - got))
            if not ids:
                time.sleep(0.01)
                continue
            client.send(b"".join(b"delete " + job_id + b"\r\n" for job_id in ids))
            client.lines(len(ids))
            got += len(ids)

    def produce_single(self, seconds: float, size: int, begin: Begin) -> int:
        client = self._client(b"use " + JOB.encode())
        put = _put(size)
        count = 0
        begin()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            client.send(put)
            client.line()
            count += 1
        return count

    def leftover(self) -> int | None:
        client = _Beanstalk(self.port)
        client.send(b"stats-tube " + JOB.encode() + b"\r\n")
        reply = client.line().split()
        if reply[0] == b"NOT_FOUND":  # beanstalkd drops a tube once it is empty and unused
            client.sock.close()
            return 0
        size = int(reply[1])
        stats = dict(line.split(b": ", 1) for line in client.body(size).splitlines() if b": " in line)
        client.sock.close()
        return sum(int(stats[b"current-jobs-" + state]) for state in (b"ready", b"reserved", b"delayed"))
