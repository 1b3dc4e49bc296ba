"""Redis streams as a peer of tools/bench_workq.py, used as the Redis docs advise.

``redis-server`` with ``appendonly yes`` and ``appendfsync everysec`` (or
``always``), no RDB snapshots. Tasks go to one stream read by a consumer
group. A worker reads with ``XREADGROUP COUNT B`` and then sends, in ONE
pipeline, an ``XADD`` to the results stream per task, one ``XACK`` and one
``XDEL`` of the tasks it read, so the task stream shrinks as work completes
(XACK alone leaves every entry in the stream). Producers with B > 1 pipeline
B ``XADD`` per round trip; with B = 1 they call ``XADD`` once per item. The
consumer reads results with ``XREAD`` from a cursor it keeps.

``redis pipelined`` (``everysec``) is the pair of ``workq pipelined``: the
producer sends PIPELINE_ITEMS ``XADD`` per round trip whatever B is (Redis's
documentation on pipelining: send many commands, then read the replies), and
a worker's pipeline ends with the next ``XREADGROUP``, so each cycle is one
round trip, as workq's asynchronous completions and ``complete_and_lease`` are.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import redis
from peer import JOB, SYNCED, Begin, Peer, free_port, wait_port

RESULTS = "results"
GROUP = "g"
#: XADDs per round trip of the pipelined producer (workq's pipelined client keeps up to 1,000 calls in flight)
PIPELINE_ITEMS = 1000


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
        return redis.Redis(port=self.port)

    def produce(self, items: int, batch: int, size: int, begin: Begin) -> None:
        r = self._client()
        r.xgroup_create(JOB, GROUP, id="0", mkstream=True)
        payloads = [os.urandom(size) for _ in range(batch)]
        begin()
        if batch == 1:
            for _ in range(items):
                r.xadd(JOB, {"p": payloads[0]})
            return
        for start in range(0, items, batch):
            pipe = r.pipeline(transaction=False)
            for payload in payloads[: min(batch, items - start)]:
                pipe.xadd(JOB, {"p": payload})
            pipe.execute()

    def work(self, index: int, batch: int, size: int, begin: Begin, stop: Any) -> None:
        r = self._client()
        r.ping()  # connect before the clock starts
        result = os.urandom(size)
        begin()
        while True:
            reply = r.xreadgroup(GROUP, f"w{index}", {JOB: ">"}, count=batch, block=200)
            entries = reply[0][1] if reply else []
            if not entries:
                if stop.is_set():
                    return
                continue
            ids = [entry_id for entry_id, _ in entries]
            pipe = r.pipeline(transaction=False)
            for _ in entries:
                pipe.xadd(RESULTS, {"r": result})
            pipe.xack(JOB, GROUP, *ids)
            pipe.xdel(JOB, *ids)
            pipe.execute()

    def consume(self, items: int, begin: Begin) -> None:
        r = self._client()
        r.ping()
        begin()
        got, last = 0, "0"
        while got < items:
            reply = r.xread({RESULTS: last}, count=5000, block=1000)
            if reply:
                entries = reply[0][1]
                got += len(entries)
                last = entries[-1][0]

    def produce_single(self, seconds: float, size: int, begin: Begin) -> int:
        r = self._client()
        r.ping()
        payload = os.urandom(size)
        count = 0
        begin()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            r.xadd(JOB, {"p": payload})
            count += 1
        return count

    def leftover(self) -> int | None:
        return int(self._client().xlen(JOB))


class RedisAlways(Redis):
    name = "redis always"
    fsync = "always"
    durability = SYNCED


class RedisPipelined(Redis):
    name = "redis pipelined"
    pipelined = True
    worker_trips = 1

    def produce(self, items: int, batch: int, size: int, begin: Begin) -> None:
        r = self._client()
        r.xgroup_create(JOB, GROUP, id="0", mkstream=True)
        payload = os.urandom(size)
        per_trip = max(batch, PIPELINE_ITEMS)
        begin()
        for start in range(0, items, per_trip):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(per_trip, items - start)):
                pipe.xadd(JOB, {"p": payload})
            pipe.execute()

    def work(self, index: int, batch: int, size: int, begin: Begin, stop: Any) -> None:
        r = self._client()
        r.ping()
        result = os.urandom(size)
        begin()
        ids: list[bytes] = []
        while True:  # each round trip: the last cycle's results, ack and delete, then the next read
            pipe = r.pipeline(transaction=False)
            if ids:
                for _ in ids:
                    pipe.xadd(RESULTS, {"r": result})
                pipe.xack(JOB, GROUP, *ids)
                pipe.xdel(JOB, *ids)
            pipe.xreadgroup(GROUP, f"w{index}", {JOB: ">"}, count=batch, block=200)
            reply = pipe.execute()[-1]
            ids = [entry_id for entry_id, _ in reply[0][1]] if reply else []
            if not ids and stop.is_set():
                return
