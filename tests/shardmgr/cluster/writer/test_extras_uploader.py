"""The uploaders of one node in one process, against real etcd and
SeaweedFS (uploader.py, extras_uploader.py): a shard publish whose answer
was lost is not uploaded again (its delete log copy would differ from the
one its entry names); a log in an entry of unknown rows is published once
more as a deletes key; a stale tenure's deletes publish steps the node down
and changes nothing, and the node then knows it holds a delete to publish
(it campaigns for the collection)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.errors import CoordinationUnavailable
from shardmgr.cluster.state.election import Election, Writer
from shardmgr.cluster.state.extras import ShardExtras
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.shard_map import ShardMap
from shardmgr.cluster.writer.extras_uploader import ExtrasUploader
from shardmgr.cluster.writer.uploader import Uploader
from shardmgr.store.config import StoreConfig
from shardmgr.store.store import Store
from tests.shardmgr.cluster.nodes import batches, bucket

NODE = NodeConfig(upload_retry_min_s=0.05, upload_retry_max_s=0.05)


def test_a_lost_publish_answer_a_log_of_unknown_rows_and_a_stale_tenure(
        cluster_config: ClusterConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lease = NodeLease(cluster_config, name="n").start()
    store = Store(tmp_path / "n", StoreConfig(seal_bytes=4096, extent_bytes=4096))
    store.shard_ids_granted = True
    store.open()
    objects, stop, fenced = bucket(cluster_config), threading.Event(), []
    uploader = Uploader(cluster_config, NODE, store, objects, lambda *why: fenced.append(why))
    extras = ExtrasUploader(cluster_config, NODE, store, objects, uploader, lambda *why: fenced.append(why),
                            lambda: None)
    try:
        election, shards = Election(cluster_config, "c"), ShardMap(cluster_config, "c")
        token = election.campaign("n", lease, timeout_s=2)
        assert token is not None
        store.create_collection("c", 8)
        store.seam.grant_shard_ids("c", *shards.reserve_ids(token, 1, 4))
        refs = np.concatenate([store.append("c", *batch) for batch in batches(3)])  # shard 1 sealed
        store.delete("c", refs[:1])

        publish = ShardMap.publish

        def answer_lost(self: ShardMap, token: Writer, entry: Any) -> int:
            monkeypatch.setattr(ShardMap, "publish", publish)  # once
            publish(self, token, entry)
            raise CoordinationUnavailable("etcd: the answer was lost")

        monkeypatch.setattr(ShardMap, "publish", answer_lost)
        uploader.run_once({"c": token}, stop)
        assert uploader.counters["uploads_failed_total"] == 1 and uploader.published("c") == set()
        uploaded = uploader.counters["objects_uploaded_total"]
        store.delete("c", refs[1:2])  # the log grows: a new copy would differ from the published one
        time.sleep(0.1)
        uploader.run_once({"c": token}, stop)
        assert uploader.published("c") == {1} and uploader.counters["objects_uploaded_total"] == uploaded
        entry = shards.get(1)
        assert entry is not None
        in_entry = next(o for o in entry.objects if o.name == "deletes")
        objects.fetch(in_entry.key, tmp_path / "deletes", size=in_entry.size, crc=in_entry.crc32c)  # unchanged

        extras.run_once({"c": token}, stop)  # the entry's log holds an unknown number of rows: published again
        published = ShardExtras(cluster_config).deletes("c")
        assert list(published) == [1] and published[1].deleted == 2 and extras.counters["deletes_published_total"] == 1
        assert not extras.unpublished("c")  # nothing here for a node to campaign for

        assert election.resign(token)
        later = election.campaign("m", lease, timeout_s=2)
        assert later is not None
        store.delete("c", refs[2:3])
        extras.run_once({"c": token}, stop)
        assert [(name, why[:8]) for name, _, why in fenced] == [("c", "fenced: ")]
        assert extras.counters["extras_fenced_total"] == 1 and ShardExtras(cluster_config).deletes("c") == published
        assert extras.unpublished("c")  # the third delete is here only: the node campaigns to publish it
    finally:
        extras.close()
        uploader.close()
        store.close()
        lease.close()
