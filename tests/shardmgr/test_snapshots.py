"""Snapshots: a consistent copy of the data at one durable point, taken while
appends, deletes, enqueues and completions go on; the copy verifies clean
and serves exactly what was acknowledged around it."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import shardmgr
import workq
from common.journal.check import Severity
from shardmgr.snapshots import CannotSnapshot
from tests.shardmgr.server.serverproc import ServerProcess

DIM = 8


class Load(threading.Thread):
    """Durable appends and deletes, durable enqueues, and a worker completing,
    until stopped; remembers what was acknowledged, in order."""

    def __init__(self, address: str) -> None:
        super().__init__()
        self.address = address
        self.stop = threading.Event()
        self.appended: list[int] = []  # refs, acknowledged durable, in order
        self.deleted: list[int] = []
        self.enqueued = 0
        self.completed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with shardmgr.connect(self.address) as store, workq.connect(self.address) as queue, \
                    workq.Worker(self.address, "w", models=["m"]) as worker:
                step = 0
                while not self.stop.is_set():
                    step += 1
                    vectors = np.random.default_rng(step).standard_normal((50, DIM)).astype(np.float32)
                    self.appended += store.append("c", vectors, np.arange(50) + 50 * step, durable=True).tolist()
                    store.delete("c", self.appended[-50:-45], durable=True)
                    self.deleted += self.appended[-50:-45]
                    queue.enqueue("job", "m", "s", 1, [b"task %d" % step] * 10, durable=True)
                    self.enqueued += 10
                    for item in worker.lease(5, wait=0.1):
                        worker.complete(item.handle, b"done")
                        self.completed += 1
        except BaseException as exc:  # reported by the test
            self.error = exc


def counts(load: Load) -> tuple[int, int, int, int]:
    return len(load.appended), len(load.deleted), load.enqueued, load.completed


def test_a_snapshot_under_load_verifies_and_serves_its_instant(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", "--config", str(_config(tmp_path))).start()
    dest = tmp_path / "snap"
    try:
        with shardmgr.connect(server.address) as client:
            client.create_collection("c", DIM)
        load = Load(server.address)
        load.start()
        while len(load.appended) < 2000 and load.is_alive():
            load.stop.wait(0.05)
        before = counts(load)
        out = subprocess.run([sys.executable, "-m", "shardmgr", "snapshot", str(dest), "--port",
                              server.address.split(":")[1], "--json"], capture_output=True, text=True, timeout=120)
        after = counts(load)
        load.stop.set()
        load.join(60)
        assert out.returncode == 0 and load.error is None, (out.stderr, load.error)
    finally:
        server.kill()
    report = shardmgr.verify(dest, deep=True)
    assert report.exit_code == 0, report.problems
    copy = ServerProcess(dest).start()  # the snapshot is a data directory a server serves
    try:
        with shardmgr.connect(copy.address) as store, workq.connect(copy.address) as queue:
            info = store.collection_info("c")
            assert before[0] <= info["rows"] + info["deleted"] <= after[0]  # rows stored, deleted or not
            assert before[1] <= info["deleted"] <= after[1]
            kept = [i for i in range(before[0]) if i % 50 >= 5]  # the first 5 of each batch were deleted
            np.testing.assert_array_equal(store.ids("c", [load.appended[i] for i in kept]),
                                          [50 * (i // 50 + 1) + i % 50 for i in kept])
            status = queue.job_status("job")
            assert before[2] <= status["enqueued"] <= after[2]
            assert before[3] <= status["completed"] <= after[3]
    finally:
        copy.kill()


def _config(tmp_path: Path) -> Path:
    config = tmp_path / "server.toml"
    config.write_text("[store]\nseal_bytes = 16384\n")  # many sealed shards: linked, not copied
    return config


def test_an_offline_snapshot_links_sealed_files_and_refuses_an_existing_destination(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with shardmgr.open(data, seal_bytes=4096) as store:
        store.create_collection("c", DIM)
        refs = np.concatenate([store.append("c", np.ones((128, DIM), np.float32) * i, np.arange(128))
                               for i in range(3)])
    shardmgr.snapshot(data, tmp_path / "snap")
    sealed = data / "shards" / "c" / "00000001" / "vectors"
    assert sealed.stat().st_ino == (tmp_path / "snap" / "shards" / "c" / "00000001" / "vectors").stat().st_ino
    linked = sorted(p.name for p in (tmp_path / "snap").rglob("*"))
    with pytest.raises(CannotSnapshot, match="exists"):
        shardmgr.snapshot(data, tmp_path / "snap")
    assert sorted(p.name for p in (tmp_path / "snap").rglob("*")) == linked  # the refused one touched nothing
    with shardmgr.open(data) as store:
        np.testing.assert_array_equal(store.get("c", refs[[0, 383]]), np.ones((2, DIM)) * [[0], [2]])
    with shardmgr.open(tmp_path / "snap") as store:
        np.testing.assert_array_equal(store.get("c", refs[[0, 200, 383]]), np.ones((3, DIM)) * [[0], [1], [2]])
    assert shardmgr.verify(tmp_path / "snap", deep=True).exit_code == 0


def test_a_snapshot_that_fails_leaves_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with shardmgr.open(data) as store:
        store.create_collection("c", DIM)
        store.append("c", np.ones((10, DIM), np.float32), np.arange(10))
    with mock.patch("shardmgr.store.copies.copy_prefix", side_effect=OSError(28, "No space left on device")):
        with pytest.raises(CannotSnapshot, match="No space"):
            shardmgr.snapshot(data, tmp_path / "snap")
    assert not (tmp_path / "snap").exists() and not (tmp_path / "snap.tmp").exists()
    report = shardmgr.verify(data, deep=True)
    assert not [p for p in report.problems if p.severity > Severity.NOTE]


def test_an_offline_snapshot_changes_nothing_in_its_source(tmp_path: Path) -> None:
    """No maintenance, index or owner thread runs on a directory that is only
    copied: small sealed shards a running store would merge stay as they are."""
    data = tmp_path / "data"
    for session in range(3):  # each ends in a crash: three small sealed shards, merge candidates
        store = shardmgr.open(data)
        store.create_collection("c", DIM)
        store.append("c", np.full((5, DIM), session, np.float32), np.arange(5))
        store.abandon()
    with shardmgr.open(data, merge_below_fraction=0.0):  # recovery's own changes (seals), no merges
        pass
    before = sorted(str(p.relative_to(data)) for p in (data / "shards").rglob("*"))
    shardmgr.snapshot(data, tmp_path / "snap")  # (the queue's recovery creates its empty directory)
    assert sorted(str(p.relative_to(data)) for p in (data / "shards").rglob("*")) == before
    with shardmgr.open(tmp_path / "snap", merge_below_fraction=0.0) as store:
        assert store.collection_info("c")["shards"] == 3
