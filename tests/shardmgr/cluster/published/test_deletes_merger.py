"""DeletesMerger's rules (deletes_merger.py), with a real store and the
session's SeaweedFS: which published logs are merged, which are skipped,
and which of this node's own shards are held back from serving meanwhile."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from common.journal.errors import FormatError
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.published.deletes_merger import DeletesMerger
from shardmgr.cluster.published.mirror import ClusterState
from shardmgr.cluster.state.extras import DeletesEntry
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.cluster.state.shard_map import ShardObject
from shardmgr.store import layout
from shardmgr.store.config import StoreConfig
from shardmgr.store.store import Store
from tests.shardmgr.cluster.nodes import bucket

DIM, ROWS = 8, 50


def opened(path: Path) -> Store:
    return Store(path, StoreConfig(seal_bytes=4096, extent_bytes=4096)).open()


def one_sealed_shard(path: Path) -> np.ndarray:
    """A store at ``path`` with collection "c" and its shard 1 sealed; its refs."""
    store = opened(path)
    try:
        store.create_collection("c", DIM)
        rng = np.random.default_rng(1)
        return np.concatenate([store.append("c", rng.random((ROWS, DIM), dtype=np.float32),
                                            np.arange(ROWS, dtype=np.int64)) for _ in range(3)])
    finally:
        store.close()


def published(objects: ObjectStore, config: ClusterConfig, store: Store, name: str, node: str) -> DeletesEntry:
    """Shard 1's delete log in ``store``, uploaded as ``node`` published it."""
    copy = store.data_dir.parent / f"{name}.deletes"
    deleted = store.seam.copy_deletes("c", 1, copy)
    info = objects.put_file(copy, config.object_key("c", "1", name))
    assert info.crc32c is not None
    return DeletesEntry("c", 1, ShardObject(layout.DELETES, info.key, info.size, info.crc32c), deleted, node, 1)


def state(*entries: DeletesEntry) -> ClusterState:
    return ClusterState(1, {}, {}, {}, {}, {}, deletes={"c": {e.shard_id: e for e in entries}})


def deleted_here(store: Store) -> list[int]:
    return np.flatnonzero(store.collection("c").shards[1].deletes.mask).tolist()


def test_other_nodes_logs_are_merged_once_own_ones_only_when_longer_or_before_a_publish(
        cluster_config: ClusterConfig, tmp_path: Path) -> None:
    refs = one_sealed_shard(tmp_path / "here")
    shutil.copytree(tmp_path / "here", tmp_path / "there")  # another node's copy of the same shard
    objects = bucket(cluster_config)
    here, there = opened(tmp_path / "here"), opened(tmp_path / "there")
    try:
        merger = DeletesMerger("n1", here, objects)
        here.delete("c", refs[[0]])
        there.delete("c", refs[[1, 2]])
        theirs = published(objects, cluster_config, there, "theirs", "n2")
        assert merger.behind(state(theirs)) == {("c", 1)}  # not served from here until merged
        assert merger.merge(theirs) == 2 and deleted_here(here) == [0, 1, 2]
        assert merger.behind(state(theirs)) == set() and merger.merge(theirs) == 0  # once

        there.delete("c", refs[[3, 7]])  # as if n1 had published these and its directory were restored after
        own_longer = published(objects, cluster_config, there, "own-longer", "n1")  # 4 rows; 3 here
        assert merger.behind(state(own_longer)) == set()  # its own log: served meanwhile
        assert merger.merge(own_longer) == 2 and deleted_here(here) == [0, 1, 2, 3, 7]
        here.delete("c", refs[[4, 5]])
        there.delete("c", refs[[6]])
        own_shorter = published(objects, cluster_config, there, "own-shorter", "n1")  # 5 rows; 7 here
        assert merger.merge(own_shorter) == 0 and 6 not in deleted_here(here)  # its own and shorter: skipped
        assert merger.merge(own_shorter, always=True) == 1 and 6 in deleted_here(here)  # before a publish: merged

        strange = strangers_log(tmp_path / "stranger", objects, cluster_config)
        with pytest.raises(FormatError, match="not of shard 1"):
            merger.merge(strange)
        assert merger.merge(strange) == 0  # not fetched again
        assert deleted_here(here) == [0, 1, 2, 3, 4, 5, 6, 7]
    finally:
        here.close()
        there.close()


def strangers_log(path: Path, objects: ObjectStore, config: ClusterConfig) -> DeletesEntry:
    """A log of another store's shard 1 (another uuid), published by n3."""
    refs = one_sealed_shard(path)
    store = opened(path)
    try:
        store.delete("c", refs[[9]])
        return published(objects, config, store, "stranger", "n3")
    finally:
        store.close()
