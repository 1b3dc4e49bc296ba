"""The ids file is derived data: the batch records carry the ids (version 2,
batch_record.py), so a flush syncs the vectors and the journal only, and
the ids file is synced when its shard is sealed or closed. These tests cut
the power between the writes of an append and check that no acknowledged
durable row is lost and that the ids a power cut took from the ids file
come back from the journal (replay.py)."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import shardmgr
from common.journal import Journal
from common.journal.testing import PowerCut
from shardmgr.errors import UnknownRef
from shardmgr.store import batch_record
from shardmgr.store.rows import HEADER_SIZE

DIM = 16


class Crash(Exception):
    """The process dies here."""


def rows_of(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def ids_on_disk(shard: Path, rows: int) -> np.ndarray:
    """The ids file's first ``rows`` ids as the disk holds them (zeros past its end)."""
    raw = (shard / "ids").read_bytes()[HEADER_SIZE:HEADER_SIZE + rows * 8]
    return np.frombuffer(raw.ljust(rows * 8, b"\0"), dtype=np.int64)


def crash_during_append(store: shardmgr.store.store.Store, point: str) -> None:
    """Append one more batch (ids 900..909), dying at ``point`` of it."""
    real_append = Journal.append

    def append_then_die(journal: Journal, body: bytes) -> object:
        real_append(journal, body)
        raise Crash

    patches = {"before_record": mock.patch.object(batch_record, "pack", side_effect=Crash),
               "after_record": mock.patch.object(Journal, "append", append_then_die)}
    if point == "after_flush":
        store.append("c", rows_of(10, 9), np.arange(900, 910), durable=True)
        return
    with patches[point], pytest.raises(Crash):
        store.append("c", rows_of(10, 9), np.arange(900, 910))


@pytest.mark.parametrize("point", ["before_record", "after_record", "after_flush"])
@pytest.mark.parametrize("lose_ids", [True, False], ids=["ids_file_lost", "power_cut_model"])
def test_power_cut_between_the_writes_keeps_acknowledged_rows_and_their_ids(tmp_path: Path, point: str,
                                                                             lose_ids: bool) -> None:
    data = tmp_path / "data"
    (data / "shards").mkdir(parents=True)
    with PowerCut(data, seed=len(point) + lose_ids) as cut:
        store = shardmgr.open(data, extent_bytes=65536)
        store.create_collection("c", DIM)
        acked = [store.append("c", rows_of(n, seed), np.arange(n) + 100 * seed, durable=True)
                 for seed, n in enumerate([30, 1, 50, 7])]
        crash_during_append(store, point)
        store.abandon()
        cut.crash()
    shard = data / "shards" / "c" / "00000001"
    expected_ids = np.concatenate([np.arange(n) + 100 * seed for seed, n in enumerate([30, 1, 50, 7])])
    if lose_ids:  # the ids file never synced since its creation: a power cut may leave just its header
        os.truncate(shard / "ids", HEADER_SIZE)
        assert not np.array_equal(ids_on_disk(shard, len(expected_ids)), expected_ids)
        report = shardmgr.verify(data, deep=True)
        assert report.exit_code == 1, report.problems  # repairable: the journal holds the ids
        assert {(Path(p.path).name, p.what) for p in report.problems} >= {("ids", "rows_missing")}
    with shardmgr.open(data) as store:
        refs = np.concatenate(acked)
        np.testing.assert_array_equal(store.get("c", refs), np.concatenate([rows_of(n, s) for s, n in
                                                                           enumerate([30, 1, 50, 7])]))
        np.testing.assert_array_equal(store.ids("c", refs), expected_ids)
        rows = store.collection_info("c")["rows"]
        assert rows in (len(refs), len(refs) + 10)  # the crashed batch whole, or not at all
        if point == "after_flush":
            assert rows == len(refs) + 10  # it was acknowledged durable
        if rows > len(refs):
            np.testing.assert_array_equal(store.ids("c", refs[-1] + 1 + np.arange(10)), np.arange(900, 910))
        else:
            with pytest.raises(UnknownRef):
                store.get("c", [refs[-1] + 1])
    assert np.array_equal(ids_on_disk(shard, len(expected_ids)), expected_ids), "not rewritten on disk"
    assert shardmgr.verify(data, deep=True).exit_code == 0


