"""NATS JetStream as a peer of tools/bench_workq.py, through nats-py.

``nats-server -js``: file storage with the server's default sync (fsync every
2 minutes; a publish is acknowledged once stored, not once synced). Tasks go
to a stream with work-queue retention (an acked message is removed), results
to a plain stream. With B > 1 a producer awaits B concurrent ``publish`` calls
per round and a worker ``fetch``es B messages, publishes B results and acks B
messages concurrently; with B = 1 each ``publish`` is awaited before the next,
and a worker does ``fetch(1)``, awaits the result's ``publish``, then acks.
Consumers are created with MaxAckPending 20,000: the default 1000 stalls
batched fetches.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import nats
import nats.errors
from nats.js.api import ConsumerConfig, RetentionPolicy, StorageType
from peer import JOB, Begin, Peer, free_port, wait_port

RESULTS = "results"


def _consumer_config() -> Any:
    return ConsumerConfig(max_ack_pending=20_000)


class Nats(Peer):
    name = "nats jetstream"

    def start(self, base: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(["nats-server", "-js", "-sd", str(base), "-a", "127.0.0.1", "-p",
                                      str(self.port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)
        asyncio.run(self._streams())

    async def _connect(self) -> Any:
        return await nats.connect(f"nats://127.0.0.1:{self.port}", pending_size=256 * 1024 * 1024)

    async def _streams(self) -> None:
        nc = await self._connect()
        js = nc.jetstream()
        await js.add_stream(name="TASKS", subjects=[JOB], retention=RetentionPolicy.WORK_QUEUE,
                            storage=StorageType.FILE)
        await js.add_stream(name="RESULTS", subjects=[RESULTS], storage=StorageType.FILE)
        await nc.close()

    def produce(self, items: int, batch: int, size: int, begin: Begin) -> None:
        asyncio.run(self._produce(items, batch, size, begin))

    async def _produce(self, items: int, batch: int, size: int, begin: Begin) -> None:
        nc = await self._connect()
        js = nc.jetstream()
        payload = os.urandom(size)
        begin()
        if batch == 1:
            for _ in range(items):
                await js.publish(JOB, payload)
        else:
            for start in range(0, items, batch):
                await asyncio.gather(*(js.publish(JOB, payload) for _ in range(min(batch, items - start))))
        await nc.close()

    def work(self, index: int, batch: int, size: int, begin: Begin, stop: Any) -> None:
        asyncio.run(self._work(batch, size, begin, stop))

    async def _work(self, batch: int, size: int, begin: Begin, stop: Any) -> None:
        nc = await self._connect()
        js = nc.jetstream()
        sub = await js.pull_subscribe(JOB, "workers", stream="TASKS", config=_consumer_config())
        result = os.urandom(size)
        begin()
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=0.2)
            except (TimeoutError, nats.errors.TimeoutError):
                msgs = []
            if not msgs:
                if stop.is_set():
                    break
            elif batch == 1:
                await js.publish(RESULTS, result)
                await msgs[0].ack()
            else:
                await asyncio.gather(*(js.publish(RESULTS, result) for _ in msgs))
                await asyncio.gather(*(m.ack() for m in msgs))
        await nc.close()

    def consume(self, items: int, begin: Begin) -> None:
        asyncio.run(self._consume(items, begin))

    async def _consume(self, items: int, begin: Begin) -> None:
        nc = await self._connect()
        js = nc.jetstream()
        sub = await js.pull_subscribe(RESULTS, "consumer", stream="RESULTS", config=_consumer_config())
        begin()
        got = 0
        while got < items:
            try:
                msgs = await sub.fetch(min(5000, items - got), timeout=1.0)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            await asyncio.gather(*(m.ack() for m in msgs))
            got += len(msgs)
        await nc.close()

    def produce_single(self, seconds: float, size: int, begin: Begin) -> int:
        return asyncio.run(self._produce_single(seconds, size, begin))

    async def _produce_single(self, seconds: float, size: int, begin: Begin) -> int:
        nc = await self._connect()
        js = nc.jetstream()
        payload = os.urandom(size)
        count = 0
        begin()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await js.publish(JOB, payload)
            count += 1
        await nc.close()
        return count

    def leftover(self) -> int | None:
        return asyncio.run(self._leftover())

    async def _leftover(self) -> int:
        nc = await self._connect()
        info = await nc.jetstream().stream_info("TASKS")
        await nc.close()
        return int(info.state.messages)
