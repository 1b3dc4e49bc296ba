"""The store's seam for cluster mode (seam.py): seal, delete and index
callbacks, the listing of sealed shards with their files, durable copies of
delete logs, granted shard ids, and the write check. Unused, none of them
changes the store's behaviour."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from common.journal import FlusherConfig
from common.journal.errors import FormatError
from common.wire.errors import Unavailable
from shardmgr.errors import NoShardIds
from shardmgr.store.config import StoreConfig
from shardmgr.store.deletes import DeleteLog
from shardmgr.store.store import Store

DIM = 8
ROWS = 50  # 1,600 bytes of vectors: two batches fill a 4,096-byte shard, a third seals it


def batch(seed: int) -> tuple[np.ndarray, np.ndarray]:
    return np.random.default_rng(seed).random((ROWS, DIM), dtype=np.float32), np.arange(ROWS, dtype=np.int64) + seed


def opened(path: Path, *, granted: bool = False, idle_seal_s: float = 300.0) -> Store:
    store = Store(path, StoreConfig(seal_bytes=4096, extent_bytes=4096, idle_seal_s=idle_seal_s))
    store.shard_ids_granted = granted
    return store.open()


def test_seals_are_announced_and_sealed_shards_listed_with_their_files(tmp_path: Path) -> None:
    store = opened(tmp_path / "data", idle_seal_s=0.5)
    sealed: list[tuple[str, int]] = []
    store.on_sealed.append(lambda name, shard: sealed.append((name, shard)))
    try:
        store.create_collection("c", DIM)
        for seed in range(3):  # the third batch seals shard 1
            store.append("c", *batch(seed))
        assert sealed == [("c", 1)]
        deadline = time.monotonic() + 10
        while len(sealed) < 2 and time.monotonic() < deadline:  # the idle timer seals shard 2
            time.sleep(0.05)
        assert sealed == [("c", 1), ("c", 2)]
        store.delete("c", store.append("c", *batch(9))[:1])  # shard 3, growing: not listed
        store.delete("c", np.array([1 << 40], dtype=np.int64))  # shard 1 gets a delete log
        listed = store.seam.sealed_shards("c")
        assert [(s.shard_id, s.rows) for s in listed] == [(1, 2 * ROWS), (2, ROWS)]
        assert [name for name, _ in listed[0].files] == ["vectors", "ids", "journal", "deletes"]
        assert [name for name, _ in listed[1].files] == ["vectors", "ids", "journal"]
        assert all(path.is_file() and path.parent.name == f"{s.shard_id:08d}" for s in listed for _, path in s.files)
    finally:
        store.close()


def test_with_granted_ids_only_a_grant_lets_a_new_shard_start(tmp_path: Path) -> None:
    store = opened(tmp_path / "data", granted=True)
    try:
        store.create_collection("c", DIM)
        with pytest.raises(NoShardIds) as refused:
            store.append("c", *batch(0))
        assert isinstance(refused.value, Unavailable) and store.collection_info("c")["rows"] == 0
        assert store.seam.grant_shard_ids("c", 5, 7) == 5
        for seed in range(4):  # shards 5 and 6
            store.append("c", *batch(seed))
        assert store.seam.shard_ids("c") == (7, 7)
        with pytest.raises(NoShardIds):  # shard 6 is full and no id is left: nothing is written, 6 stays growing
            store.append("c", *batch(4))
        assert store.collection_info("c")["rows"] == 4 * ROWS \
            and [s.shard_id for s in store.seam.sealed_shards("c")] == [5]
        store.seam.grant_shard_ids("c", 0, 9)
        store.append("c", *batch(5))  # shard 7: the grant kept the next id
        store.seam.revoke_shard_ids("c")
        store.append("c", *batch(6))  # the growing shard still fills ...
        with pytest.raises(NoShardIds):
            store.append("c", *batch(7))  # ... but no new one starts
    finally:
        store.close()


def test_the_write_check_sees_creates_appends_and_deletes_and_may_refuse(tmp_path: Path) -> None:
    asked: list[tuple[str, ...]] = []

    class Gate:
        def creating(self, name: str, dim: int, metric: str, index: str) -> None:
            asked.append(("creating", name, str(dim), metric, index))

        def writing(self, name: str) -> None:
            asked.append(("writing", name))
            if name == "closed":
                raise Unavailable("not here")

        def written(self, name: str) -> None:
            asked.append(("written", name))

        def deleting(self, name: str, shards: frozenset[int] | None) -> None:
            asked.append(("deleting", name, "every" if shards is None else str(sorted(shards))))
            if refuse_deletes:
                raise Unavailable("shard not here")

        def deleted(self, name: str, refs: np.ndarray) -> None:
            asked.append(("deleted", name, str(sorted(refs.tolist()))))

    refuse_deletes = False
    store = opened(tmp_path / "data")
    store.gate = Gate()
    try:
        store.create_collection("c", DIM, "ip")
        store.create_collection("closed", DIM)
        refs = np.concatenate([store.append("c", *batch(seed)) for seed in range(3)])  # shard 1 sealed
        assert store.delete("c", refs[[0, 2 * ROWS]]) == 2
        assert store.delete_ids("c", np.array([0, 3], dtype=np.int64)) == 3  # id 0: row 0, deleted already
        with pytest.raises(Unavailable):
            store.append("closed", *batch(1))
        assert store.collection_info("closed")["rows"] == 0
        assert asked == [("creating", "c", "8", "ip", "flat"), ("creating", "closed", "8", "l2", "flat"),
                         *[("writing", "c"), ("written", "c")] * 3,
                         ("writing", "c"), ("deleting", "c", "[1, 2]"),
                         ("deleted", "c", str(sorted(refs[[0, 2 * ROWS]].tolist()))), ("written", "c"),
                         ("writing", "c"), ("deleting", "c", "every"),
                         ("deleted", "c", str(sorted(refs[[0, 3, ROWS + 2, 2 * ROWS + 1]].tolist()))),  # every row
                         ("written", "c"),
                         ("writing", "closed")]  # a refused write is not written
        refuse_deletes = True
        with pytest.raises(Unavailable):
            store.delete("c", refs[[5]])
        assert store.ids("c", refs[[5]]).tolist() == [5]  # refused before anything was written (a deleted row raises)
    finally:
        store.close()


def test_deletes_of_sealed_shards_are_announced_and_their_log_copied_durably(tmp_path: Path) -> None:
    # flushes only when asked: a delete is durable only once something waits for it
    store = Store(tmp_path / "data", StoreConfig(seal_bytes=4096, extent_bytes=4096),
                  flusher=FlusherConfig(interval=600.0)).open()
    deleted: list[tuple[str, int]] = []
    store.on_deleted.append(lambda name, shard: deleted.append((name, shard)))
    try:
        store.create_collection("c", DIM)
        refs = np.concatenate([store.append("c", *batch(seed)) for seed in range(3)])  # shard 1 sealed, 2 growing
        assert store.seam.copy_deletes("c", 1, tmp_path / "none") == 0 and not (tmp_path / "none").exists()
        store.delete("c", refs[[2 * ROWS]])  # the growing shard only: not announced
        assert deleted == []
        store.delete("c", refs[[0, 1, 2 * ROWS + 1]])
        store.delete("c", refs[[1]])  # deleted already: nothing new, not announced
        store.delete_ids("c", np.array([7], dtype=np.int64))  # rows 7 and 56 of shard 1, 5 of the growing shard 2
        assert deleted == [("c", 1), ("c", 1)]
        listed = store.seam.sealed_shard("c", 1)
        assert listed is not None and listed.deleted == 4 and listed.index_files == ()
        assert store.seam.sealed_shard("c", 2) is None  # growing
        shard = store.collection("c").shards[1]
        newest = shard.deletes.last
        assert newest is not None and not newest.durable
        assert store.seam.copy_deletes("c", 1, tmp_path / "copy") == 4
        assert newest.durable  # the copy holds nothing a crash could still undo
        with pytest.raises(FileExistsError):  # a new file only
            store.seam.copy_deletes("c", 1, tmp_path / "copy")
        with pytest.raises(ValueError, match="no sealed shard 2"):
            store.seam.copy_deletes("c", 2, tmp_path / "other")
        store.delete("c", refs[[3]])  # the live log grows; the copy does not
        copy_dir = tmp_path / "copied"
        copy_dir.mkdir()
        (tmp_path / "copy").rename(copy_dir / "deletes")
        copied = DeleteLog.open(copy_dir, 1, shard.uuid, shard.rows, None)  # what a query node would read
        assert copied.count == 4 and np.flatnonzero(copied.mask).tolist() == [0, 1, 7, 56]
        assert shard.deletes.count == 5
    finally:
        store.close()


def test_another_nodes_delete_log_of_a_shard_is_merged_into_this_ones(tmp_path: Path) -> None:
    """Two copies of one sealed shard, each with deletes the other lacks: a
    copy of one's log merged into the other deletes the union there, durably."""
    store = opened(tmp_path / "data")
    try:
        store.create_collection("c", DIM)
        refs = np.concatenate([store.append("c", *batch(seed)) for seed in range(3)])  # shard 1 sealed
        store.close()
        shutil.copytree(tmp_path / "data", tmp_path / "other")  # a second node's copy: the same shard and uuid
        store = opened(tmp_path / "data")
        store.delete("c", refs[[0, 1]])
        other = opened(tmp_path / "other")
        try:
            other.delete("c", refs[[1, 7]])
            (tmp_path / "theirs").mkdir()
            assert other.seam.copy_deletes("c", 1, tmp_path / "theirs" / "deletes") == 2
        finally:
            other.close()
        stranger = opened(tmp_path / "stranger")  # a shard 1 of another store: another uuid
        try:
            stranger.create_collection("c", DIM)
            stranger.delete("c", np.concatenate([stranger.append("c", *batch(seed)) for seed in range(3)])[[3]])
            (tmp_path / "wrong").mkdir()
            stranger.seam.copy_deletes("c", 1, tmp_path / "wrong" / "deletes")
        finally:
            stranger.close()
        with pytest.raises(FormatError, match="not of shard 1"):
            store.seam.merge_deletes("c", 1, tmp_path / "wrong")
        assert store.collection("c").shards[1].deletes.count == 2  # the refused merge deleted nothing
        assert store.seam.merge_deletes("c", 1, tmp_path / "theirs") == 1  # row 7; row 1 was deleted here already
        assert store.seam.merge_deletes("c", 1, tmp_path / "theirs") == 0
        with pytest.raises(ValueError, match="no sealed shard 2"):
            store.seam.merge_deletes("c", 2, tmp_path / "theirs")
        store.close()
        store = opened(tmp_path / "data")  # durable: a reopen keeps the union
        assert np.flatnonzero(store.collection("c").shards[1].deletes.mask).tolist() == [0, 1, 7]
    finally:
        store.close()


