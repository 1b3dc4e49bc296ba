"""The embedding worker: lease a task, embed its chunks, append the vectors,
complete the task with their refs.

A task's payload is msgpack ``{"collection", "ids", "chunks", "texts"}``
(per chunk: its document's id, its number within the document, its text);
its result is msgpack ``{"ids", "chunks", "refs"}``, the same chunks in the
same order with the ref the store gave each vector.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import asdict, dataclass
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from typing import Any

import msgpack
import numpy as np
from embedtext import MODEL, embed, load_model

import workq
from shardmgr.store.client import StoreClient

SHAPE = "text-chunks"
LEASE_WAIT_S = 0.5  # how often an idle worker looks at the stop event


@dataclass
class Task:
    """The chunks of one task."""

    collection: str
    ids: list[int]
    chunks: list[int]
    texts: list[str]

    def encode(self) -> bytes:
        packed: bytes = msgpack.packb(asdict(self))
        return packed

    @staticmethod
    def decode(payload: bytes) -> Task:
        return Task(**msgpack.unpackb(payload))


def encode_result(ids: list[int], chunks: list[int], refs: np.ndarray) -> bytes:
    packed: bytes = msgpack.packb({"ids": ids, "chunks": chunks, "refs": refs.tolist()})
    return packed


def decode_result(payload: bytes) -> list[tuple[int, int, int]]:
    """(doc id, chunk number, ref) per chunk of a task's result."""
    result = msgpack.unpackb(payload)
    return list(zip(result["ids"], result["chunks"], result["refs"]))


@dataclass
class WorkerStats:
    """What one worker did, in seconds and counts, reported to the producer at exit."""

    worker: str
    tasks: int = 0
    vectors: int = 0
    load_s: float = 0.0
    embed_s: float = 0.0
    append_s: float = 0.0
    complete_s: float = 0.0  # complete_and_lease round trips (the result made durable, the next task leased)
    idle_s: float = 0.0  # lease calls made holding nothing: waiting for tasks (or for the stop)


def run_task(model: Any, store: StoreClient, task: Task, stats: WorkerStats) -> bytes:
    """Embed and append one task's chunks; its result payload."""
    started = time.perf_counter()
    vectors = embed(model, task.texts)
    embedded = time.perf_counter()
    # durable: the result names these refs, so they must survive whatever the result survives
    refs = store.append(task.collection, vectors, np.asarray(task.ids, dtype=np.int64), durable=True)
    stats.embed_s += embedded - started
    stats.append_s += time.perf_counter() - embedded
    stats.tasks += 1
    stats.vectors += len(task.texts)
    return encode_result(task.ids, task.chunks, refs)


def work(address: str, lane: str, stop: Event, report: Queue[dict[str, Any]]) -> None:
    """A worker process: serve ``lane``'s tasks of MODEL until ``stop`` is
    set while it holds none, then put its :class:`WorkerStats` on ``report``.

    Leases one task at a time, and completes it and leases the next in one
    round trip, so the tasks spread over the workers as they finish.
    """
    worker_id = f"embed-{socket.gethostname()}-{os.getpid()}"  # one id per process (workq.md)
    stats = WorkerStats(worker_id)
    started = time.perf_counter()
    model = load_model()
    stats.load_s = time.perf_counter() - started
    # the lane is the run's: a task an interrupted earlier run left behind is not this run's to do
    with StoreClient(address) as store, workq.Worker(address, worker_id, models=[MODEL], lanes=[lane]) as worker:
        items: list[workq.Item] = []
        while not (stop.is_set() and not items):
            if not items:
                called = time.perf_counter()
                items = worker.lease(1, wait=LEASE_WAIT_S)
                stats.idle_s += time.perf_counter() - called
                continue
            result = run_task(model, store, Task.decode(items[0].payload), stats)
            called = time.perf_counter()
            _, items = worker.complete_and_lease(items[0].handle, result, wait=LEASE_WAIT_S)
            stats.complete_s += time.perf_counter() - called
    report.put(asdict(stats))
