"""The catalog against real etcd: create is idempotent across nodes, a
conflicting create is refused naming both, and a watch sees new collections."""

from __future__ import annotations

import queue

import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.catalog import Catalog, CollectionMeta
from shardmgr.errors import CollectionConflict


def test_one_creator_wins_same_parameters_agree_and_others_are_refused(etcd_config: ClusterConfig) -> None:
    here, there = Catalog(etcd_config), Catalog(etcd_config)  # two nodes' clients
    seen: queue.Queue[CollectionMeta] = queue.Queue()
    known, revision = here.read()
    assert known == {}
    watch = there.watch(seen.put, start_revision=revision)
    try:
        docs = CollectionMeta("docs", 8, "l2", "flat")
        assert here.publish(docs) is True
        assert there.publish(docs) is False  # idempotent: no error, not a second creation
        with pytest.raises(CollectionConflict, match="dim 8, metric l2.*asked for dim 16"):
            there.publish(CollectionMeta("docs", 16, "l2", "flat"))
        assert there.get("docs") == docs and there.get("other") is None
        assert seen.get(timeout=5) == docs and seen.empty()  # one creation, seen once
        assert here.read()[0] == {"docs": docs}
    finally:
        watch.stop()
