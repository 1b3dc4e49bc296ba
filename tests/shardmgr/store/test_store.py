"""The embedded vector store: collections, appends, refs, search, bad input."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardmgr
from common.journal import FlusherConfig
from shardmgr.errors import BadName, BadVectors, CollectionConflict, UnknownCollection, UnknownRef
from shardmgr.server.config import ServerConfig
from shardmgr.store.config import StoreConfig
from shardmgr.store.store import Store


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[Callable[..., Store]]:
    opened: list[Store] = []

    def make(**config: Any) -> Store:
        store = shardmgr.open(tmp_path / "data", **config)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "LOCK"}


def brute_force(data: np.ndarray, queries: np.ndarray, k: int, metric: str) -> np.ndarray:
    if metric == "l2":
        scores = ((queries[:, None, :] - data[None, :, :]) ** 2).sum(-1)
        return np.sort(scores, axis=1)[:, :k]
    scores = queries @ data.T
    return -np.sort(-scores, axis=1)[:, :k]


def test_collections_are_idempotent_and_checked(open_store: Callable[..., Store]) -> None:
    store = open_store()
    info = store.create_collection("docs", 8, "ip")
    assert (info["dim"], info["metric"], info["rows"]) == (8, "ip", 0)
    assert store.create_collection("docs", 8, "ip")["name"] == "docs"
    with pytest.raises(CollectionConflict, match="dim 8, metric ip"):
        store.create_collection("docs", 16, "ip")
    for bad in ("", "../x", "a/b", "x" * 129, ".hidden", 7, "abc\n", "abc\r", "a\tb", "a\x00b", "caf\u00e9", "a b"):
        with pytest.raises(BadName, match="collection name") as raised:
            store.create_collection(bad, 8)  # type: ignore[arg-type]
        assert raised.value.code == "shardmgr.bad_name" and not isinstance(raised.value, BadVectors)
    assert store.create_collection("x" * 128, 8)["name"] == "x" * 128  # the longest name
    assert sorted(p.name for p in (store.root).iterdir()) == ["docs", "x" * 128]  # no directory for a refused one
    with pytest.raises(BadVectors, match="metric"):
        store.create_collection("other", 8, "cosine")
    with pytest.raises(UnknownCollection):
        store.collection_info("nope")
    assert store.collections() == ["docs", "x" * 128]


@pytest.mark.parametrize("metric", ["l2", "ip"])
def test_search_equals_brute_force_across_growing_and_sealed_shards(open_store: Callable[..., Store],
                                                                     metric: str) -> None:
    store = open_store(seal_bytes=64 * 1024)  # 1024 rows of 16 floats per shard
    store.create_collection("c", 16, metric)
    rng = np.random.default_rng(3)
    data = rng.standard_normal((5000, 16)).astype(np.float32)
    refs = np.concatenate([store.append("c", data[i:i + 700], np.arange(i, min(i + 700, 5000)) * 10)
                           for i in range(0, 5000, 700)])
    info = store.collection_info("c")
    assert info["sealed"] >= 3 and info["growing"] == 1 and info["rows"] == 5000
    queries = rng.standard_normal((50, 16)).astype(np.float32)
    scores, ids, found = store.search("c", queries, k=7)
    np.testing.assert_allclose(scores, brute_force(data, queries, 7, metric), rtol=1e-4, atol=1e-4)
    position = {int(r): i for i, r in enumerate(refs)}
    rows = np.vectorize(position.__getitem__)(found)
    assert (ids == rows * 10).all()  # each hit's id is the id stored with its ref
    np.testing.assert_allclose(store.get("c", found[0]), data[rows[0]])
    few = store.search("c", queries[:2], k=5000 + 3)[2]
    assert (few[:, -3:] == -1).all() and (few[:, :5000] >= 0).all()  # padded past the rows there are


def test_refs_are_stable_across_restarts(open_store: Callable[..., Store], tmp_path: Path) -> None:
    store = open_store()
    store.create_collection("c", 4)
    first = np.arange(40, dtype=np.float32).reshape(10, 4)
    refs = store.append("c", first, np.arange(10), durable=True)
    store.close()
    store = open_store()
    more = store.append("c", first + 100, np.arange(10, 20))
    assert not set(refs.tolist()) & set(more.tolist())  # new rows, new refs
    np.testing.assert_array_equal(store.get("c", refs), first)
    np.testing.assert_array_equal(store.ids("c", more), np.arange(10, 20))
    assert store.collection_info("c")["shards"] == 1  # closed cleanly: the same shard kept growing
    store.abandon()  # a crash now: the next open seals it, and new rows go to a new shard
    store = open_store()
    np.testing.assert_array_equal(store.get("c", refs), first)
    later = store.append("c", first, np.arange(20, 30))
    assert (later >> 40 == 2).all() and store.collection_info("c")["shards"] == 2


def test_bad_input_is_refused_and_changes_nothing(open_store: Callable[..., Store], tmp_path: Path) -> None:
    store = open_store()
    store.create_collection("c", 4)
    refs = store.append("c", np.ones((3, 4), np.float32), [1, 2, 3], durable=True)
    before = digest(tmp_path / "data")
    good = np.ones((2, 4), np.float32)
    cases = [
        (lambda: store.append("c", np.ones((2, 5), np.float32), [1, 2]), "shape \\[n, 4\\]"),
        (lambda: store.append("c", np.array([[1, 2, np.nan, 4]], np.float32), [1]), "row 0 has NaN"),
        (lambda: store.append("c", np.array([[1, np.inf, 3, 4]]), [1]), "NaN or infinite"),
        (lambda: store.append("c", np.vstack([np.ones((7, 4)), [[0, 0, -np.inf, 0]], np.ones((3, 4))]).astype(
            np.float32), np.arange(11)), "row 7 has NaN or infinite"),
        (lambda: store.append("c", np.array([[1e39, 0, 0, 0]]), [1]), "NaN or infinite"),  # overflows float32
        (lambda: store.append("c", np.ones((2, 4), np.int64), [1, 2]), "floating point"),
        (lambda: store.append("c", good, [1, 2, 3]), "shape \\[2\\]"),
        (lambda: store.append("c", good, [1.5, 2.5]), "integers"),
        (lambda: store.append("c", np.zeros((0, 5), np.float32), []), "shape \\[n, 4\\]"),  # empty, wrong dim
        (lambda: store.append("c", np.zeros((0, 4), np.float32), [1]), "shape \\[0\\]"),
        (lambda: store.search("c", good, k=0), "k must be"),
        (lambda: store.search("c", good, k=10**9), "k must be"),
        (lambda: store.search("c", np.ones((2, 3), np.float32), k=1), "shape"),
        (lambda: store.get("c", [refs[0], refs[-1] + 1]), "names no stored row"),
        (lambda: store.get("c", [refs[0] + (5 << 40)]), "names no stored row"),
        (lambda: store.get("c", [-1]), "names no stored row"),
        (lambda: store.get("c", [[1, 2]]), "1-D integer"),
    ]
    for call, message in cases:
        with pytest.raises((BadVectors, UnknownRef), match=message):
            call()
    with pytest.raises(UnknownCollection):
        store.append("missing", good, [1, 2])
    assert digest(tmp_path / "data") == before
    np.testing.assert_array_equal(store.append("c", good.astype(np.float64), np.array([7, 8], np.int32))[:1] >> 40,
                                  [1])  # float64 and int32 are converted


def test_idle_shards_are_sealed(open_store: Callable[..., Store]) -> None:
    store = open_store(idle_seal_s=0.2)
    store.create_collection("c", 4)
    store.append("c", np.ones((3, 4), np.float32), [1, 2, 3])
    deadline = __import__("time").monotonic() + 10
    while store.collection_info("c")["sealed"] == 0 and __import__("time").monotonic() < deadline:
        __import__("time").sleep(0.1)
    assert store.collection_info("c")["sealed"] == 1
    assert os.path.getsize(next(p for p in (store.root / "c").rglob("vectors"))) == 4096 + 3 * 16


def test_hnsw_collections_build_persist_and_reload_an_index(open_store: Callable[..., Store],
                                                            tmp_path: Path) -> None:
    store = open_store(seal_bytes=32 * 1024)
    store.create_collection("h", 16, "l2", "hnsw")
    data = np.random.default_rng(5).standard_normal((3000, 16)).astype(np.float32)
    refs = np.concatenate([store.append("h", data[i:i + 300], np.arange(i, i + 300)) for i in range(0, 3000, 300)])
    store.wait_for_indexes(timeout=120)
    indexed = sorted((tmp_path / "data" / "shards" / "h").rglob("index.faiss"))
    assert len(indexed) == store.collection_info("h")["sealed"] >= 5
    _, _, found = store.search("h", data[:200], k=1)
    recall = (found[:, 0] == refs[:200]).mean()
    assert recall > 0.9, recall
    store.close()
    store = open_store(seal_bytes=32 * 1024)
    views = store.collection("h").views()
    assert sum(v.index is not None for v in views) == len(indexed)  # loaded, not rebuilt


def durable_within(store: Store, seconds: float) -> bool:
    """Whether a plain append becomes durable within ``seconds`` without anyone asking for it."""
    _, ticket = store.append_async("c", np.ones((1, 4), np.float32), [1])
    deadline = time.monotonic() + seconds
    while not ticket.durable and time.monotonic() < deadline:
        time.sleep(0.01)
    return ticket.durable


def test_embedded_open_takes_the_typed_configuration_of_serve(tmp_path: Path) -> None:
    config = ServerConfig(data_dir=tmp_path / "data", flush_interval_ms=3_600_000,
                          store=StoreConfig(seal_bytes=8192))
    assert config.flusher == FlusherConfig(interval=3600.0)
    with shardmgr.open(config.data_dir, config.store, flusher=config.flusher, max_k=5) as store:
        assert store.config == StoreConfig(seal_bytes=8192, max_k=5)  # fields override the config
        assert store.flusher.config.interval == 3600.0
        store.create_collection("c", 4)
        assert not durable_within(store, 0.5)  # no scheduled flush in the next hour ...
        store.flush()  # ... but an explicit one still works
    with shardmgr.open(config.data_dir, flusher=FlusherConfig(interval=0.01)) as store:
        assert durable_within(store, 10.0)


def test_an_append_makes_a_new_view_of_its_shard_only(open_store: Callable[..., Store]) -> None:
    """Readers' views of unchanged shards are reused (a view costs numpy
    work per shard per write); any change to a shard gives it a new one."""
    store = open_store(seal_bytes=4096)
    store.create_collection("c", 8)
    rows = np.random.default_rng(1).standard_normal((300, 8)).astype(np.float32)
    refs = np.concatenate([store.append("c", rows[i:i + 100], np.arange(i, i + 100)) for i in range(0, 300, 100)])
    collection = store._collections["c"]
    before = collection.views()
    extra = store.append("c", np.ones((1, 8), np.float32), [999])  # the growing shard 3 only
    after = collection.views()
    assert [a is b for a, b in zip(before, after)] == [True, True, False]
    assert store.delete("c", refs[5:6]) == 1  # a sealed shard's deletes: its view changes, the others' do not
    deleted = collection.views()
    assert [a is b for a, b in zip(after, deleted)] == [False, True, True]
    _, _, found = store.search("c", rows[5:6], k=1)
    assert found[0, 0] != refs[5] and store.collection_info("c")["deleted"] == 1
    store.append("c", np.ones((200, 8), np.float32), np.arange(200))  # seals shard 3: new views of 3 and 4
    sealed = collection.views()
    assert [a is b for a, b in zip(deleted, sealed)] == [True, True, False] and len(sealed) == 4
    assert sealed[2].sealed and sealed[2].rows == 101
    np.testing.assert_array_equal(store.ids("c", extra), [999])
