"""What a one-item call leaves for the cyclic garbage collector: nothing.

Refcounting frees an object the moment its last reference goes; only
objects in a reference cycle wait for a collection, and a collection walks
every young object, so one cycle per call costs each call far more than the
cycle's own objects (issue 24: 36 objects per durable completion, 5 % of a
work item's instructions in collections). Closures in the compiled build
made such cycles (tests/test_build_closures.py says how); this test counts
what one-item calls leave behind, embedded and through an in-process
server with its clients, in either build.
"""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardmgr.server.config import ServerConfig
from shardmgr.server.server import Server
from workq import Broker, QueueClient, Worker

ITEMS = 200


def _cycles_left_by(work: Callable[[], None]) -> Counter[str]:
    """The types of what the collector finds after ``work`` (collected before it)."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        work()
        gc.collect()
        return Counter(type(obj).__qualname__ for obj in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _work(enqueue: Callable[..., object], lease: Callable[[], list[Any]], complete: Callable[..., object],
          results: Callable[[], object]) -> None:
    for i in range(ITEMS):
        enqueue("job", "m", "s", 1, [b"task"], durable=i % 2 == 0)
        [item] = lease()
        complete([item.handle], [b"result"], durable=i % 3 == 0)
        if i % 10 == 9:
            results()


def test_one_item_calls_embedded_leave_no_cycles(open_broker: Callable[..., Broker]) -> None:
    broker = open_broker()
    broker.enqueue("job", "m", "s", 1, [b"warm-up"])  # the job and its files made before counting
    broker.complete([broker.lease(1)[0].handle], [b"r"])
    found = _cycles_left_by(lambda: _work(broker.enqueue, lambda: broker.lease(1), broker.complete,
                                          lambda: broker.results("job", 100)))
    status = broker.job_status("job")
    assert (status["enqueued"], status["pending"]) == (ITEMS + 1, 0)
    assert sum(found.values()) < ITEMS / 10, found.most_common(10)


def test_one_item_calls_through_a_server_leave_no_cycles(tmp_path: Path) -> None:
    server = Server(ServerConfig(data_dir=tmp_path / "data", port=0))
    server.start()
    try:
        with QueueClient(server.address) as queue, Worker(server.address, "w", models=["m"]) as worker:
            queue.enqueue("job", "m", "s", 1, [b"warm-up"])  # connections and the job made before counting
            worker.complete([worker.lease(1)[0].handle], [b"r"])
            found = _cycles_left_by(lambda: _work(queue.enqueue, lambda: worker.lease(1), worker.complete,
                                                  lambda: queue.results("job", 100)))
            status = queue.job_status("job")
            assert (status["enqueued"], status["pending"]) == (ITEMS + 1, 0)
    finally:
        server.stop()
    assert sum(found.values()) < ITEMS / 10, found.most_common(10)
