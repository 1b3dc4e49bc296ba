"""The power-cut simulator itself, and the journal under a concurrent workload."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from common.journal import Flusher, FlusherConfig, Journal, Marker
from common.journal.filesystem import fsync_dir
from common.journal.testing import PowerCut
from common.journal.testing.powercut import PAGE


def test_unsynced_pages_keep_old_or_new_content(tmp_path: Path) -> None:
    path = tmp_path / "f"
    old = bytes(range(256)) * 64  # 4 pages
    path.write_bytes(old)
    with PowerCut(tmp_path, seed=3, tear=False) as cut:
        new = bytearray(old)
        new[PAGE * 1:PAGE * 3] = b"\xee" * (2 * PAGE)
        path.write_bytes(new)
        report = cut.crash()
    result = path.read_bytes()
    assert report.pages_changed == 2
    for page in range(4):
        chunk = result[page * PAGE:(page + 1) * PAGE]
        assert chunk in (old[page * PAGE:(page + 1) * PAGE], new[page * PAGE:(page + 1) * PAGE])


def test_synced_content_survives_and_a_torn_page_mixes_sectors(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(PAGE))
    with PowerCut(tmp_path, seed=0) as cut:
        fd = os.open(path, os.O_RDWR)
        os.pwrite(fd, b"\x11" * PAGE, 0)
        os.fdatasync(fd)  # durable
        os.pwrite(fd, b"\x22" * PAGE, 0)  # not durable
        os.close(fd)
        seen: set[bytes] = set()
        for seed in range(40):
            cut.rng.seed(seed)
            path.write_bytes(b"\x22" * PAGE)
            cut.crash()
            data = path.read_bytes()
            for sector in range(0, PAGE, 512):
                assert data[sector:sector + 512] in (b"\x11" * 512, b"\x22" * 512)
            seen.add(data)
    assert b"\x11" * PAGE in seen and b"\x22" * PAGE in seen
    assert len(seen) > 2  # some cuts tore the page


def test_files_created_without_a_directory_sync_may_vanish(tmp_path: Path) -> None:
    vanished = 0
    for seed in range(20):
        d = tmp_path / str(seed)
        d.mkdir()
        with PowerCut(d, seed=seed) as cut:
            (d / "new").write_bytes(b"x")
            vanished += bool(cut.crash().vanished)
    assert 0 < vanished < 20


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("here", [False, True], ids=["flusher-thread", "waiters-thread"])
def test_power_cut_during_concurrent_group_commit(tmp_path: Path, seed: int, here: bool) -> None:
    """Waits with a timeout leave the rounds to the flusher thread; waits
    without one run them on the waiting thread when none runs (sync_here)."""
    rng = random.Random(seed)
    path = tmp_path / "j"
    timeout = None if here else 5.0
    flusher = Flusher(FlusherConfig(interval=0.02 if here else 0.001)).start()
    with PowerCut(tmp_path, seed=seed) as cut:
        journal = Journal.create(path, kind=b"TEST", flusher=flusher)
        confirmed: dict[int, bytes] = {}
        retired: set[int] = set()
        pending = []
        appended: list[tuple[int, bytes, bool]] = []  # (offset, body, closes its batch), in order
        for _ in range(rng.randint(20, 200)):
            bodies = [rng.randbytes(rng.randint(0, 3000)) for _ in range(rng.randint(1, 8))]
            offsets, ticket = journal.append_batch(bodies)
            appended += [(o, b, i == len(bodies) - 1) for i, (o, b) in enumerate(zip(offsets.tolist(), bodies))]
            pending.append((ticket, dict(zip(offsets.tolist(), bodies))))
            if confirmed and rng.random() < 0.3:
                victim = rng.choice(sorted(set(confirmed) - retired or confirmed))
                if victim not in retired:
                    journal.wait_durable(journal.set_markers([victim], Marker.RETIRED), timeout=timeout)
                    retired.add(victim)
            if rng.random() < 0.2:
                journal.wait_durable(ticket, timeout=timeout)
            for t, records in pending:
                if t.durable:
                    confirmed.update(records)
            pending = [(t, r) for t, r in pending if not t.durable]
        flusher.stop(flush=False)
        cut.crash()
        journal.abandon()
    assert (flusher.stats.here > 0) == here  # each seed waits at least once
    with Flusher() as fresh:
        recovered = Journal.open(path, flusher=fresh)
        records = list(recovered.records())
        recovered.close()
    bodies = {r.offset: (r.body, r.marker) for r in records}
    for offset, body in confirmed.items():
        assert bodies[offset][0] == body
    for offset in retired:
        assert bodies[offset][1] == Marker.RETIRED
    assert [(r.offset, r.body) for r in records] == [(o, b) for o, b, _ in appended[:len(records)]]
    assert not records or appended[len(records) - 1][2], "a batch survived only in part"


def test_files_in_directories_never_synced_may_vanish(tmp_path: Path) -> None:
    vanished = 0
    for seed in range(20):
        root = tmp_path / str(seed)
        root.mkdir()
        with PowerCut(root, seed=seed) as cut:
            (root / "sub").mkdir()
            (root / "sub" / "f").write_bytes(b"data")
            vanished += bool(cut.crash().vanished)
    assert 0 < vanished < 20


def test_a_directory_renamed_without_a_sync_of_its_parent_may_go_back(tmp_path: Path) -> None:
    """The rename that publishes a directory (a snapshot, a new shard) counts
    only once its parent is synced; its own synced entries go with it."""
    outcomes: set[tuple[bool, bool]] = set()
    for seed in range(20):
        root = tmp_path / str(seed)
        (root / "d.tmp").mkdir(parents=True)
        with PowerCut(root, seed=seed) as cut:
            (root / "d.tmp" / "f").write_bytes(b"data")
            fd = os.open(root / "d.tmp" / "f", os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
            fsync_dir(root / "d.tmp")
            os.rename(root / "d.tmp", root / "d")
            report = cut.crash()
        place = root / "d" if (root / "d").exists() else root / "d.tmp"
        assert (place / "f").read_bytes() == b"data"  # wherever it is, whole
        assert (root / "d").exists() != (root / "d.tmp").exists()
        outcomes.add(((root / "d").exists(), bool(report.moved_back)))
    assert outcomes == {(True, False), (False, True)}


def test_a_directory_renamed_and_its_parent_synced_stays(tmp_path: Path) -> None:
    for seed in range(10):
        root = tmp_path / str(seed)
        (root / "d.tmp").mkdir(parents=True)
        with PowerCut(root, seed=seed) as cut:
            os.rename(root / "d.tmp", root / "d")
            fsync_dir(root)
            (root / "new").mkdir()  # never synced in its parent: may vanish, with what is in it
            (root / "new" / "sub").mkdir()
            cut.crash()
        assert (root / "d").is_dir() and not (root / "d.tmp").exists()


def test_a_directory_created_without_a_sync_of_its_parent_may_vanish_whole(tmp_path: Path) -> None:
    vanished = 0
    for seed in range(20):
        root = tmp_path / str(seed)
        root.mkdir()
        with PowerCut(root, seed=seed) as cut:
            (root / "new" / "sub").mkdir(parents=True)
            (root / "new" / "sub" / "f").write_bytes(b"x")
            fsync_dir(root / "new")
            fsync_dir(root / "new" / "sub")
            report = cut.crash()
        if not (root / "new").exists():
            vanished += 1
            assert str(root / "new") in report.vanished
    assert 0 < vanished < 20
