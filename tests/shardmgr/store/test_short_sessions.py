"""Short sessions (open, append a little, close) keep appending to one shard;
a crash still seals the shard it interrupted."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np
import pytest

import shardmgr
from common.journal.testing import PowerCut
from shardmgr.errors import UnknownRef
from shardmgr.store import close_marker, layout
from shardmgr.store.refs import split_refs


def rows_of(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def short_sessions(tmp_path: Path, sessions: int) -> None:
    with shardmgr.open(tmp_path) as store:
        store.create_collection("c", 8)
    baseline = None
    refs = []
    for session in range(sessions):
        with shardmgr.open(tmp_path) as store:
            refs.append(store.append("c", rows_of(3, 8, session), np.arange(3) + 3 * session))
            if session == 10:
                baseline = open_fds()
            elif session > 10:
                assert open_fds() <= baseline, f"session {session}: file descriptors grow with sessions"
    refs_all = np.concatenate(refs)
    with shardmgr.open(tmp_path) as store:
        info = store.collection_info("c")
        assert (info["shards"], info["rows"]) == (1, 3 * sessions)
        np.testing.assert_array_equal(store.ids("c", refs_all), np.arange(3 * sessions))
        np.testing.assert_array_equal(store.get("c", refs_all[-3:]), rows_of(3, 8, sessions - 1))
    assert shardmgr.verify(tmp_path, deep=True).exit_code == 0


def test_short_sessions_leave_one_shard_and_no_extra_fds(tmp_path: Path) -> None:
    short_sessions(tmp_path, 60)


@pytest.mark.soak
def test_a_thousand_short_sessions_leave_one_shard_and_no_extra_fds(tmp_path: Path) -> None:
    short_sessions(tmp_path, 1000)


def test_a_crash_after_a_clean_reopen_seals_the_shard(tmp_path: Path) -> None:
    """The marker is gone before the reopened shard takes an append: a crash
    later in that session seals the shard, so refs of appends it lost never
    name rows appended afterwards."""
    with shardmgr.open(tmp_path) as store:
        store.create_collection("c", 8)
        first = store.append("c", rows_of(5, 8, 1), np.arange(5))
    with PowerCut(tmp_path, seed=3) as cut:
        store = shardmgr.open(tmp_path)
        assert list(tmp_path.rglob(layout.CLOSED))  # kept until the first append
        lost = store.append("c", rows_of(5, 8, 2), np.arange(5, 10))  # not durable: the cut may take it
        assert not list(tmp_path.rglob(layout.CLOSED))
        assert (split_refs(lost)[0] == split_refs(first)[0]).all(), "the reopened shard did not keep growing"
        store.abandon()
        cut.crash()
    with shardmgr.open(tmp_path) as store:
        info = store.collection_info("c")
        assert info["growing"] == 0 and info["sealed"] == 1
        later = store.append("c", rows_of(5, 8, 3), np.arange(10, 15))
        assert (split_refs(later)[0] > split_refs(first)[0]).all()
        np.testing.assert_array_equal(store.get("c", first), rows_of(5, 8, 1))
        with contextlib.suppress(UnknownRef):  # kept or lost by the cut, never another vector
            np.testing.assert_array_equal(store.get("c", lost), rows_of(5, 8, 2))


def test_a_session_that_appends_nothing_changes_nothing_even_if_it_crashes(tmp_path: Path) -> None:
    """Opening (an offline snapshot, a search-only session) keeps the marker,
    so a crash before any append leaves the shard growing, as it was."""
    with shardmgr.open(tmp_path) as store:
        store.create_collection("c", 8)
        first = store.append("c", rows_of(5, 8, 1), np.arange(5))
    store = shardmgr.open(tmp_path)
    store.delete("c", first[:1], durable=True)  # deletes leave the marker true: it names the batches only
    store.abandon()
    files = sorted(tmp_path.rglob("*"))
    for _ in range(2):
        store = shardmgr.open(tmp_path)
        np.testing.assert_array_equal(store.get("c", first[1:]), rows_of(5, 8, 1)[1:])
        store.abandon()
        assert sorted(tmp_path.rglob("*")) == files
    with shardmgr.open(tmp_path) as store:
        assert store.collection_info("c")["growing"] == 1
        assert (split_refs(store.append("c", rows_of(1, 8, 2), [5]))[0] == split_refs(first)[0]).all()


@pytest.mark.parametrize("damage", ["missing", "stale_rows", "unreadable"])
def test_any_doubt_about_the_marker_seals_the_shard(tmp_path: Path, damage: str) -> None:
    with shardmgr.open(tmp_path) as store:
        store.create_collection("c", 8)
        store.append("c", rows_of(5, 8, 1), np.arange(5))
    (marker,) = tmp_path.rglob(layout.CLOSED)
    if damage == "missing":
        marker.unlink()
    elif damage == "stale_rows":
        closed = close_marker.read(marker.parent)
        assert closed is not None
        marker.unlink()
        close_marker.write(marker.parent, closed._replace(rows=closed.rows - 1))
    else:
        marker.write_bytes(b"\0" * 100)
    with shardmgr.open(tmp_path) as store:
        assert store.collection_info("c")["growing"] == 0
        store.append("c", rows_of(1, 8, 2), [9])
        assert store.collection_info("c")["shards"] == 2
    assert not marker.exists(), "the doubtful marker outlived the seal it caused"


def test_sealed_shards_hold_no_file_descriptors(tmp_path: Path) -> None:
    """A sealed shard is read through mappings that hold no descriptor: its
    journal and row files are closed, so descriptors do not grow with sealed
    shards (in the session that sealed them and after a restart)."""
    counts = []
    for shards in (10, 60):
        data = tmp_path / str(shards)
        with shardmgr.open(data, seal_bytes=4096) as store:
            store.create_collection("c", 8)
            for i in range(shards):
                store.append("c", rows_of(130, 8, i), np.arange(130))  # 130 rows of 32 B: one shard each
            assert store.collection_info("c")["sealed"] == shards - 1
            during = open_fds()
        with shardmgr.open(data, seal_bytes=4096) as store:
            _, _, found = store.search("c", rows_of(3, 8, 0), k=1)
            assert (split_refs(found)[0] == 1).all()  # rows of the first shard, read after its descriptors closed
            counts.append((during, open_fds()))
    assert counts[0] == counts[1], f"descriptors (during, after a restart) with 10 and 60 shards: {counts}"
