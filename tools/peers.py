"""Drivers for tools/bench_workq.py: workq and its peers, one class each.

Each driver starts its server on a free loopback port with a data directory
under ``base``, and offers the benchmark's three roles: ``produce`` (one
producer, batches), ``work`` (run in a worker process: lease a batch, send a
result per item, ack) and ``consume`` (until N results are in). Every client
batches and pipelines the same way: 1000 items per round trip where the
protocol allows it.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


class Peer:
    name = "peer"
    proc: subprocess.Popen[Any]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self, base: Path) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def produce(self, items: int, batch: int, size: int) -> None:
        raise NotImplementedError

    def work(self, index: int, batch: int, size: int, stop: Any) -> None:
        raise NotImplementedError

    def consume(self, items: int) -> None:
        raise NotImplementedError


# ------------------------------------------------------------------------ workq

class Workq(Peer):
    name = "workq"
    durable = False

    def start(self, base: Path) -> None:
        from shardmgr.server import readiness

        ready, log = base / "data.ready", base / "data.log"
        with open(log, "wb") as stderr:  # the server's log: kept beside the data, shown if it fails to start
            self.proc = subprocess.Popen([sys.executable, "-m", "shardmgr", "serve", "--data", str(base / "data"),
                                          "--port", "0", "--ready-file", str(ready)], stderr=stderr)
        host, port = readiness.wait(ready, self.proc, 3600, log=log.read_text)
        self.address = f"{host}:{port}"

    def produce(self, items: int, batch: int, size: int) -> None:
        import workq

        payloads = [os.urandom(size) for _ in range(batch)]
        with workq.connect(self.address) as client:
            for start in range(0, items, batch):
                client.enqueue("job", "m", "s", 1, payloads[: min(batch, items - start)], durable=self.durable)

    def work(self, index: int, batch: int, size: int, stop: Any) -> None:
        import workq

        result = os.urandom(size)
        with workq.Worker(self.address, f"w{index}", models=["m"]) as worker:
            while True:
                items = worker.lease(batch, wait=0.2)
                if not items:
                    if stop.is_set():
                        return
                    continue
                worker.complete([i.handle for i in items], [result] * len(items))

    def consume(self, items: int) -> None:
        import workq

        got = 0
        with workq.connect(self.address) as client:
            while got < items:
                got += len(client.results("job", max_items=5000, wait=1.0))


class WorkqDurable(Workq):
    name = "workq durable"
    durable = True


# ------------------------------------------------------------------------ redis

class Redis(Peer):
    name = "redis everysec"
    fsync = "everysec"

    def start(self, base: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--dir", str(base), "--appendonly", "yes", "--appendfsync", self.fsync,
                                      "--save", "", "--protected-mode", "no"], stdout=subprocess.DEVNULL)
        wait_port(self.port)

    def _client(self) -> Any:
        import redis

        return redis.Redis(port=self.port)

    def produce(self, items: int, batch: int, size: int) -> None:
        r = self._client()
        r.xgroup_create("tasks", "g", id="0", mkstream=True)
        payloads = [os.urandom(size) for _ in range(batch)]
        for start in range(0, items, batch):
            pipe = r.pipeline(transaction=False)
            for payload in payloads[: min(batch, items - start)]:
                pipe.xadd("tasks", {"p": payload})
            pipe.execute()

    def work(self, index: int, batch: int, size: int, stop: Any) -> None:
        r = self._client()
        result = os.urandom(size)
        while True:
            reply = r.xreadgroup("g", f"w{index}", {"tasks": ">"}, count=batch, block=200)
            entries = reply[0][1] if reply else []
            if not entries:
                if stop.is_set():
                    return
                continue
            pipe = r.pipeline(transaction=False)
            for _ in entries:
                pipe.xadd("results", {"r": result})
            pipe.xack("tasks", "g", *[entry_id for entry_id, _ in entries])
            pipe.execute()

    def consume(self, items: int) -> None:
        r = self._client()
        got, last = 0, "0"
        while got < items:
            reply = r.xread({"results": last}, count=5000, block=1000)
            if reply:
                entries = reply[0][1]
                got += len(entries)
                last = entries[-1][0]


class RedisAlways(Redis):
    name = "redis always"
    fsync = "always"


# ------------------------------------------------------------------- beanstalkd

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
            self.buf += self.sock.recv(1 << 20)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def body(self, size: int) -> bytes:
        while len(self.buf) < size + 2:
            self.buf += self.sock.recv(1 << 20)
        data, self.buf = self.buf[:size], self.buf[size + 2:]
        return data

    def reserve_many(self, count: int) -> list[bytes]:
        """Pipelined reserve-with-timeout 0; ids of the jobs reserved."""
        self.send(b"reserve-with-timeout 0\r\n" * count)
        ids = []
        for _ in range(count):
            reply = self.line().split()
            if reply[0] == b"RESERVED":
                self.body(int(reply[2]))
                ids.append(reply[1])
        return ids


class Beanstalkd(Peer):
    name = "beanstalkd -f 5"

    def start(self, base: Path) -> None:
        self.port = free_port()
        (base / "binlog").mkdir()
        self.proc = subprocess.Popen(["beanstalkd", "-l", "127.0.0.1", "-p", str(self.port), "-b",
                                      str(base / "binlog"), "-f", "5", "-z", "65535"])
        wait_port(self.port)

    def produce(self, items: int, batch: int, size: int) -> None:
        client = _Beanstalk(self.port)
        client.send(b"use tasks\r\n")
        client.line()
        payload = os.urandom(size)
        put = b"put 0 0 600 %d\r\n%s\r\n" % (size, payload)
        for start in range(0, items, batch):
            count = min(batch, items - start)
            client.send(put * count)
            for _ in range(count):
                client.line()

    def work(self, index: int, batch: int, size: int, stop: Any) -> None:
        client = _Beanstalk(self.port)
        client.send(b"watch tasks\r\nignore default\r\nuse results\r\n")
        for _ in range(3):
            client.line()
        result = os.urandom(size)
        put = b"put 0 0 600 %d\r\n%s\r\n" % (size, result)
        while True:
            ids = client.reserve_many(batch)
            if not ids:
                if stop.is_set():
                    return
                time.sleep(0.01)
                continue
            client.send(b"".join(put + b"delete " + job_id + b"\r\n" for job_id in ids))
            for _ in range(2 * len(ids)):
                client.line()

    def consume(self, items: int) -> None:
        client = _Beanstalk(self.port)
        client.send(b"watch results\r\nignore default\r\n")
        client.line()
        client.line()
        got = 0
        while got < items:
            ids = client.reserve_many(min(1000, items - got))
            if not ids:
                time.sleep(0.01)
                continue
            client.send(b"".join(b"delete " + job_id + b"\r\n" for job_id in ids))
            for _ in ids:
                client.line()
            got += len(ids)


# ------------------------------------------------------------------------- nats

class Nats(Peer):
    name = "nats jetstream"

    def start(self, base: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(["nats-server", "-js", "-sd", str(base), "-a", "127.0.0.1", "-p",
                                      str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)
        asyncio.run(self._streams())

    async def _connect(self) -> Any:
        import nats

        return await nats.connect(f"nats://127.0.0.1:{self.port}", pending_size=256 * 1024 * 1024)

    async def _streams(self) -> None:
        from nats.js.api import RetentionPolicy, StorageType

        nc = await self._connect()
        js = nc.jetstream()
        await js.add_stream(name="TASKS", subjects=["tasks"], retention=RetentionPolicy.WORK_QUEUE,
                            storage=StorageType.FILE)
        await js.add_stream(name="RESULTS", subjects=["results"], storage=StorageType.FILE)
        await nc.close()

    def produce(self, items: int, batch: int, size: int) -> None:
        asyncio.run(self._produce(items, batch, size))

    async def _produce(self, items: int, batch: int, size: int) -> None:
        nc = await self._connect()
        js = nc.jetstream()
        payload = os.urandom(size)
        for start in range(0, items, batch):
            await asyncio.gather(*(js.publish("tasks", payload) for _ in range(min(batch, items - start))))
        await nc.close()

    def work(self, index: int, batch: int, size: int, stop: Any) -> None:
        asyncio.run(self._work(batch, size, stop))

    async def _work(self, batch: int, size: int, stop: Any) -> None:
        import nats.errors

        nc = await self._connect()
        js = nc.jetstream()
        sub = await js.pull_subscribe("tasks", "workers", stream="TASKS", config=_consumer_config())
        result = os.urandom(size)
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=0.2)
            except (TimeoutError, nats.errors.TimeoutError):
                msgs = []
            if not msgs:
                if stop.is_set():
                    break
                continue
            await asyncio.gather(*(js.publish("results", result) for _ in msgs))
            await asyncio.gather(*(m.ack() for m in msgs))
        await nc.close()

    def consume(self, items: int) -> None:
        asyncio.run(self._consume(items))

    async def _consume(self, items: int) -> None:
        import nats.errors

        nc = await self._connect()
        js = nc.jetstream()
        sub = await js.pull_subscribe("results", "consumer", stream="RESULTS", config=_consumer_config())
        got = 0
        while got < items:
            try:
                msgs = await sub.fetch(min(5000, items - got), timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            await asyncio.gather(*(m.ack() for m in msgs))
            got += len(msgs)
        await nc.close()


def _consumer_config() -> Any:
    """Room for 2 workers x 1000 (and the consumer's 5000) unacked messages:
    the default MaxAckPending of 1000 would stall batched fetches."""
    from nats.js.api import ConsumerConfig

    return ConsumerConfig(max_ack_pending=20_000)


PEERS: dict[str, type[Peer]] = {
    "workq": Workq, "workq-durable": WorkqDurable, "redis": Redis, "redis-always": RedisAlways,
    "beanstalkd": Beanstalkd, "nats": Nats,
}


def _memory(process: psutil.Process, queued: int) -> dict[str, Any]:
    info = process.memory_info()
    return {"queued": queued, "rss_MB": round(info.rss / 1e6, 1), "anon_MB": round((info.rss - info.shared) / 1e6, 1)}


def backlog_rss(items: int, batch: int, size: int) -> dict[str, Any]:
    """workq's server RSS as a backlog of ``items`` builds up (sampled each 10%)."""
    import tempfile

    import workq

    base = Path(tempfile.mkdtemp(prefix="bench-rss-", dir=os.environ.get("BENCH_DIR", os.getcwd())))
    peer = Workq()
    peer.start(base)
    samples = []
    try:
        payloads = [os.urandom(size) for _ in range(batch)]
        process = psutil.Process(peer.pid)
        started = time.perf_counter()
        with workq.connect(peer.address) as client:
            for start in range(0, items, batch):
                client.enqueue("job", "m", "s", 1, payloads)
                if (start // batch) % max(1, items // batch // 10) == 0:
                    samples.append(_memory(process, start + batch))
            samples.append(_memory(process, items))
            status = client.job_status("job")
        elapsed = time.perf_counter() - started
        disk = sum(f.stat().st_size for f in base.rglob("*") if f.is_file())
        peer.stop()
        restarted = time.perf_counter()
        peer.start(base)  # recovers the whole backlog before it listens
        restart_s = time.perf_counter() - restarted
        return {"items": items, "enqueue_per_s": round(items / elapsed), "disk_GB": round(disk / 1e9, 2),
                "pending": status["pending"], "restart_to_ready_s": round(restart_s, 2),
                "rss_after_restart": _memory(psutil.Process(peer.pid), items), "rss": samples}
    finally:
        peer.stop()
        import shutil

        shutil.rmtree(base, ignore_errors=True)
