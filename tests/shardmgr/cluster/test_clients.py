"""Several clients on a 3-node cluster with two writers, and the writer of
one collection SIGKILLed in the middle of its appends (issue 14's first two
test bullets, on real ``shardmgr serve`` processes):

- n1 writes "a" (its appends sent to n3, which forwards them), n2 writes
  "b" (sent to n2 itself), while a third client searches both through n3;
- n1 is SIGKILLed mid-append: the appends of "a" are answered with a
  retryable error until the role moves (to n3, after the lease's TTL), and
  then resume; every append that was acknowledged is there at the end,
  through every node, by search and by get;
- "b", whose writer never died, searched through n3 equals n2's data
  directory opened as one store.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import numpy as np

from common.wire.errors import ServiceError, Unavailable
from shardmgr.cluster.config import ClusterConfig
from shardmgr.store.client import StoreClient
from shardmgr.store.store import Store
from tests.shardmgr.cluster.nodes import DIM, batches, node, search, start_all, wait_for
from tests.shardmgr.server.serverproc import ServerProcess

Acked = list[tuple[np.ndarray, np.ndarray, np.ndarray]]  # (vectors, ids, refs) of each acknowledged append


def appending(address: str, name: str, seed: int, count: int, acked: Acked, before: dict[int, object]) -> None:
    """Append ``count`` batches durably, retrying what is retryable (at most 30 s a batch)."""
    with StoreClient(address, retry_for=5.0) as client:
        for i, (vectors, ids) in enumerate(batches(count, seed=seed)):
            if i in before:
                before[i]()  # type: ignore[operator]
            deadline = time.monotonic() + 30
            while True:
                try:
                    acked.append((vectors, ids, client.append(name, vectors, ids, durable=True)))
                    break
                except ServiceError as e:  # unavailable: the writer is gone or its role is moving
                    if not (isinstance(e, Unavailable) or e.code == "shardmgr.cluster.writer_elsewhere") \
                            or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)


def finds_itself(address: str, name: str, vectors: np.ndarray, ids: np.ndarray) -> bool:
    """A complete search through ``address`` finds each row's own id first."""
    found = search(address, vectors, collection=name, k=1)
    return not found.partial and bool((found.ids[:, 0] == ids).all())


def test_two_writers_several_clients_and_a_writer_killed_mid_append_lose_nothing(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    n1, n2, n3 = nodes = [node(tmp_path, f"n{i}", cluster_config) for i in (1, 2, 3)]
    start_all(started, nodes)
    with StoreClient(n1.address) as one, StoreClient(n2.address) as two:
        one.create_collection("a", dim=DIM)  # the creating node campaigns: n1 writes "a", n2 writes "b"
        two.create_collection("b", dim=DIM)
    acked: dict[str, Acked] = {"a": [], "b": []}
    searched: list[int] = []
    done, failures = threading.Event(), []

    def searching() -> None:
        queries = np.random.default_rng(9).random((10, DIM), dtype=np.float32)
        with StoreClient(n3.address) as client:
            while not done.is_set():
                for name in ("a", "b"):
                    client.search(name, queries, k=5)  # partial while n1 is down: allowed, named
                    searched.append(1)

    def run(target: object, *args: object) -> threading.Thread:
        def guarded() -> None:
            try:
                target(*args)  # type: ignore[operator]
            except BaseException as e:  # the test thread reports it
                failures.append(e)
        thread = threading.Thread(target=guarded)
        thread.start()
        return thread

    writers = [run(appending, n3.address, "a", 1, 10, acked["a"], {4: n1.kill}),
               run(appending, n2.address, "b", 2, 8, acked["b"], {})]
    reader = run(searching)
    for thread in writers:
        thread.join(120)
    done.set()
    reader.join(30)
    assert not failures, failures
    assert len(acked["a"]) == 10 and len(acked["b"]) == 8 and len(searched) > 10

    n1.restart()  # its durable rows of "a" were on its disk only; they come back (published, or held)
    for name in ("a", "b"):
        vectors = np.concatenate([v for v, _, _ in acked[name]])
        ids = np.concatenate([i for _, i, _ in acked[name]])
        refs = np.concatenate([r for _, _, r in acked[name]])
        for proc in (n1, n2, n3):
            wait_for(f"every acknowledged row of {name} through {proc.data_dir.name}",
                     lambda p=proc, n=name, v=vectors, i=ids: finds_itself(p.address, n, v, i), timeout=30)
            with StoreClient(proc.address) as client:
                np.testing.assert_array_equal(client.get(name, refs), vectors)

    queries = np.random.default_rng(10).random((20, DIM), dtype=np.float32)
    through_n3 = search(n3.address, queries, collection="b")
    n2.signal(signal.SIGTERM)
    assert n2.wait() == 0
    with Store(n2.data_dir).open() as reference:
        want = reference.search("b", queries, k=7)
    for got, expected in zip(through_n3, want, strict=True):
        np.testing.assert_array_equal(got, expected)
