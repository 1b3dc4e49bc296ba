"""verify and rewritten shards' lineage across a collection: two live shards
holding rows of one original shard (overlapping sources) make its refs
ambiguous; verify says so on each, --repair leaves them (it cannot tell
which is right), and once the wrong one is moved out all is clean."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

import shardmgr
from common.journal.check import Severity
from shardmgr.store.lineage import Lineage, overlaps
from shardmgr.store.refs import ROW_BITS

DIM = 8
SEAL = 128 * DIM * 4  # 128 rows a shard


def lineage(sources: dict[int, int], inputs: tuple[int, ...]) -> Lineage:
    return Lineage(sources, inputs, 0)


def test_only_live_shards_claiming_one_original_shard_overlap() -> None:
    assert overlaps({1: None, 3: None, 5: lineage({2: 128}, (2,))}) == {}
    assert overlaps({2: None, 5: lineage({2: 128}, (2,))}) == {}  # 2 is superseded: the next open removes it
    assert overlaps({2: None, 7: lineage({2: 128, 3: 128}, (5, 3))}) == {7: ([2], [2]), 2: ([2], [7])}
    assert overlaps({5: lineage({2: 128}, (2,)), 6: lineage({2: 128}, (2,))}) == {5: ([2], [6]), 6: ([2], [5])}
    # 5 was merged into 8; 8 and 9 both hold rows of 3
    assert overlaps({5: lineage({2: 128}, (2,)), 8: lineage({2: 128, 3: 128}, (5, 3)),
                     9: lineage({3: 128, 4: 128}, (3, 4))}) == {8: ([3], [9]), 9: ([3], [8])}


def diverged(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """A data directory and a snapshot of it each rewrite shard 2 on their own
    (the data directory after deleting more of its rows); then the copy's
    rewritten shard (6) is put back into the data directory beside the data
    directory's own (5), as a careless restore would. Returns the data
    directory and shard 2's refs."""
    data, snap = tmp_path / "data", tmp_path / "snap"
    rng = np.random.default_rng(0)
    with shardmgr.open(data, seal_bytes=SEAL) as store:
        store.create_collection("c", DIM)
        refs = [store.append("c", rng.standard_normal((128, DIM)).astype(np.float32), np.arange(128) + 1000 * i)
                for i in range(4)]
        store.delete("c", refs[1][:100])
    shardmgr.snapshot(data, snap)
    with shardmgr.open(data, seal_bytes=SEAL) as store:
        store.delete("c", refs[1][100:105])
        assert store.compact() == 1  # shard 2 -> 5
    with shardmgr.open(snap, seal_bytes=SEAL) as store:
        store.append("c", rng.standard_normal((10, DIM)).astype(np.float32), np.arange(10))  # shard 5 here
        assert store.compact() == 1  # shard 2 -> 6
    shutil.copytree(snap / "shards" / "c" / "00000006", data / "shards" / "c" / "00000006")
    return data, refs[1]


def test_verify_reports_two_live_shards_holding_the_same_rows(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    data, shard_two = diverged(tmp_path)
    assert (shard_two >> ROW_BITS == 2).all()
    collection = data / "shards" / "c"
    report = shardmgr.verify(data, deep=True)
    assert report.exit_code == 2
    found = {Path(p.path).parent.name: p for p in report.problems}
    assert sorted(found) == ["00000005", "00000006"] and len(report.problems) == 2
    for mine, other in (("00000005", 6), ("00000006", 5)):
        problem = found[mine]
        assert (problem.severity, problem.what, problem.offset) == (Severity.CORRUPT, "overlapping_sources", 64)
        assert problem.expected == "the only live shard holding rows of shard(s) 2"
        assert problem.found.startswith(f"shard(s) {other} hold rows of them too: their refs are ambiguous")
        assert "--repair cannot tell which" in problem.found
    with caplog.at_level(logging.ERROR), shardmgr.open(data, seal_bytes=SEAL) as store:  # what it leads to
        _, _, nearest = store.search("c", store.get("c", shard_two[110:111]), k=2)
        assert (nearest[0] == shard_two[110]).all(), "the row is not served twice: the test built no overlap"
    assert "shard 6 holds rows of shards [2] that shards [5] hold too" in caplog.text
    repaired = shardmgr.verify(data, repair=True)
    assert repaired.exit_code == 2 and [p.what for p in repaired.problems] == ["overlapping_sources"] * 2
    assert (collection / "00000005").is_dir() and (collection / "00000006").is_dir()
    assert not any("00000005" in a or "00000006" in a for a in repaired.repaired), repaired.repaired
    shutil.rmtree(collection / "00000006")  # the operator moves the restored shard out
    assert shardmgr.verify(data, deep=True).exit_code == 0
    with shardmgr.open(data, seal_bytes=SEAL) as store:
        _, _, nearest = store.search("c", store.get("c", shard_two[110:111]), k=2)
        assert nearest[0, 0] == shard_two[110] and nearest[0, 1] != shard_two[110]
