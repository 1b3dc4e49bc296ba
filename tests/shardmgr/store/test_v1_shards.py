"""Shards written before batch records carried the ids (version 1: 24-byte
records, the ids file authoritative) still open, recover, search, verify,
rewrite and snapshot; new appends go to version 2 shards beside them.

The data directory is ``data/v1_store.tar.gz``, written by the store of
commit 95f7e00 (``data/make_v1_store.py`` says what is in it).
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import msgpack
import numpy as np
import pytest

import shardmgr
from common.journal import Journal
from shardmgr.errors import RowDeleted
from shardmgr.store.batch_record import V1, V2, VERSION_KEY
from shardmgr.store.refs import ref_of

FIXTURE = Path(__file__).parent / "data" / "v1_store.tar.gz"
SEAL = 4096  # the fixture's seal_bytes: 128 rows of 8-d per shard


def rows_of(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def version(shard: Path) -> int:
    with Journal.open(shard / "journal", writable=False) as journal:
        return int(msgpack.unpackb(journal.metadata).get(VERSION_KEY, V1))


@pytest.fixture
def old(tmp_path: Path) -> Path:
    """A copy of the version 1 data directory."""
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    return tmp_path / "data"


def shard_dir(data: Path, collection: str, shard: int) -> Path:
    return data / "shards" / collection / f"{shard:08d}"


def test_the_fixture_is_version_1(old: Path) -> None:
    for shard in (shard_dir(old, "old", 1), shard_dir(old, "old", 2), shard_dir(old, "closed", 1)):
        assert version(shard) == V1
    with Journal.open(shard_dir(old, "old", 1) / "journal", writable=False) as journal:
        assert {len(r.body) for r in journal.records()} == {24}


def test_version_1_shards_open_recover_and_serve_every_row(old: Path) -> None:
    sealed = ref_of(1, np.arange(128))
    replayed = ref_of(2, np.arange(50))
    expected_sealed = np.concatenate([rows_of(100, 8, 1), rows_of(28, 8, 2)])
    with shardmgr.open(old, seal_bytes=SEAL) as store:
        info = store.collection_info("old")
        assert (info["rows"], info["deleted"], info["quarantined"]) == (128 + 50 - 2, 2, [])
        live = np.setdiff1d(np.arange(128), [5, 77])
        np.testing.assert_array_equal(store.get("old", sealed[live]), expected_sealed[live])
        np.testing.assert_array_equal(store.ids("old", sealed[live]), live)
        with pytest.raises(RowDeleted):
            store.get("old", sealed[[5]])
        np.testing.assert_array_equal(store.get("old", replayed), np.concatenate([rows_of(20, 8, 3),
                                                                                   rows_of(30, 8, 4)]))
        np.testing.assert_array_equal(store.ids("old", replayed), np.arange(1000, 1050))
        _, ids, refs = store.search("old", expected_sealed[live[:40]], k=1)
        np.testing.assert_array_equal(refs[:, 0], sealed[live[:40]])
        np.testing.assert_array_equal(ids[:, 0], live[:40])
        assert store.delete_ids("old", [1001]) == 1
        # new appends go to a new shard, of version 2: a version 1 shard is never appended to again
        refs = store.append("old", rows_of(10, 8, 6), np.arange(2000, 2010), durable=True)
        assert set((refs >> 40).tolist()) == {3}
        closed = store.append("closed", rows_of(5, 4, 7), np.arange(5), durable=True)
        assert set((closed >> 40).tolist()) == {2}, "a cleanly closed version 1 shard is sealed, not appended to"
        np.testing.assert_array_equal(store.ids("closed", ref_of(1, np.arange(10))), np.arange(500, 510))
    assert version(shard_dir(old, "old", 2)) == V1  # replayed and sealed as it was
    assert (version(shard_dir(old, "old", 3)), version(shard_dir(old, "closed", 2))) == (V2, V2)
    report = shardmgr.verify(old, deep=True)
    assert report.exit_code == 0, report.problems
    with shardmgr.open(old, seal_bytes=SEAL) as store:  # and again, every shard now sealed or version 2
        assert store.collection_info("old")["rows"] == 128 + 50 + 10 - 3


def test_verify_reads_version_1_shards(old: Path) -> None:
    report = shardmgr.verify(old, deep=True)
    assert report.exit_code == 0, report.problems
    with open(shard_dir(old, "old", 1) / "ids", "r+b") as f:  # the ids file is all a version 1 shard has
        f.seek(4096 + 8 * 3)
        f.write(b"\xff")
    report = shardmgr.verify(old, deep=True)
    assert report.exit_code == 2
    assert [(Path(p.path).name, p.what) for p in report.problems] == [("ids", "rows_checksum")]


def test_version_1_shards_are_rewritten_into_a_version_2_shard(old: Path) -> None:
    with shardmgr.open(old, seal_bytes=1 << 20) as store:  # both shards are small next to that: merged
        before = store.get("old", ref_of(2, np.arange(50)))
        assert store.compact("old") == 1  # shards 1 and 2 (both sealed, small) merged
        info = store.collection_info("old")
        assert (info["shards"], info["rows"]) == (1, 176)
        np.testing.assert_array_equal(store.get("old", ref_of(2, np.arange(50))), before)
        np.testing.assert_array_equal(store.ids("old", ref_of(1, np.arange(3))), np.arange(3))
    [merged] = [p for p in (old / "shards" / "old").iterdir() if p.name.isdigit()]
    assert version(merged) == V2
    assert shardmgr.verify(old, deep=True).exit_code == 0


def test_a_snapshot_of_version_1_shards_serves_them(old: Path, tmp_path: Path) -> None:
    shardmgr.snapshot(old, tmp_path / "copy")
    assert shardmgr.verify(tmp_path / "copy", deep=True).exit_code == 0
    with shardmgr.open(tmp_path / "copy", seal_bytes=SEAL) as store:
        np.testing.assert_array_equal(store.ids("old", ref_of(2, np.arange(50))), np.arange(1000, 1050))
