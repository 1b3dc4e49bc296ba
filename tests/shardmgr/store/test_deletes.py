"""Deleting rows: search skips them, get refuses them, they stay deleted
across restarts and power cuts, and bad deletes change nothing."""

from __future__ import annotations

import errno
import random
import shutil
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

import shardmgr
from common.journal import Flusher, FlusherConfig, Journal
from common.journal.check import Severity
from common.journal.record import RECORD_HEADER_SIZE
from common.journal.testing import PowerCut
from shardmgr.errors import BadVectors, DiskFull, RowDeleted, UnknownRef
from shardmgr.store import deletes, layout
from shardmgr.store.refs import ROW_BITS


def rows_of(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


@pytest.mark.parametrize("index", ["flat", "hnsw"])
def test_search_returns_k_live_rows_and_never_a_deleted_one(tmp_path: Path, index: str) -> None:
    with shardmgr.open(tmp_path, seal_bytes=64 * 200) as store:
        store.create_collection("c", 16, index=index)
        data = rows_of(1000, 16, 1)
        refs = store.append("c", data, np.arange(1000))
        store.wait_for_indexes()
        queries = data[:50]
        _, _, before = store.search("c", queries, k=5)
        assert (before[:, 0] == refs[:50]).all()
        gone = np.unique(before)  # every row any query found: the next search must find others
        assert store.delete("c", gone) == len(gone)
        _, ids, after = store.search("c", queries, k=5)
        assert not np.isin(after, gone).any()
        assert (after >= 0).all(), "fewer than k results although most rows are live"
        live = np.setdiff1d(refs, gone)
        exact = ((queries[:, None, :] - store.get("c", live)[None]) ** 2).sum(-1)
        if index == "flat":
            np.testing.assert_array_equal(after[:, 0], live[exact.argmin(axis=1)])
        np.testing.assert_array_equal(ids, store.ids("c", after.ravel()).reshape(ids.shape))


def test_get_of_a_deleted_ref_names_it_and_counts_are_reported(tmp_path: Path) -> None:
    with shardmgr.open(tmp_path) as store:
        store.create_collection("c", 4)
        refs = store.append("c", rows_of(10, 4, 2), np.arange(10))
        assert store.delete("c", refs[[2, 5, 5]], durable=True) == 2
        assert store.delete("c", refs[[2, 3]]) == 1  # 2 was deleted already: counted once
        with pytest.raises(RowDeleted, match=str(int(refs[5]))):
            store.get("c", refs[[0, 5]])
        np.testing.assert_array_equal(store.ids("c", refs[[0, 9]]), [0, 9])
        info = store.collection_info("c")
        assert (info["rows"], info["deleted"]) == (7, 3)
        assert store.stats()["deleted_rows"] == 3


def test_delete_ids_reaches_every_shard(tmp_path: Path) -> None:
    with shardmgr.open(tmp_path, seal_bytes=4096) as store:
        store.create_collection("c", 8)
        refs = np.concatenate([store.append("c", rows_of(100, 8, s), np.arange(100) % 7) for s in range(4)])
        assert store.collection_info("c")["shards"] > 1
        ids = np.tile(np.arange(100) % 7, 4)
        assert store.delete_ids("c", [3, 5, 42], durable=True) == int(np.isin(ids, [3, 5]).sum())
        assert store.delete_ids("c", [3]) == 0
        _, found_ids, found = store.search("c", rows_of(20, 8, 9), k=100)
        assert not np.isin(found_ids, [3, 5]).any() and (found >= 0).all()
        with pytest.raises(RowDeleted):
            store.get("c", refs[ids == 5][:1])


def test_deletes_survive_a_restart_in_sealed_and_growing_shards(tmp_path: Path) -> None:
    store = shardmgr.open(tmp_path, seal_bytes=4096)
    store.create_collection("c", 8)
    first = store.append("c", rows_of(200, 8, 1), np.arange(200))  # sealed: 200 rows of 32 B > 4096
    second = store.append("c", rows_of(20, 8, 2), np.arange(200, 220))  # growing
    store.delete("c", np.concatenate([first[:5], second[:3]]), durable=True)
    store.close()
    with shardmgr.open(tmp_path, seal_bytes=4096) as store:  # the growing shard is replayed and sealed
        info = store.collection_info("c")
        assert (info["rows"], info["deleted"]) == (212, 8)
        for ref in (first[4], second[2]):
            with pytest.raises(RowDeleted):
                store.get("c", [ref])
        assert store.delete("c", first[5:7]) == 2  # a sealed shard still takes deletes
    with shardmgr.open(tmp_path) as store:
        assert store.collection_info("c")["deleted"] == 10
        assert shardmgr.verify(tmp_path, deep=True).exit_code == 0


def test_deleting_every_row_leaves_searches_empty(tmp_path: Path) -> None:
    with shardmgr.open(tmp_path) as store:
        store.create_collection("c", 4, "ip")
        refs = store.append("c", rows_of(30, 4, 3), np.arange(30))
        store.delete("c", refs)
        scores, ids, found = store.search("c", rows_of(2, 4, 4), k=3)
        assert (found == -1).all() and (ids == -1).all() and np.isneginf(scores).all()
        assert store.collection_info("c")["rows"] == 0


def test_bad_deletes_change_nothing(tmp_path: Path) -> None:
    with shardmgr.open(tmp_path) as store:
        store.create_collection("c", 4)
        refs = store.append("c", rows_of(10, 4, 5), np.arange(10))
        unknown = [int(refs[0]), int(refs[-1]) + 1]  # the second names no row
        with pytest.raises(UnknownRef, match=str(unknown[1])):
            store.delete("c", unknown)
        with pytest.raises(UnknownRef):
            store.delete("c", [int(refs[0]), 7 << ROW_BITS])  # no such shard
        with pytest.raises(UnknownRef):
            store.delete("c", [-1])
        with pytest.raises(BadVectors):
            store.delete("c", np.array([1.5]))
        with pytest.raises(BadVectors):
            store.delete_ids("c", np.zeros((2, 2), np.int64))
        assert store.collection_info("c")["deleted"] == 0
        assert not list(tmp_path.rglob(layout.DELETES)), "a refused delete created the delete log"
        np.testing.assert_array_equal(store.ids("c", refs), np.arange(10))


@pytest.mark.parametrize("seed", range(6))
def test_power_cut_keeps_every_confirmed_delete(tmp_path: Path, seed: int) -> None:
    """Lives of random appends and deletes, each ended by a simulated power
    cut: a delete confirmed durable stays deleted, a row confirmed durable
    and never deleted stays, and nothing is quarantined."""
    rng = random.Random(seed)
    data = tmp_path / "data"
    appended: dict[int, np.ndarray] = {}  # confirmed durable
    unconfirmed: set[int] = set()  # appended without waiting: may be lost
    deleted: set[int] = set()  # confirmed durable
    maybe_deleted: set[int] = set()  # asked, not confirmed
    for life in range(3):
        (data / "shards").mkdir(parents=True, exist_ok=True)
        unconfirmed.clear()  # the last cut may have taken them: deleting one now would be an unknown ref
        with PowerCut(data, seed=seed * 7 + life) as cut:
            store = shardmgr.open(data, seal_bytes=rng.choice([4096, 1 << 20]), extent_bytes=65536)
            store.create_collection("c", 8)
            for step in range(rng.randint(3, 15)):
                n = rng.randint(1, 40)
                vectors = rows_of(n, 8, seed * 1000 + life * 100 + step)
                if rng.random() < 0.7:
                    refs = store.append("c", vectors, np.arange(n), durable=True)
                    appended.update((int(r), v) for r, v in zip(refs, vectors))
                else:  # a durable delete of these may outlive them (a hurried round syncs the delete log only)
                    unconfirmed.update(store.append("c", vectors, np.arange(n)).tolist())
                known = sorted(set(appended) | unconfirmed)
                victims = rng.sample(known, min(len(known), rng.randint(0, 10)))
                durable = rng.random() < 0.6
                store.delete("c", victims, durable=durable)
                (deleted if durable else maybe_deleted).update(victims)
            store.abandon()
            cut.crash()
    with shardmgr.open(data) as store:
        assert not store.stats()["quarantined_shards"]
        for ref in deleted:
            with pytest.raises(RowDeleted if ref in appended else (RowDeleted, UnknownRef)):
                store.get("c", [ref])
        kept = np.array(sorted(set(appended) - deleted - maybe_deleted), dtype=np.int64)
        if len(kept):
            np.testing.assert_array_equal(store.get("c", kept), np.stack([appended[int(r)] for r in kept]))
        _, _, found = store.search("c", rows_of(10, 8, 99), k=20)
        assert not np.isin(found, list(deleted)).any()
    assert shardmgr.verify(data, deep=True).exit_code <= 1
    shutil.rmtree(data)


def _delete_log(tmp_path: Path) -> Path:
    with shardmgr.open(tmp_path) as store:
        store.create_collection("c", 4)
        refs = store.append("c", rows_of(10, 4, 6), np.arange(10))
        store.delete("c", refs[:3], durable=True)
    (path,) = tmp_path.rglob(layout.DELETES)
    return path


def test_a_damaged_delete_log_is_found_by_verify_and_quarantines_its_shard(tmp_path: Path) -> None:
    path = _delete_log(tmp_path)
    with Journal.open(path, kind=deletes.KIND, writable=False) as journal:
        (record,) = journal.records()
    assert np.frombuffer(record.body, "<i8").tolist() == [0, 1, 2]
    data = bytearray(path.read_bytes())
    data[record.offset + RECORD_HEADER_SIZE + 8] = 0  # rows 0, 0, 2: the body's checksum no longer matches
    path.write_bytes(bytes(data))
    report = shardmgr.verify(tmp_path, deep=True)
    assert any(p.severity == Severity.CORRUPT and p.path == str(path) for p in report.problems), report.problems
    with shardmgr.open(tmp_path) as store:  # never serve the deleted rows again: the shard goes aside
        assert store.stats()["quarantined_shards"] == 1


def test_a_delete_log_of_another_shard_is_refused(tmp_path: Path) -> None:
    path = _delete_log(tmp_path)
    with shardmgr.open(tmp_path / "other") as store:
        store.create_collection("c", 4)
        store.delete("c", store.append("c", rows_of(4, 4, 7), np.arange(4))[:1])
    (foreign,) = (tmp_path / "other").rglob(layout.DELETES)
    shutil.copyfile(foreign, path)
    report = shardmgr.verify(tmp_path, deep=True)
    assert any(p.what == "metadata" and p.path == str(path) for p in report.problems), report.problems


def test_a_checksummed_delete_record_out_of_order_is_corrupt(tmp_path: Path) -> None:
    path = _delete_log(tmp_path)
    with Flusher(FlusherConfig()) as flusher:
        with Journal.open(path, kind=deletes.KIND, flusher=flusher, config=deletes.CONFIG) as journal:
            journal.append(np.array([5, 3], "<i8").tobytes())
            journal.flush()
    report = shardmgr.verify(tmp_path, deep=True)
    assert [p.what for p in report.problems if p.severity == Severity.CORRUPT] == ["delete_record"], report.problems
    with shardmgr.open(tmp_path) as store:
        assert store.stats()["quarantined_shards"] == 1


@pytest.mark.parametrize("seed", range(4))
def test_a_durable_repeat_of_a_delete_waits_for_the_first(tmp_path: Path, seed: int) -> None:
    """Deleting a row that an earlier, not yet durable call deleted writes
    nothing new, but with ``durable`` it still returns only once the row's
    deletion is durable."""
    data = tmp_path / "data"
    (data / "shards").mkdir(parents=True)
    with PowerCut(data, seed=seed) as cut:
        store = shardmgr.open(data)
        store.create_collection("c", 4)
        refs = store.append("c", rows_of(8, 4, 1), np.arange(8), durable=True)
        store.delete("c", refs[:1])
        store.delete_ids("c", [5])
        assert store.delete("c", refs[:1], durable=True) == 0
        assert store.delete_ids("c", [5], durable=True) == 0
        store.abandon()
        cut.crash()
    with shardmgr.open(data) as store:
        assert store.collection_info("c")["deleted"] == 2


def test_a_delete_cut_short_by_a_full_disk_keeps_what_it_wrote_and_can_be_repeated(tmp_path: Path) -> None:
    with shardmgr.open(tmp_path, seal_bytes=4096) as store:
        store.create_collection("c", 8)
        first = store.append("c", rows_of(128, 8, 1), np.arange(128))  # a full shard
        second = store.append("c", rows_of(4, 8, 2), np.arange(128, 132))  # the next one
        create = Journal.create
        calls = []

        def second_fails(*args: Any, **kwargs: Any) -> Journal:
            calls.append(args)
            if len(calls) == 2:
                raise OSError(errno.ENOSPC, "No space left on device")
            return create(*args, **kwargs)

        with mock.patch.object(Journal, "create", side_effect=second_fails):
            with pytest.raises(DiskFull, match="some shards may be deleted"):
                store.delete("c", [first[0], second[0]])
        with pytest.raises(RowDeleted):  # what the call wrote is seen at once, not at some later write
            store.get("c", first[:1])
        assert store.delete("c", [first[0], second[0]], durable=True) == 1
        assert store.collection_info("c")["deleted"] == 2


def test_delete_ids_refuses_ids_past_int64(tmp_path: Path) -> None:
    with shardmgr.open(tmp_path) as store:
        store.create_collection("c", 4)
        store.append("c", rows_of(3, 4, 1), [-1, -1, 5])
        with pytest.raises(BadVectors, match="int64"):
            store.delete_ids("c", np.array([2**64 - 1], np.uint64))
        assert store.collection_info("c")["deleted"] == 0


def test_hnsw_with_most_rows_deleted_still_returns_k_live_rows(tmp_path: Path) -> None:
    with shardmgr.open(tmp_path, seal_bytes=4096 * 16 * 4) as store:
        store.create_collection("c", 16, index="hnsw")
        refs = store.append("c", rows_of(4096, 16, 1), np.arange(4096))
        store.append("c", rows_of(1, 16, 2), [4096])  # seals the first shard
        store.wait_for_indexes()
        store.delete("c", refs[40:])
        scores, _, found = store.search("c", rows_of(200, 16, 3), k=10)
        assert (found >= 0).all(), "an HNSW shard with 40 live rows answered fewer than 10"
        assert not np.isin(found, refs[40:]).any()
