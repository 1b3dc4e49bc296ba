"""Soak (``pytest -m soak``): nodes that keep winning, publishing, pausing and
resigning, against a real etcd. Whatever the interleaving, no shard is ever
published under a tenure that had already been replaced."""

from __future__ import annotations

import os
import random
import threading
import time

import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import CoordinationError, LeaseLost, NotWriter, ShardConflict
from shardmgr.cluster.state.election import Election, Writer
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.shard_map import ShardEntry, ShardMap

SOAK_S = float(os.environ.get("CLUSTER_SOAK_S", "60"))


def publish_next(shards: ShardMap, token: Writer) -> bool:
    """Publish the next shard id under ``token``; False if refused as not the writer."""
    published, _ = shards.read()
    try:
        shards.publish(token, ShardEntry("docs", max(published, default=0) + 1, 10, ()))
    except NotWriter:
        return False
    except ShardConflict:  # another tenure took that id between our read and publish
        pass
    return True


def node(config: ClusterConfig, name: str, until: float, tenures: list[Writer], refused: list[int]) -> None:
    """Campaign, publish a few shards, then either resign or be paused past
    the TTL (keepalives stopped) and, on waking, go on publishing as if
    still the writer."""
    rng = random.Random(name)
    election, shards = Election(config, "docs"), ShardMap(config, "docs")
    while time.monotonic() < until:
        lease = NodeLease(config, name=name).start()
        try:
            token = election.campaign(name, lease, timeout_s=min(5.0, max(until - time.monotonic(), 0.0)))
            if token is None:
                continue
            tenures.append(token)
            for _ in range(rng.randint(1, 8)):
                publish_next(shards, token)
                time.sleep(rng.random() * 0.2)
            if rng.random() < 0.5:
                election.resign(token)
                continue
            lease.stop_keepalive()  # paused: the lease runs out and another node takes over
            time.sleep(lease.ttl_s + rng.random() * 1.5)
            for _ in range(3):  # woken up, unaware: every one of these must be refused once replaced
                if not publish_next(shards, token):
                    refused.append(1)
                    break
        except (LeaseLost, CoordinationError):
            pass
        finally:
            lease.close()


@pytest.mark.soak
def test_no_shard_is_ever_published_by_a_replaced_writer(etcd_config: ClusterConfig) -> None:
    tenures: list[Writer] = []
    refused: list[int] = []
    until = time.monotonic() + SOAK_S
    threads = [threading.Thread(target=node, args=(etcd_config, f"node-{i}", until, tenures, refused))
               for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=SOAK_S + 60)
    assert not any(t.is_alive() for t in threads)
    starts = sorted(w.revision for w in tenures)
    entries, _ = Kv(etcd_config).get_prefix(ShardMap(etcd_config, "docs").prefix)
    for e in entries:
        entry = ShardEntry.decode(e.value)
        later = [r for r in starts if entry.writer_revision < r < e.mod_revision]
        assert later == [], f"shard {entry.shard_id} published at {e.mod_revision} under tenure " \
                            f"{entry.writer_revision}, after tenure {later[0]} began"
    # and the run did what it is for: many tenures, many shards, stale writers that tried
    assert len(entries) > 10 and len(starts) > 5 and refused, (len(entries), len(starts), len(refused))