def test_the_ids_file_is_not_synced_by_a_flush_but_by_a_seal(tmp_path: Path) -> None:
    """The cost this format saves: a durable append syncs two files, not three."""
    store = shardmgr.open(tmp_path, seal_bytes=4096)
    store.create_collection("c", 8)
    store.append("c", rows_of(1, 0)[:, :8], [0], durable=True)
    synced: list[str] = []
    real = os.fdatasync

    def watch(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    with mock.patch("os.fdatasync", watch):
        store.append("c", np.ones((3, 8), np.float32), [1, 2, 3], durable=True)
        assert set(synced) == {"vectors", "journal"}
        synced.clear()
        store.append("c", np.ones((200, 8), np.float32), np.arange(200), durable=True)  # seals shard 1
        assert "ids" in synced
    store.close()


def test_verify_finds_a_sealed_ids_file_that_differs_from_the_journal_and_repair_rewrites_it(tmp_path: Path) -> None:
    store = shardmgr.open(tmp_path, seal_bytes=4096)
    store.create_collection("c", 8)
    refs = store.append("c", rows_of(100, 0)[:, :8], np.arange(100) * 3, durable=True)
    store.append("c", rows_of(100, 1)[:, :8], np.arange(100), durable=True)  # seals shard 1
    store.close()
    ids_file = tmp_path / "shards" / "c" / "00000001" / "ids"
    with open(ids_file, "r+b") as f:  # a flipped bit in a sealed ids file: the open does not look (O(1))
        f.seek(HEADER_SIZE + 8 * 42)
        f.write(b"\x01")
    assert shardmgr.verify(tmp_path).exit_code == 0  # sizes only
    report = shardmgr.verify(tmp_path, deep=True)
    assert report.exit_code == 1
    [problem] = report.problems
    assert (Path(problem.path), problem.what, problem.offset) == (ids_file, "ids_mismatch", HEADER_SIZE)
    repaired = shardmgr.verify(tmp_path, deep=True, repair=True)
    assert repaired.exit_code == 0, repaired.problems
    assert any("rewrote 100 ids of shards/c/00000001 from its journal" in a for a in repaired.repaired)
    with shardmgr.open(tmp_path, seal_bytes=4096) as store:
        np.testing.assert_array_equal(store.ids("c", refs), np.arange(100) * 3)


def test_a_durable_append_starts_writing_its_vectors_out_at_once(tmp_path: Path) -> None:
    """Only appends someone waits for ask for an early write-out (a hint:
    the rows' fdatasync follows), and it covers exactly the new rows."""
    from common.journal import filesystem

    store = shardmgr.open(tmp_path)
    store.create_collection("c", 8)
    calls: list[tuple[str, int, int]] = []
    real = filesystem.start_writeback

    def spy(fd: int, offset: int, length: int) -> None:
        calls.append((os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), offset, length))
        real(fd, offset, length)

    with mock.patch.object(filesystem, "start_writeback", spy):
        store.append("c", rows_of(5, 0)[:, :8], np.arange(5))
        assert calls == []
        store.append("c", rows_of(3, 1)[:, :8], np.arange(3), durable=True)
        assert calls == [("vectors", HEADER_SIZE + 5 * 32, 3 * 32)]
    with mock.patch.object(filesystem, "_SYNC_FILE_RANGE", None):  # no sync_file_range: nothing asked
        refs = store.append("c", rows_of(2, 2)[:, :8], [8, 9], durable=True)
    np.testing.assert_array_equal(store.ids("c", refs), [8, 9])
    store.close()
