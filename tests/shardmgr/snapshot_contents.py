"""What a data directory holds, for the snapshot crash tests: fill one, check one.

``fill(data)`` writes, through the embedded APIs, a store with sealed shards
(hard-linked by a snapshot), a growing shard big enough to be copied in
several pieces, deletes in both, and a queue with pending items, results
waiting for delivery and results delivered; it closes cleanly and returns
the :class:`Contents`. ``check(data, contents)`` opens the directory and
proves it holds exactly that: every live row's vector and id, every deleted
row deleted, the job's counts, the pending payloads (leased, so the check
changes the queue) and the undelivered results.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import shardmgr
import workq
from shardmgr.errors import RowDeleted
from shardmgr.store.client import StoreClient
from shardmgr.store.store import Store
from workq.broker import Broker
from workq.client import QueueClient
from workq.protocol import Handle, Item

DIM = 16
SEAL_BYTES = 1024 * DIM * 4  # 1,024 rows a shard
JOB = "job"
QUIET = {"rewrite_live_fraction": 0.0, "merge_below_fraction": 0.0}  # no rewrite changes what a check reads


@dataclasses.dataclass
class Contents:
    """The rows and the queue state a data directory must hold."""

    vectors: dict[int, np.ndarray] = dataclasses.field(default_factory=dict)  # live ref -> vector
    ids: dict[int, int] = dataclasses.field(default_factory=dict)  # live ref -> id
    deleted: list[int] = dataclasses.field(default_factory=list)
    pending: list[bytes] = dataclasses.field(default_factory=list)  # payloads enqueued, not completed
    results: list[bytes] = dataclasses.field(default_factory=list)  # completed, not delivered
    status: dict[str, int] = dataclasses.field(default_factory=dict)

    def appended(self, refs: np.ndarray, vectors: np.ndarray, ids: np.ndarray) -> None:
        for ref, vector, id_ in zip(refs.tolist(), vectors, ids.tolist()):
            self.vectors[ref], self.ids[ref] = vector, id_

    def delete(self, refs: list[int]) -> None:
        for ref in refs:
            del self.vectors[ref], self.ids[ref]
        self.deleted += refs


def batch(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic vectors and ids of one appended batch."""
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32), np.arange(n) + 10_000 * seed


def fill(data: Path) -> Contents:
    """Fill ``data`` (embedded, closed cleanly); returns what it holds."""
    contents = Contents()
    with shardmgr.open(data, seal_bytes=SEAL_BYTES, **QUIET) as store:
        fill_store(store, contents)
    with workq.open(data, segment_bytes=64 << 10, reconnect_window_s=0.0, disk_floor_bytes=0) as broker:
        fill_queue(broker, lambda n: broker.lease(n, worker="w"), broker.complete, contents)
    return contents


def fill_store(store: Store | StoreClient, contents: Contents) -> None:
    """2,700 rows in batches of 900 (with 1,024-row shards: two sealed shards
    and a growing one), 73 of them deleted, in every shard."""
    store.create_collection("c", DIM)
    for seed in range(1, 4):
        vectors, ids = batch(seed, 900)
        contents.appended(store.append("c", vectors, ids, durable=True), vectors, ids)
    victims = sorted(contents.vectors)[5::37]
    store.delete("c", victims, durable=True)
    contents.delete(victims)


def fill_queue(queue: Broker | QueueClient, lease: Callable[[int], list[Item]],
               complete: Callable[[list[Handle], list[bytes]], object], contents: Contents) -> None:
    """300 items; 120 leased and completed (durably); 45 of their results delivered."""
    payloads = [b"task %03d" % i * 20 for i in range(300)]
    for start in range(0, 300, 50):
        queue.enqueue(JOB, "m", "s", 0, payloads[start:start + 50], durable=True)
    leased = lease(120)
    assert len(leased) == 120
    complete([i.handle for i in leased], [b"result of " + i.payload[:8] for i in leased])
    done = {i.payload for i in leased}
    delivered = {r.payload for r in queue.results(JOB, max_items=45)}
    assert len(delivered) == 45
    contents.pending = [p for p in payloads if p not in done]
    contents.results = [b"result of " + p[:8] for p in done if b"result of " + p[:8] not in delivered]
    for _ in range(500):  # over the wire, a delivery is marked once its response is sent
        contents.status = queue.job_status(JOB)
        if contents.status["delivered"] == 45:
            break
        time.sleep(0.01)
    assert contents.status == {"enqueued": 300, "pending": 180, "in_flight": 0, "completed": 120,
                               "delivered": 45, "buried": 0}


def check(data: Path, contents: Contents) -> None:
    """``data`` holds exactly ``contents`` (the queue's pending items are leased meanwhile)."""
    with shardmgr.open(data, seal_bytes=SEAL_BYTES, **QUIET) as store:
        check_rows(store, contents)
    with workq.open(data, reconnect_window_s=0.0) as broker:
        assert broker.job_status(JOB) == contents.status
        assert sorted(i.payload for i in broker.lease(1000, worker="w")) == sorted(contents.pending)
        assert sorted(r.payload for r in broker.results(JOB, max_items=1000)) == sorted(contents.results)


def check_rows(store: Store | StoreClient, contents: Contents) -> None:
    """The store (embedded or a client) serves exactly the rows of ``contents``."""
    refs = np.array(sorted(contents.vectors), dtype=np.int64)
    np.testing.assert_array_equal(store.get("c", refs), np.stack([contents.vectors[r] for r in refs.tolist()]))
    np.testing.assert_array_equal(store.ids("c", refs), [contents.ids[r] for r in refs.tolist()])
    info = store.collection_info("c")
    assert (info["rows"], info["deleted"], info["quarantined"]) == (len(refs), len(contents.deleted), [])
    for ref in contents.deleted[::10]:
        with pytest.raises(RowDeleted):
            store.get("c", [ref])
