"""Per-shard indexes from faiss index_factory strings: built after sealing,
trained on the shard, persisted, tuned per query, deleted rows excluded."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import shardmgr
from shardmgr.errors import BadVectors
from shardmgr.store import index
from shardmgr.store.store import Store

DIM = 16
ROWS = 10_000  # above what IVF64 (39 per list) and PQ or SQ (39 x 256) need


def data(n: int = ROWS, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def sealed_store(path: Path, spec: str) -> tuple[Store, np.ndarray, np.ndarray]:
    """One sealed shard of ROWS rows under ``spec`` with its index built, and one growing row."""
    store = shardmgr.open(path, seal_bytes=ROWS * DIM * 4, index_train_rows=2500)  # training is the slow part
    store.create_collection("c", DIM, index=spec)
    vectors = data()
    refs = store.append("c", vectors, np.arange(ROWS))
    store.append("c", data(1, 9), [ROWS])  # the shard is full: this seals it
    store.wait_for_indexes()
    return store, vectors, refs


def recall(found: np.ndarray, exact: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(e)) / len(e) for f, e in zip(found.tolist(), exact.tolist())]))


@pytest.mark.parametrize("spec", ["IVF64,Flat", "PCA16,IVF64,Flat", "IVF64,PQ8x4", "HNSW16", "IVF64,SQ8"])
def test_an_index_string_is_built_per_sealed_shard_and_tuned_per_query(tmp_path: Path, spec: str) -> None:
    store, vectors, refs = sealed_store(tmp_path, spec)
    assert (tmp_path / "shards" / "c" / "00000001" / index.INDEX_FILE).exists()
    queries = data(100, 5)
    exact = ((queries[:, None] - vectors[None]) ** 2).sum(-1).argsort(axis=1)[:, :10]
    _, _, few = store.search("c", queries, 10, {"nprobe": 1, "efSearch": 16})
    _, _, many = store.search("c", queries, 10, {"nprobe": 64, "efSearch": 512})
    low, high = recall(few, refs[exact]), recall(many, refs[exact])
    assert high >= low
    if spec in ("IVF64,Flat", "PCA16,IVF64,Flat", "HNSW16"):  # all lists visited / a wide beam: exact or nearly
        assert high >= 0.95
        if spec != "HNSW16":
            assert low < high  # nprobe reaches the index
    else:
        assert high >= 0.2  # compressed codes: approximate distances, but far from noise (10 / 10,000)
    store.delete("c", refs[exact[:, 0]])  # every query's nearest row
    _, _, after = store.search("c", queries, 10, {"nprobe": 64})
    assert not np.isin(after, refs[exact[:, 0]]).any() and (after >= 0).all()
    store.close()
    with mock.patch.object(index, "build", side_effect=AssertionError("rebuilt a persisted index")):
        with shardmgr.open(tmp_path, seal_bytes=ROWS * DIM * 4, index_train_rows=2500) as store:
            store.wait_for_indexes(timeout=5)
            _, _, again = store.search("c", queries, 10, {"nprobe": 64})
            np.testing.assert_array_equal(again, after)


def test_a_shard_too_small_to_train_is_searched_exactly(tmp_path: Path) -> None:
    with shardmgr.open(tmp_path, seal_bytes=1000 * DIM * 4) as store:
        store.create_collection("c", DIM, index="IVF1024,Flat")  # needs 39 * 1024 rows
        vectors = data(1000)
        refs = store.append("c", vectors, np.arange(1000))
        store.append("c", data(1, 3), [1000])
        store.wait_for_indexes()
        assert not list(tmp_path.rglob(index.INDEX_FILE))
        _, _, found = store.search("c", vectors[:20], 1)
        np.testing.assert_array_equal(found[:, 0], refs[:20])


def test_an_index_of_another_kind_is_never_loaded(tmp_path: Path) -> None:
    store, _, _ = sealed_store(tmp_path, "IVF64,Flat")
    shard = store.collection("c").shards[1]
    assert index.load(shard.directory, shard.rows, "IVF64,Flat", shard.uuid) is not None
    assert index.load(shard.directory, shard.rows, "IVF32,Flat", shard.uuid) is None
    store.close()


@pytest.mark.parametrize("spec, message", [
    ("IVF", "index_factory refuses"), ("bogus,Flat", "index_factory refuses"), ("", "index must be"),
    ("x" * 300, "index must be"), ("PQ8", "cannot skip deleted rows"), ("LSH", "cannot skip deleted rows"),
    ("IVF16,Flat,RFlat", "cannot skip deleted rows"), ("NSG16,Flat", "cannot skip deleted rows"),
])
def test_a_bad_index_string_is_refused_and_creates_nothing(tmp_path: Path, spec: str, message: str) -> None:
    with shardmgr.open(tmp_path) as store:
        with pytest.raises(BadVectors, match=message):
            store.create_collection("c", DIM, index=spec)
        assert store.collections() == []


@pytest.mark.parametrize("params, message", [
    ({"nprobe": 0}, "nprobe"), ({"efSearch": True}, "efSearch"), ({"ef": 3}, "map of"), ([1], "map of"),
])
def test_bad_search_params_are_refused(tmp_path: Path, params: object, message: str) -> None:
    with shardmgr.open(tmp_path) as store:
        store.create_collection("c", DIM, index="IVF64,Flat")
        store.append("c", data(10), np.arange(10))
        with pytest.raises(BadVectors, match=message):
            store.search("c", data(1), 3, params)  # type: ignore[arg-type]


def test_search_params_over_the_wire(tmp_path: Path) -> None:
    from tests.shardmgr.server.serverproc import ServerProcess
    server = ServerProcess(tmp_path / "data").start()
    try:
        with shardmgr.connect(server.address) as client:
            client.create_collection("c", DIM, index="IVF64,Flat")
            refs = client.append("c", data(100), np.arange(100))
            _, _, found = client.search("c", data(100)[:3], 1, {"nprobe": 4})
            np.testing.assert_array_equal(found[:, 0], refs[:3])  # the growing shard: exact
            with pytest.raises(BadVectors, match="nprobe"):
                client.search("c", data(1), 1, {"nprobe": -1})
            assert client.collection_info("c")["index"] == "IVF64,Flat"
    finally:
        server.kill()
