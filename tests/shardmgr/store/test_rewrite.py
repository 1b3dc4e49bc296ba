"""Rewriting sealed shards: deleted rows dropped, small shards merged, every
ref still naming its vector; a crash at any step loses nothing and brings no
deleted row back."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

import shardmgr
from common.journal.testing import PowerCut
from shardmgr.errors import NeedsReopen, RowDeleted, UnknownRef
from shardmgr.store import rewrite
from shardmgr.store.refs import ROW_BITS, split_refs
from shardmgr.store.shard import Shard
from shardmgr.store.store import Store

DIM = 8
SEAL = 128 * DIM * 4  # 128 rows per shard


def rows_of(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


class Model:
    """What the store must answer: every ref's vector and id, and the deleted refs."""

    def __init__(self) -> None:
        self.vectors: dict[int, np.ndarray] = {}
        self.ids: dict[int, int] = {}
        self.deleted: set[int] = set()
        self.uncertain: set[int] = set()  # deleted or not (a delete not confirmed before a crash)

    def append(self, store: Store, n: int, seed: int) -> np.ndarray:
        vectors, ids = rows_of(n, seed), np.arange(n) + 1000 * seed
        refs = store.append("c", vectors, ids, durable=True)
        for ref, vector, id_ in zip(refs.tolist(), vectors, ids.tolist()):
            self.vectors[ref], self.ids[ref] = vector, id_
        return refs

    def delete(self, store: Store, refs: Any) -> None:
        store.delete("c", refs, durable=True)
        self.deleted.update(int(r) for r in refs)

    def check(self, store: Store) -> None:
        live = np.array(sorted(set(self.vectors) - self.deleted - self.uncertain), dtype=np.int64)
        info = store.collection_info("c")
        assert len(live) <= info["rows"] <= len(live) + len(self.uncertain - self.deleted)
        assert not info["quarantined"]
        np.testing.assert_array_equal(store.get("c", live), np.stack([self.vectors[r] for r in live.tolist()]))
        np.testing.assert_array_equal(store.ids("c", live), [self.ids[r] for r in live.tolist()])
        for ref in sorted(self.deleted)[:20]:
            with pytest.raises(RowDeleted):
                store.get("c", [ref])
        _, _, found = store.search("c", np.stack([self.vectors[r] for r in live[:50].tolist()]), k=1)
        np.testing.assert_array_equal(found[:, 0], live[:50])  # each live row is its own nearest: its old ref
        _, _, everything = store.search("c", rows_of(3, 99), k=min(len(live) + 5, 1000))
        assert set(everything[everything >= 0].ravel().tolist()) <= set(live.tolist()) | self.uncertain


def filled(tmp_path: Path, shards: int = 4) -> tuple[Store, Model, list[np.ndarray]]:
    store = shardmgr.open(tmp_path, seal_bytes=SEAL)
    store.create_collection("c", DIM)
    model = Model()
    refs = [model.append(store, 128, seed) for seed in range(shards)]  # the last one is still growing
    return store, model, refs


def test_a_mostly_deleted_shard_is_rewritten_and_every_ref_still_works(tmp_path: Path) -> None:
    store, model, refs = filled(tmp_path)
    model.delete(store, refs[1][:100])
    assert store.compact() == 1
    info = store.collection_info("c")
    assert (info["deleted"], info["bytes"]) == (0, (128 * 3 + 28) * (DIM * 4 + 8))
    assert not (tmp_path / "shards" / "c" / "00000002").exists()
    model.check(store)
    assert store.delete("c", refs[1][:5]) == 0  # dropped by the rewrite: deleted already
    model.delete(store, refs[1][100:110])  # rows of the rewritten shard, by their old refs
    model.check(store)
    store.close()
    with shardmgr.open(tmp_path, seal_bytes=SEAL) as store:
        model.check(store)
        with pytest.raises(UnknownRef):
            store.get("c", [(2 << ROW_BITS) | 128])  # past the rows shard 2 ever had
        with pytest.raises(UnknownRef):
            store.delete("c", [(2 << ROW_BITS) | 128])
    assert shardmgr.verify(tmp_path, deep=True).exit_code == 0


def test_a_rewritten_shard_is_rewritten_again_and_delete_ids_reaches_it(tmp_path: Path) -> None:
    store, model, refs = filled(tmp_path)
    model.delete(store, refs[0][:80])
    assert store.compact() == 1
    model.delete(store, refs[0][80:110])  # 18 of 48 left: under half again
    assert store.compact() >= 1
    model.check(store)
    ids = [model.ids[int(r)] for r in refs[0][110:115]]
    assert store.delete_ids("c", ids, durable=True) == 5
    model.deleted.update(refs[0][110:115].tolist())
    model.check(store)
    store.close()


def test_small_sealed_shards_are_merged(tmp_path: Path) -> None:
    model = Model()
    for session in range(6):  # each session ends in a crash: its growing shard is sealed at the next open
        store = shardmgr.open(tmp_path, seal_bytes=SEAL)
        store.create_collection("c", DIM)
        model.append(store, 10, session)
        store.abandon()
    with shardmgr.open(tmp_path, seal_bytes=SEAL) as store:
        assert store.collection_info("c")["shards"] == 6
        assert store.compact() == 1
        assert store.collection_info("c")["shards"] == 1
        model.check(store)
        refs = model.append(store, 5, 7)
        assert (split_refs(refs)[0] == 8).all()  # ids of merged shards are never reused
        model.check(store)


