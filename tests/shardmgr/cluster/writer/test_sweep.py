"""The orphan sweep against real etcd and SeaweedFS (sweep.py): it deletes
exactly the objects no entry names, of earlier tenures, older than the grace
period; and nothing once the sweeper's tenure is over."""

from __future__ import annotations

import time

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.election import Election
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.shard_map import ShardEntry, ShardMap, ShardObject
from shardmgr.cluster.writer.sweep import sweep_orphans
from tests.shardmgr.cluster.nodes import bucket, objects_under


def test_the_sweep_removes_only_unnamed_objects_of_ended_tenures_past_the_grace(
        cluster_config: ClusterConfig) -> None:
    objects, kv = bucket(cluster_config), Kv(cluster_config)
    lease = NodeLease(cluster_config, name="w").start()
    try:
        election, shards = Election(cluster_config, "c"), ShardMap(cluster_config, "c")
        old = election.campaign("old", lease, timeout_s=2)
        assert old is not None
        published = objects.put_bytes(shards.object_key(1, old, "vectors"), b"published")
        assert published.crc32c is not None
        shards.publish(old, ShardEntry("c", 1, 1, (ShardObject("vectors", published.key, published.size,
                                                               published.crc32c),)))
        orphan = objects.put_bytes(shards.object_key(2, old, "vectors"), b"never published").key
        assert election.resign(old)
        new = election.campaign("new", lease, timeout_s=2)
        assert new is not None
        mine = objects.put_bytes(shards.object_key(3, new, "vectors"), b"this tenure's, not yet published").key
        stray = objects.put_bytes(cluster_config.object_key("c", "shards", "junk"), b"?").key
        everything = {published.key, orphan, mine, stray}
        assert objects_under(objects, cluster_config, "c") == everything

        assert sweep_orphans(objects, shards, new, 3600.0, kv) == 0  # all younger than the grace period
        assert sweep_orphans(objects, shards, old, 0.0, kv) == 0  # not the writer: sweeps nothing
        time.sleep(1.1)  # S3 times have whole seconds
        assert sweep_orphans(objects, shards, new, 1.0, kv) == 2
        assert objects_under(objects, cluster_config, "c") == {published.key, mine}
    finally:
        lease.close()
        kv.close()
