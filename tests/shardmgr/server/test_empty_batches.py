"""Empty batches, the same calls embedded and through a real server.

The rule (docs/shardmgr.md, docs/workq.md): every batch command accepts an
empty batch and answers an empty result at once, writing nothing; the other
checks (collection, dimension, k, lengths) still apply. ``get(name, [])``
used to answer ``internal`` over the wire and an empty append ``bad_vectors``;
a lease or results call asking for 0 items waited its whole ``wait``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

import shardmgr
import workq
from shardmgr.errors import BadVectors, UnknownCollection
from workq import Worker
from workq.calls import MAX_WAIT_S

from .serverproc import ServerProcess

T = TypeVar("T")
DIM = 4


@dataclasses.dataclass
class Apis:
    """The store, the queue (producer/consumer) and the worker side, embedded or over the wire."""

    store: Any
    queue: Any
    worker: Any


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("server") / "data").start()
    yield proc
    proc.kill()


@pytest.fixture(params=["embedded", "server"])
def apis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Apis]:
    if request.param == "embedded":
        store = shardmgr.open(tmp_path / "store")
        broker = workq.open(tmp_path / "queue", disk_floor_bytes=0, reconnect_window_s=0.0)
        yield Apis(store, broker, broker)
        broker.close()
        store.close()
        return
    address = request.getfixturevalue("server").address
    with shardmgr.connect(address, timeout=30) as store, workq.connect(address, timeout=30) as queue, \
            Worker(address, f"w-{uuid.uuid4().hex}", timeout=30) as worker:
        yield Apis(store, queue, worker)


def promptly(call: Callable[[], T]) -> T:
    """``call()``'s answer, failing the test if it takes more than 20 s (a wait it should not have)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(call).result(timeout=20)
    except concurrent.futures.TimeoutError:
        pytest.fail("an empty request waited instead of answering at once")
    finally:
        pool.shutdown(wait=False)  # a call that hangs is ended by the fixture's close


@pytest.mark.parametrize("empty", [[], np.zeros((0, DIM), np.float32), np.zeros((0, DIM), np.float64),
                                   np.zeros(0, np.float32)], ids=["list", "f4", "f8", "flat"])
def test_empty_vector_batches_answer_empty_results_and_write_nothing(apis: Apis, empty: Any) -> None:
    store, name = apis.store, f"c-{uuid.uuid4().hex[:8]}"
    store.create_collection(name, DIM)
    refs = store.append(name, np.ones((2, DIM), np.float32), [1, 2], durable=True)
    before = store.collection_info(name)
    for durable in (False, True):
        got = store.append(name, empty, [], durable=durable)
        assert got.shape == (0,) and got.dtype == np.int64
        got = store.append(name, empty, np.zeros(0, np.int64), durable=durable)
        assert got.shape == (0,)
    for no_refs in ([], np.zeros(0, np.int64), np.zeros(0, np.uint64)):
        vectors, ids = store.get(name, no_refs), store.ids(name, no_refs)
        assert (vectors.shape, vectors.dtype, ids.shape, ids.dtype) == ((0, DIM), np.float32, (0,), np.int64)
    scores, ids, found = store.search(name, empty, k=3)
    assert [a.shape for a in (scores, ids, found)] == [(0, 3)] * 3
    assert (scores.dtype, ids.dtype, found.dtype) == (np.float32, np.int64, np.int64)
    assert store.collection_info(name) == before  # no rows, no shard, nothing
    np.testing.assert_array_equal(store.ids(name, refs), [1, 2])


def test_empty_batches_keep_every_other_check(apis: Apis) -> None:
    store, name = apis.store, f"c-{uuid.uuid4().hex[:8]}"
    store.create_collection(name, DIM)
    with pytest.raises(BadVectors, match=r"shape \[n, 4\]"):
        store.append(name, np.zeros((0, DIM + 1), np.float32), [])
    with pytest.raises(BadVectors, match=r"ids must have shape \[0\]"):
        store.append(name, np.zeros((0, DIM), np.float32), [7])
    with pytest.raises(BadVectors, match="k must be"):
        store.search(name, np.zeros((0, DIM), np.float32), k=0)
    with pytest.raises(BadVectors, match="1-D integer"):
        store.get(name, np.zeros((0, 2), np.int64))
    with pytest.raises(UnknownCollection):
        store.append("missing", [], [])
    with pytest.raises(UnknownCollection):
        store.get("missing", [])
    assert store.collection_info(name)["rows"] == 0


def test_empty_queue_calls_answer_at_once_and_change_nothing(apis: Apis) -> None:
    queue, worker, job = apis.queue, apis.worker, f"j-{uuid.uuid4().hex[:8]}"
    assert queue.enqueue(job, "m", "s", 1, []) == []
    assert queue.job_status(job)["enqueued"] == 0  # an empty enqueue does not create the job
    [handle] = queue.enqueue(job, "m", "s", 1, [b"x"])
    before = queue.job_status(job)
    assert promptly(lambda: worker.lease(0, wait=MAX_WAIT_S)) == []
    assert promptly(lambda: queue.results(job, max_items=0, wait=MAX_WAIT_S)) == []
    assert worker.complete([], []) == []
    assert worker.release([]) is None and worker.touch([]) is None
    assert queue.job_status(job) == before
    [item] = worker.lease(1)
    assert item.handle == handle
    assert worker.complete([item.handle], [b"r"]) == ["completed"]