def test_deletes_made_while_a_rewrite_builds_are_carried_over(tmp_path: Path) -> None:
    store, model, refs = filled(tmp_path)
    model.delete(store, refs[1][:100])
    build = rewrite.build

    def deleting_meanwhile(*args: Any, **kwargs: Any) -> rewrite.Built:
        built = build(*args, **kwargs)
        model.delete(store, refs[1][120:125])  # after the snapshot, before the publish
        return built

    with mock.patch.object(rewrite, "build", side_effect=deleting_meanwhile):
        assert store.compact() >= 1
    model.check(store)
    store.close()
    with shardmgr.open(tmp_path, seal_bytes=SEAL) as store:
        model.check(store)


@pytest.mark.parametrize("step", ["build", "rename", "removal", "partial_removal"])
def test_a_crash_at_any_step_of_a_rewrite_loses_nothing(tmp_path: Path, step: str) -> None:
    store, model, refs = filled(tmp_path)
    model.delete(store, refs[1][:100])
    real_remove, real_publish = rewrite.remove, rewrite.publish

    class Crash(Exception):
        pass

    def crash(*args: Any, **kwargs: Any) -> Any:
        if step == "rename":
            real_publish(*args, **kwargs)  # committed: the inputs are still there
        elif step == "partial_removal":
            (args[0][0].directory / "vectors").unlink()  # the first input half removed
        raise Crash(step)

    target = {"build": "build", "rename": "publish", "removal": "remove", "partial_removal": "remove"}[step]
    with mock.patch.object(rewrite, target, side_effect=crash), pytest.raises(Crash):
        store.compact()
    store.abandon()
    del real_remove
    with shardmgr.open(tmp_path, seal_bytes=SEAL) as store:
        model.check(store)
        assert not list((tmp_path / "shards" / "c").glob("*.tmp"))
        assert store.compact() <= 1  # a rewrite undone is done again; one committed is not
        model.check(store)
    report = shardmgr.verify(tmp_path, deep=True)
    assert report.exit_code == 0, report.problems


@pytest.mark.parametrize("seed", range(2))
def test_power_cut_during_rewrites(tmp_path: Path, seed: int) -> None:
    power_cuts_during_rewrites(tmp_path, seed)


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(2, 40))
def test_power_cut_during_rewrites_soak(tmp_path: Path, seed: int) -> None:
    power_cuts_during_rewrites(tmp_path, seed)


def power_cuts_during_rewrites(tmp_path: Path, seed: int) -> None:
    """Lives of appends, deletes (confirmed or not) and rewrites, each ended by a power cut."""
    rng = random.Random(seed)
    data = tmp_path / "data"
    model = Model()
    for life in range(3):
        (data / "shards").mkdir(parents=True, exist_ok=True)
        with PowerCut(data, seed=seed * 11 + life) as cut:
            store = shardmgr.open(data, seal_bytes=SEAL, merge_below_fraction=0.5)
            store.create_collection("c", DIM)
            for step in range(rng.randint(2, 6)):
                model.append(store, rng.randint(20, 200), seed * 100 + life * 10 + step)
                alive = sorted(set(model.vectors) - model.deleted - model.uncertain)
                victims = rng.sample(alive, min(len(alive), rng.randint(0, 120)))
                if rng.random() < 0.7:
                    model.delete(store, victims)
                else:
                    store.delete("c", victims)
                    model.uncertain.update(victims)
                store.compact()
            store.abandon()
            cut.crash()
    with shardmgr.open(data, seal_bytes=SEAL) as store:
        model.check(store)
    assert shardmgr.verify(data, deep=True).exit_code <= 1
    shutil.rmtree(data)


def test_a_rewrite_committed_but_not_opened_refuses_writes_until_reopened(tmp_path: Path) -> None:
    """If the new shard cannot be opened after its commit (too many open files),
    a delete or a second rewrite of its inputs now would be undone by the next
    open, which removes them: writes are refused until then."""
    store, model, refs = filled(tmp_path)
    model.delete(store, refs[1][:100])
    real_open = Shard.open
    failures = iter([OSError(24, "Too many open files")])

    def fails_once(*args: Any, **kwargs: Any) -> Shard:
        error = next(failures, None)
        if error is not None:
            raise error
        return real_open(*args, **kwargs)

    with mock.patch.object(Shard, "open", side_effect=fails_once), pytest.raises(OSError, match="open files"):
        store.compact()
    with pytest.raises(NeedsReopen):
        store.delete("c", refs[1][100:101])
    with pytest.raises(NeedsReopen):
        store.append("c", rows_of(1, 50), [1])
    assert store.compact() == 0
    model.check(store)  # reads go on
    store.close()
    with shardmgr.open(tmp_path, seal_bytes=SEAL) as store:
        assert store.collection_info("c")["shards"] == 4
        model.check(store)
        model.delete(store, refs[1][100:110])
        model.check(store)


def test_a_merge_never_shrinks_to_one_shard_rewritten_again_and_again(tmp_path: Path) -> None:
    """A run of two small shards whose second waits for its index build is not
    merged as a run of one (which would repeat at every maintenance pass)."""
    store = shardmgr.open(tmp_path, seal_bytes=SEAL, merge_below_fraction=0.9)
    store.create_collection("c", DIM)
    for seed in range(2):
        store.append("c", rows_of(20, seed), np.arange(20))
        store.abandon()
        store = shardmgr.open(tmp_path, seal_bytes=SEAL, merge_below_fraction=0.9)
    collection = store.collection("c")
    second = max(collection.shards.values(), key=lambda s: s.id)
    with mock.patch.object(type(collection), "unindexed", return_value=[second]):
        assert store.compact() == 0
    assert store.compact() == 1  # once the build is done (or failed), the two merge
    store.close()