def test_a_built_index_is_announced_and_listed_with_the_shard(tmp_path: Path) -> None:
    store = opened(tmp_path / "data")
    indexed: list[tuple[str, int]] = []
    store.on_indexed.append(lambda name, shard: indexed.append((name, shard)))
    try:
        store.create_collection("h", DIM, index="hnsw")
        store.create_collection("f", DIM)
        for seed in range(3):  # shard 1 of each sealed
            store.append("h", *batch(seed))
            store.append("f", *batch(seed))
        store.wait_for_indexes(60)
        deadline = time.monotonic() + 10
        while not indexed and time.monotonic() < deadline:  # announced just after it is installed
            time.sleep(0.05)
        assert indexed == [("h", 1)]
        listed = store.seam.sealed_shard("h", 1)
        assert listed is not None and [name for name, _ in listed.index_files] == ["index.faiss", "index.meta"]
        assert all(path.is_file() for _, path in listed.index_files)
        assert store.seam.sealed_shards("f")[0].index_files == ()  # exact: no index
    finally:
        store.close()
    reopened = opened(tmp_path / "data")  # a loaded index is listed too (no announcement: nothing was built)
    try:
        listed = reopened.seam.sealed_shard("h", 1)
        assert listed is not None and len(listed.index_files) == 2
    finally:
        reopened.close()
