"""A full disk under the vector store: the append is refused with the
queue's code, ``disk_full``, and changes nothing; after space is freed, a
restart needs only what the next append needs, not a whole 64 MiB extent."""

from __future__ import annotations

import errno
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

import shardmgr
from common.journal import filesystem
from common.wire.errors import DiskFull, Full
from tests.shardmgr.small_disk import fill, small_disk

DIM = 256  # 1 KiB rows


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def test_enospc_is_disk_full_and_leaves_no_empty_shard(tmp_path: Path) -> None:
    store = shardmgr.open(tmp_path / "data", seal_bytes=64 * 1024, extent_bytes=4096)  # every append grows
    store.create_collection("c", DIM)
    kept = store.append("c", rows(10, 1), np.arange(10), durable=True)
    before = {k: store.collection_info("c")[k] for k in ("rows", "shards")}
    no_space = OSError(errno.ENOSPC, "No space left on device")
    for big in (10, 100):  # into the growing shard; into a new one (past seal_bytes)
        with mock.patch("shardmgr.store.rows.filesystem.grow", side_effect=no_space), \
                pytest.raises(DiskFull, match="the disk is full.*nothing was stored") as raised:
            store.append("c", rows(big, 2), np.arange(big))
        assert raised.value.code == "disk_full" and isinstance(raised.value, Full)
        assert isinstance(raised.value.__cause__, OSError)  # the cause is kept
        assert {k: store.collection_info("c")[k] for k in ("rows", "shards")} == before  # (the full shard sealed)
    assert sorted(p.name for p in (tmp_path / "data" / "shards" / "c").iterdir()) == ["00000001", "collection"]
    later = store.append("c", rows(3, 3), [10, 11, 12], durable=True)
    np.testing.assert_array_equal(store.ids("c", np.concatenate([kept, later])), np.arange(13))
    store.close()


def test_a_growth_the_disk_cannot_hold_is_cut_to_what_is_needed(tmp_path: Path) -> None:
    with open(tmp_path / "f", "wb+") as f:
        with mock.patch.object(filesystem, "free_bytes", return_value=5000):
            assert filesystem.grow(f.fileno(), 0, 64 << 20, "fallocate", at_least=5000) == 8192
            assert filesystem.grow(f.fileno(), 8192, 16384, "zero", at_least=9000) == 12288
        assert filesystem.grow(f.fileno(), 12288, 65536, "fallocate", at_least=13000) == 65536  # room: the extent
        assert filesystem.grow(f.fileno(), 65536, 1 << 20, "fallocate") == 1 << 20  # no at_least: as asked
        assert Path(f.name).stat().st_size == 1 << 20


def test_on_a_real_full_disk_appends_fail_cleanly_and_a_restart_needs_no_whole_extent(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 100) as disk:
        data = disk / "data"
        store = shardmgr.open(data)  # default 64 MiB extents
        store.create_collection("c", DIM)
        acked = [store.append("c", rows(1024, 0), np.arange(1024), durable=True)]
        fill(disk / "ballast", leave=1 << 20)
        with pytest.raises(DiskFull, match="nothing was stored"):
            for n in range(1, 200):  # 1 MiB batches until the disk is full
                acked.append(store.append("c", rows(1024, n), np.arange(1024) + 1024 * n, durable=True))
        assert len(acked) >= 32
        assert store.collection_info("c")["rows"] == 1024 * len(acked)
        store.close()
        (disk / "ballast").unlink()
        store = shardmgr.open(data)  # the growing shard is sealed on replay: the next append needs a new shard
        fill(disk / "ballast", leave=24 << 20)  # less than one 64 MiB extent
        more = store.append("c", rows(1, 999), [999], durable=True)
        np.testing.assert_array_equal(store.ids("c", more), [999])
        for n in (0, len(acked) - 1):
            np.testing.assert_array_equal(store.get("c", acked[n]), rows(1024, n))
        assert store.collection_info("c")["rows"] == 1024 * len(acked) + 1
        store.close()
