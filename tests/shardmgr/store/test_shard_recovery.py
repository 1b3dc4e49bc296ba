"""Shards after crashes and damage: torn tails, a journal ahead of or behind
its row files, power cuts, quarantine, O(1) opens of sealed shards."""

from __future__ import annotations

import dataclasses
import errno
import os
import random
import shutil
from pathlib import Path
from unittest import mock

import msgpack
import numpy as np
import pytest

import shardmgr
from common.journal import Flusher, FormatError, Journal, JournalConfig
from common.journal.header import HEADER_SIZE, METADATA_END, Identity
from common.journal.testing import PowerCut
from shardmgr.errors import DiskFull, UnknownRef
from shardmgr.store.batch_record import V1, V1_RECORD, V2, last_batch, pack
from shardmgr.store.shard import Shard


def rows_of(n: int, dim: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def shard_dir(data: Path, collection: str = "c", shard: int = 1) -> Path:
    return data / "shards" / collection / f"{shard:08d}"


def test_journal_ahead_of_its_rows_drops_the_unconfirmed_batch(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = shardmgr.open(data)
    store.create_collection("c", 8)
    a = rows_of(100, 8, 1)
    kept = store.append("c", a, np.arange(100), durable=True)
    store.flush()
    journal = shard_dir(data) / "journal"
    header_when_a_was_durable = journal.read_bytes()[:HEADER_SIZE]
    store.append("c", rows_of(50, 8, 2), np.arange(100, 150), durable=True)
    store.close()
    with open(journal, "r+b") as f:  # as if the crash came before the flush that covered the second batch
        f.write(header_when_a_was_durable)
    os.truncate(shard_dir(data) / "vectors", 4096 + 120 * 32)  # ... and only part of its rows reached the disk
    store = shardmgr.open(data)
    info = store.collection_info("c")
    assert info["rows"] == 100 and not info["quarantined"]
    np.testing.assert_array_equal(store.get("c", kept), a)
    with pytest.raises(UnknownRef):
        store.get("c", [kept[-1] + 1])
    store.close()


def test_row_files_longer_than_the_journal_are_cut(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = shardmgr.open(data)
    store.create_collection("c", 8)
    refs = store.append("c", rows_of(10, 8, 1), np.arange(10), durable=True)
    store.close()
    for name, extra in (("vectors", 7 * 32 + 5), ("ids", 3 * 8)):
        with open(shard_dir(data) / name, "ab") as f:
            f.write(os.urandom(extra))  # rows written, batch record never made it
    with open(shard_dir(data) / "journal", "ab") as f:
        f.write(os.urandom(100))  # and a torn journal tail
    store = shardmgr.open(data)
    assert store.collection_info("c")["rows"] == 10
    assert os.path.getsize(shard_dir(data) / "vectors") == 4096 + 10 * 32
    np.testing.assert_array_equal(store.ids("c", refs), np.arange(10))
    store.close()


def test_a_damaged_sealed_shard_is_quarantined_and_the_rest_served(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = shardmgr.open(data, seal_bytes=4096)
    store.create_collection("c", 8)
    first = store.append("c", rows_of(200, 8, 1), np.arange(200), durable=True)  # fills shard 1
    second = store.append("c", rows_of(20, 8, 2), np.arange(200, 220), durable=True)  # seals it, shard 2
    store.close()
    os.truncate(shard_dir(data, shard=1) / "vectors", 4096 + 199 * 32)  # a sealed shard lost its last vector
    store = shardmgr.open(data, seal_bytes=4096)
    info = store.collection_info("c")
    assert len(info["quarantined"]) == 1 and "vectors has" in info["quarantined"][0]
    assert info["rows"] == 20 and store.stats()["quarantined_shards"] == 1
    assert list((data / "shards" / "c" / "quarantine").iterdir())  # moved aside, not deleted
    np.testing.assert_array_equal(store.ids("c", second), np.arange(200, 220))
    with pytest.raises(UnknownRef):
        store.get("c", first[:1])
    assert (store.append("c", rows_of(1, 8, 3), [9]) >> 40)[0] == 2  # closed cleanly: shard 2 keeps growing
    moved = data / "shards" / "c" / "quarantine"
    assert not [p for p in Path("/proc/self/fd").iterdir() if str(moved) in os.path.realpath(p)]  # nothing held
    store.close()
    store = shardmgr.open(data, seal_bytes=4096)  # still reported after another restart
    assert store.collection_info("c")["quarantined"] == info["quarantined"]
    assert store.stats()["quarantined_shards"] == 1
    store.close()


@pytest.mark.parametrize("lost", [1, 100, 128], ids=["last_id", "a_batch_and_part_of_another", "every_id"])
def test_a_sealed_shard_that_lost_ids_gets_them_back_from_its_journal(tmp_path: Path, lost: int) -> None:
    """The ids file is derived data (the batch records carry the ids): a
    short one is rewritten from the journal at the open, not quarantined."""
    data = tmp_path / "data"
    store = shardmgr.open(data, seal_bytes=4096)
    store.create_collection("c", 8)
    first = store.append("c", rows_of(50, 8, 1), np.arange(50) * 7, durable=True)
    first = np.concatenate([first, store.append("c", rows_of(78, 8, 2), np.arange(50, 128) * 7, durable=True)])
    store.append("c", rows_of(20, 8, 3), np.arange(200, 220), durable=True)  # seals shard 1 (128 rows)
    store.close()
    ids_file = shard_dir(data, shard=1) / "ids"
    os.truncate(ids_file, 4096 + (128 - lost) * 8)
    store = shardmgr.open(data, seal_bytes=4096)
    assert store.collection_info("c")["quarantined"] == []
    np.testing.assert_array_equal(store.ids("c", first), np.arange(128) * 7)
    store.close()
    assert os.path.getsize(ids_file) == 4096 + 128 * 8
    assert shardmgr.verify(data, deep=True).exit_code == 0


def test_errors_of_the_moment_never_quarantine_a_healthy_shard(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = shardmgr.open(data, seal_bytes=4096)
    store.create_collection("c", 8)
    refs = store.append("c", rows_of(300, 8, 1), np.arange(300), durable=True)
    store.close()
    too_many = OSError(errno.EMFILE, "Too many open files")
    with mock.patch("shardmgr.store.rows.RowFile.open", side_effect=too_many), \
            pytest.raises(OSError, match="open files"):
        shardmgr.open(data, seal_bytes=4096)
    assert not (data / "shards" / "c" / "quarantine").exists()
    store = shardmgr.open(data, seal_bytes=4096)
    np.testing.assert_array_equal(store.ids("c", refs), np.arange(300))
    store.close()


def test_a_failed_shard_creation_leaves_nothing_and_blocks_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = shardmgr.open(data, seal_bytes=4096)
    store.create_collection("c", 8)
    first = store.append("c", rows_of(200, 8, 1), np.arange(200), durable=True)
    full = OSError(errno.ENOSPC, "No space left on device")
    with mock.patch("shardmgr.store.shard.Journal.write_empty", side_effect=full), \
            pytest.raises(DiskFull, match="nothing was stored"):
        store.append("c", rows_of(1, 8, 2), [200])  # needs a new shard
    assert not list((data / "shards" / "c").glob("*.tmp"))
    later = store.append("c", rows_of(1, 8, 3), [201], durable=True)  # the next attempt works
    store.close()
    store = shardmgr.open(data, seal_bytes=4096)
    np.testing.assert_array_equal(store.ids("c", np.concatenate([first, later])), np.arange(202)[[*range(200), 201]])
    assert store.collection_info("c")["quarantined"] == []
    store.close()


def test_a_failed_mapping_fails_the_append_and_commits_nothing(tmp_path: Path) -> None:
    import mmap as mmap_module

    data = tmp_path / "data"
    store = shardmgr.open(data, extent_bytes=4096)
    store.create_collection("c", 8)
    store.append("c", rows_of(10, 8, 1), np.arange(10))
    real = mmap_module.mmap
    with mock.patch("shardmgr.store.rows.mmap.mmap", side_effect=[OSError(errno.ENOMEM, "Cannot allocate memory")]):
        with pytest.raises(OSError):
            store.append("c", rows_of(1000, 8, 2), np.arange(10, 1010))  # must grow and remap
    assert mmap_module.mmap is real and store.collection_info("c")["rows"] == 10
    refs = store.append("c", rows_of(1000, 8, 3), np.arange(10, 1010), durable=True)
    np.testing.assert_array_equal(store.get("c", refs), rows_of(1000, 8, 3))
    store.close()
    store = shardmgr.open(data)
    assert store.collection_info("c")["rows"] == 1010
    store.close()


def test_sealed_shards_open_without_replay(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = shardmgr.open(data, seal_bytes=4096)
    store.create_collection("c", 8)
    for i in range(5):
        store.append("c", rows_of(130, 8, i), np.arange(130))
    store.close()  # the last shard is mid-build: every open replays it (only it), and it keeps growing
    replay = Shard._replay

    def growing_only(directory: Path, shard_id: int, dim: int) -> tuple[int, int | None]:
        assert shard_id == 5, f"replayed the sealed shard {shard_id}"
        return replay(directory, shard_id, dim)

    with mock.patch.object(Shard, "_replay", side_effect=growing_only) as replayed:
        store = shardmgr.open(data, seal_bytes=4096)
    assert replayed.call_count == 1
    assert store.collection_info("c")["rows"] == 650
    store.close()


@pytest.mark.parametrize("seed", range(6))
def test_power_cut_keeps_every_confirmed_row(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    data = tmp_path / "data"
    confirmed: dict[int, tuple[np.ndarray, int]] = {}
    for life in range(3):
        (data / "shards").mkdir(parents=True, exist_ok=True)
        with PowerCut(data, seed=seed * 7 + life) as cut:
            store = shardmgr.open(data, seal_bytes=rng.choice([8192, 1 << 20]), extent_bytes=65536)
            store.create_collection("c", 16)
            for step in range(rng.randint(3, 25)):
                n = rng.randint(1, 60)
                vectors = rows_of(n, 16, seed * 1000 + life * 100 + step)
                ids = np.arange(n) + step * 1000
                durable = rng.random() < 0.6
                refs = store.append("c", vectors, ids, durable=durable)
                if durable:
                    confirmed.update((int(r), (v, int(i))) for r, v, i in zip(refs, vectors, ids))
            store.abandon()
            cut.crash()
    store = shardmgr.open(data)
    refs = np.array(sorted(confirmed), dtype=np.int64)
    if len(refs):
        vectors = np.stack([confirmed[int(r)][0] for r in refs])
        np.testing.assert_array_equal(store.get("c", refs), vectors)
        np.testing.assert_array_equal(store.ids("c", refs), [confirmed[int(r)][1] for r in refs])
        _, _, nearest = store.search("c", vectors, k=1)
        assert (nearest[:, 0] == refs).all(), "a confirmed row is not its own nearest neighbour"
    store.close()
    shutil.rmtree(data)


def two_shards(data: Path) -> None:
    """Collection "c": shard 1 sealed, shard 2 mid-build (replayed by the next open)."""
    store = shardmgr.open(data, seal_bytes=4096)
    store.create_collection("c", 8)
    store.append("c", rows_of(200, 8, 1), np.arange(200), durable=True)
    store.append("c", rows_of(20, 8, 2), np.arange(200, 220), durable=True)
    store.close()


@pytest.mark.parametrize("target, error", [
    ("shardmgr.store.shard.check_meta", TypeError("a bug, not damage")),
    ("shardmgr.store.shard_files.RowFile.open", KeyError("a bug, not damage")),
    ("shardmgr.store.replay.vectors_intact", ValueError("a bug, not damage")),
    ("shardmgr.store.replay.ids_intact", ValueError("a bug, not damage")),
])
def test_a_bug_during_open_propagates_and_quarantines_nothing(tmp_path: Path, target: str,
                                                             error: Exception) -> None:
    data = tmp_path / "data"
    two_shards(data)
    with mock.patch(target, side_effect=error), pytest.raises(type(error), match="a bug"):
        shardmgr.open(data, seal_bytes=4096)
    assert not (data / "shards" / "c" / "quarantine").exists()
    with shardmgr.open(data, seal_bytes=4096) as store:  # the bug gone, everything is served
        info = store.collection_info("c")
        assert info["rows"] == 220 and info["quarantined"] == []


def rewrite_metadata(journal: Path, metadata: bytes) -> None:
    """Give a journal other header metadata with a valid header checksum
    (damage the checksum cannot see), keeping its checkpoints."""
    with open(journal, "r+b") as f:
        header = f.read(HEADER_SIZE)
        identity = dataclasses.replace(Identity.decode(header, str(journal)), metadata=metadata)
        f.seek(0)
        f.write(identity.encode()[:METADATA_END])  # identity, checksum, metadata: the slots stay


@pytest.mark.parametrize("metadata, reason", [
    (b"\xc1", "metadata is not msgpack"),
    (msgpack.packb([1, 2]), "metadata is a msgpack list"),
    (msgpack.packb({"collection": "c", "shard": 1, "dim": 8}), "'uuid' is None"),
    (msgpack.packb({"collection": "c", "shard": 1, "dim": 8, "uuid": "not bytes"}), "'uuid' is 'not bytes'"),
    (msgpack.packb({"collection": "c", "shard": True, "dim": 8, "uuid": bytes(16)}), "'shard' is True"),
], ids=["not_msgpack", "a_list", "no_uuid", "uuid_not_bytes", "shard_a_bool"])
@pytest.mark.parametrize("shard", [1, 2])
def test_damaged_shard_metadata_is_quarantined(tmp_path: Path, metadata: bytes, reason: str, shard: int) -> None:
    data = tmp_path / "data"
    two_shards(data)
    rewrite_metadata(shard_dir(data, shard=shard) / "journal", metadata)
    with shardmgr.open(data, seal_bytes=4096) as store:
        [quarantined] = store.collection_info("c")["quarantined"]
        assert quarantined.startswith(f"{shard:08d}-") and reason in quarantined
        assert store.collection_info("c")["rows"] == (20 if shard == 1 else 200)


def test_a_record_that_is_not_a_batch_quarantines_a_mid_build_shard(tmp_path: Path) -> None:
    data = tmp_path / "data"
    two_shards(data)
    with Flusher() as flusher:  # a checksummed record of the wrong size: written, not torn
        with Journal.open(shard_dir(data, shard=2) / "journal", flusher=flusher) as journal:
            journal.append(b"not a batch")
    with shardmgr.open(data, seal_bytes=4096) as store:
        [quarantined] = store.collection_info("c")["quarantined"]
        assert quarantined.startswith("00000002-") and "is not a version 2 batch record" in quarantined


def test_damaged_collection_and_index_metadata_are_format_errors(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = shardmgr.open(data, seal_bytes=4096)
    store.create_collection("h", 8, index="hnsw")
    store.append("h", rows_of(200, 8, 1), np.arange(200))
    store.append("h", rows_of(1, 8, 2), [200])  # seals shard 1: its index is built
    store.wait_for_indexes(60)
    store.close()
    meta = shard_dir(data, "h") / "index.meta"
    rewrite_metadata(meta, b"\xc1")
    with shardmgr.open(data, seal_bytes=4096) as store:  # an index whose metadata is damaged is rebuilt
        store.wait_for_indexes(60)
        assert store.collection_info("h")["quarantined"] == []
    with Journal.open(meta, writable=False) as journal:
        assert msgpack.unpackb(journal.metadata)["rows"] == 200
    rewrite_metadata(data / "shards" / "h" / "collection", msgpack.packb(["h", 8]))
    with pytest.raises(FormatError, match="collection: at byte 64: metadata is a msgpack list"):
        shardmgr.open(data)  # the collection cannot be served at all (verify --repair moves it aside)


@pytest.mark.parametrize("alignment", [8, 64, 4096])
def test_last_version_1_record_of_a_sealed_journal_at_any_alignment(tmp_path: Path, alignment: int) -> None:
    batches = [V1_RECORD.pack(first, 10, first * 3, first * 5) for first in range(0, 50, 10)]
    with Flusher() as flusher:
        journal = Journal.create(tmp_path / "j", kind=b"SMSJ", flusher=flusher,
                                 config=JournalConfig(alignment=alignment))
        journal.append_batch(batches)
        journal.seal()
        journal.close()
    with Journal.open(tmp_path / "j", writable=False, recount=False) as journal:
        last = last_batch(journal, V1)
        assert last is not None and (last.first, last.count, last.vectors_crc, last.ids_crc) == (40, 10, 120, 200)


@pytest.mark.parametrize("sizes", [[1], [3, 1], [1, 1000, 7], [5000, 2]])
def test_last_version_2_record_is_found_from_the_journal_end(tmp_path: Path, sizes: list[int]) -> None:
    """Records of any length: the last one's trailer, which ends the journal, says where it starts."""
    firsts = np.cumsum([0, *sizes])
    with Flusher() as flusher:
        journal = Journal.create(tmp_path / "j", kind=b"SMSJ", flusher=flusher)
        for first, n in zip(firsts.tolist(), sizes):
            journal.append(pack(first, rows_of(n, 4, first), np.arange(first, first + n) * 3))
        journal.seal()
        journal.close()
    with Journal.open(tmp_path / "j", writable=False, recount=False) as journal:
        last = last_batch(journal, V2)
        assert last is not None and (last.first, last.count) == (int(firsts[-2]), sizes[-1])
        assert last.ids is not None and last.ids.tolist() == (np.arange(firsts[-2], firsts[-1]) * 3).tolist()
    with open(tmp_path / "j", "r+b") as f:  # a count in the last trailer that the journal cannot hold
        f.seek(os.path.getsize(tmp_path / "j") - 16)
        f.write((10**9).to_bytes(8, "little"))
    with Journal.open(tmp_path / "j", writable=False, recount=False) as journal, \
            pytest.raises(FormatError, match="more than the journal holds"):
        last_batch(journal, V2)
