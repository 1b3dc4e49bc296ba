"""Soak (``pytest -m soak``): a writer node SIGKILLed and restarted at random
moments while clients append, for ``CLUSTER_SOAK_S`` seconds (default 60).
Kills land anywhere: mid-append, mid-upload, between upload and publish,
mid-sweep. Afterwards every sealed shard on its disk is published once,
with objects equal to its files; the bucket holds nothing else once swept;
and every append acknowledged durable is there."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

from common.errors import CommonError
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.objects import file_crc32c
from shardmgr.store.client import StoreClient
from tests.shardmgr.cluster.nodes import DIM, batches, bucket, node, objects_under, published, wait_for

SOAK_S = float(os.environ.get("CLUSTER_SOAK_S", "60"))


@pytest.mark.soak
@pytest.mark.timeout(SOAK_S + 240)
def test_a_writer_killed_at_random_keeps_every_sealed_shard_published_once(
        cluster_config: ClusterConfig, tmp_path: Path) -> None:
    rng = random.Random(14)
    n1 = node(tmp_path, "n1", cluster_config, sweep_interval_s=2.0)
    n1.start()
    try:
        with StoreClient(n1.address) as client:
            client.create_collection("c", dim=DIM)
        acked, kills, seed = 0, 0, 0
        until = time.monotonic() + SOAK_S
        while time.monotonic() < until:
            kill_at = time.monotonic() + rng.uniform(0.2, 2.5)
            try:
                with StoreClient(n1.address, retry_for=0, timeout=5) as client:
                    while time.monotonic() < kill_at:
                        vectors, ids = next(batches(1, seed=seed))
                        seed += 1
                        acked += len(client.append("c", vectors, ids, durable=True))
            except CommonError:  # unavailable while it rejoins, or the connection cut by the kill
                pass
            n1.signal(signal.SIGKILL)
            n1.wait()
            kills += 1
            n1.start()
        local = n1.data_dir / "shards" / "c"
        with StoreClient(n1.address) as client:  # the last kill's growing shard was sealed by the replay
            info = client.collection_info("c")["here"]  # its own data directory
        assert info["growing"] == 0 and info["rows"] >= acked
        shard_ids = {int(p.name) for p in local.iterdir() if p.name.isdigit()}
        assert len(shard_ids) == info["shards"]
        entries = wait_for("every shard published", lambda: (lambda e: e if set(e) == shard_ids else None)(
            published(cluster_config, "c")), timeout=60)
        for shard_id, entry in entries.items():
            for obj in entry.objects:
                assert file_crc32c(local / f"{shard_id:08d}" / obj.name) == (obj.crc32c, obj.size)
        named = {o.key for e in entries.values() for o in e.objects}
        objects = bucket(cluster_config)
        wait_for("orphans swept", lambda: objects_under(objects, cluster_config, "c") == named, timeout=30)
        print(f"{kills} kills, {acked} rows acknowledged, {len(entries)} shards published")
        assert kills >= 5
    finally:
        n1.kill()
