"""``shardmgr serve --cluster``: real server processes on the session's etcd
and SeaweedFS (docs/cluster.md, "A node in a cluster").

- A writer's sealed shards are uploaded, checked and published; their
  objects match the files on its disk byte for byte (crc32c). A second node
  knows the collection, refuses an append already forwarded once naming the
  writer's address (test_forwarding.py tests the forwarding), and a clean
  stop leaves membership at once.
- An object store down for a while: appends go on, uploads are retried
  and succeed once it is back.
- A writer SIGKILLed between the uploads of a shard and its publish: after a
  restart the shard is published exactly once (under the new tenure) and
  the objects the first attempt left are swept. (In the hook tests the idle
  timer seals the shard, so no client is waiting for a reply when it fires.)
- A writer SIGSTOPped past its lease, just before a publish: another node
  takes the role and publishes; the old one, resumed, is refused by the
  fence, steps down, and then forwards appends to the new writer.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from common.wire.client import RpcClient
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import CoordinationUnavailable, WriterElsewhere, WriterUnreachable
from shardmgr.cluster.state.catalog import Catalog, CollectionMeta
from shardmgr.cluster.state.election import Election
from shardmgr.cluster.state.membership import Membership
from shardmgr.cluster.state.objects import file_crc32c
from shardmgr.errors import CollectionConflict
from shardmgr.store.client import StoreClient
from tests.cluster_servers import WeedServer
from tests.shardmgr.cluster.nodes import (
    DIM,
    ROWS,
    batches,
    bucket,
    node,
    objects_under,
    process_state,
    published,
    wait_for,
)
from tests.shardmgr.server.serverproc import ServerProcess


def members(config: ClusterConfig) -> dict[str, str]:
    return {m.node_id: m.address for m in Membership(config).members()[0]}


def test_sealed_shards_are_published_with_matching_objects_and_other_nodes_refuse_appends(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    n1 = node(tmp_path, "n1", cluster_config)
    started.append(n1.start())
    assert members(cluster_config) == {"n1": n1.address}
    with StoreClient(n1.address) as client:
        client.create_collection("c", dim=DIM)
        for vectors, ids in batches(7):
            client.append("c", vectors, ids, durable=True)
    # two batches fill a shard: 1, 2, 3 sealed, 4 growing
    entries = wait_for("shards 1-3 published", lambda: (lambda e: e if len(e) == 3 else None)(
        published(cluster_config, "c")))
    assert sorted(entries) == [1, 2, 3]
    objects = bucket(cluster_config)
    for shard_id, entry in entries.items():
        assert (entry.rows, entry.writer) == (2 * ROWS, "n1")
        assert {o.name for o in entry.objects} == {"vectors", "ids", "journal"}
        for obj in entry.objects:
            local = n1.data_dir / "shards" / "c" / f"{shard_id:08d}" / obj.name
            assert file_crc32c(local) == (obj.crc32c, obj.size)  # the entry names the local bytes ...
            head = objects.head(obj.key)
            assert head is not None and (head.crc32c, head.size) == (obj.crc32c, obj.size)
            fetched = tmp_path / "fetched"
            objects.fetch(obj.key, fetched, size=obj.size, crc=obj.crc32c)  # ... and so do the stored ones
            assert fetched.read_bytes() == local.read_bytes()
    assert sum(e.rows for e in entries.values()) == 6 * ROWS

    def counted() -> bool:  # an entry is in etcd an instant before the node's thread counts it
        with RpcClient(n1.address) as rpc:
            stats = rpc.call("stats").result["cluster"]
        return (stats["member"], stats["writer_roles"], stats["shards_published_total"]) == (1, 1, 3)

    wait_for("n1 to count itself a member, the writer of c, with 3 shards published", counted, timeout=5)
    assert Catalog(cluster_config).get("c") == CollectionMeta("c", DIM, "l2", "flat")

    n2 = node(tmp_path, "n2", cluster_config)
    started.append(n2.start())
    with StoreClient(n2.address) as other:
        assert "c" in other.collections()
        assert other.create_collection("c", dim=DIM)["dim"] == DIM  # idempotent across nodes
        with pytest.raises(CollectionConflict, match="dim 8"):
            other.create_collection("c", dim=DIM + 1)
        vectors, ids = next(batches(1, seed=99))
        with pytest.raises(WriterElsewhere) as refused:  # a forwarded request is not forwarded again
            other.rpc.call("shardmgr.append", {"name": "c", "forwarded": True}, {"vectors": vectors, "ids": ids})
        assert refused.value.code == "shardmgr.cluster.writer_elsewhere"
        assert refused.value.address == n1.address
        assert "node n1" in str(refused.value)
        assert other.collection_info("c")["here"]["rows"] == 0  # nothing was written there
    assert members(cluster_config) == {"n1": n1.address, "n2": n2.address}

    n2.signal(signal.SIGTERM)  # a clean stop leaves at once, not after the lease's TTL
    assert n2.wait() == 0
    assert members(cluster_config) == {"n1": n1.address}
    n1.signal(signal.SIGTERM)
    assert n1.wait() == 0
    assert members(cluster_config) == {} and Election(cluster_config, "c").current() is None
    assert sorted(published(cluster_config, "c")) == [1, 2, 3, 4]  # the clean stop sealed and published shard 4


def test_uploads_wait_out_an_object_store_outage_and_appends_go_on_meanwhile(
        cluster_config: ClusterConfig, weed: WeedServer, tmp_path: Path, started: list[ServerProcess]) -> None:
    n1 = node(tmp_path, "n1", cluster_config)
    started.append(n1.start())
    with StoreClient(n1.address) as client:
        client.create_collection("c", dim=DIM)
        weed.kill()  # S3 is gone: uploads fail, appends must not notice
        try:
            for vectors, ids in batches(5):  # seals shards 1 and 2
                client.append("c", vectors, ids, durable=True)
            n1.wait_log_count(r"uploading shard \d+ of c failed \(retried in", 2)
            assert published(cluster_config, "c") == {}
        finally:
            weed.restart()
        entries = wait_for("shards 1 and 2 published after the outage", lambda: (lambda e: e if len(e) == 2 else None)(
            published(cluster_config, "c")))
        assert sorted(entries) == [1, 2] and client.collection_info("c")["here"]["rows"] == 5 * ROWS


def test_a_writer_killed_between_upload_and_publish_publishes_once_after_restart_and_the_orphans_go(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    n1 = node(tmp_path, "n1", cluster_config, hook="before_publish:kill", idle_seal_s=1.0)
    started.append(n1.start())
    with StoreClient(n1.address) as client:
        client.create_collection("c", dim=DIM)
        for vectors, ids in batches(2):  # shard 1, sealed by the idle timer a second later
            client.append("c", vectors, ids, durable=True)
    assert n1.wait() == -signal.SIGKILL  # the hook: shard 1's objects are up, its entry is not
    objects = bucket(cluster_config)
    first_try = objects_under(objects, cluster_config, "c")
    assert {key.rsplit("/", 1)[1] for key in first_try} == {"vectors", "ids", "journal"}
    assert published(cluster_config, "c") == {}

    del n1.env["SHARDMGR_CLUSTER_TEST_HOOK"]
    n1.start()  # waits for its previous run's member key to expire, then campaigns to publish shard 1
    entries = wait_for("shard 1 published", lambda: published(cluster_config, "c"))
    assert list(entries) == [1] and entries[1].rows == 2 * ROWS and entries[1].writer == "n1"
    named = {o.key for o in entries[1].objects}
    assert len(named) == 3 and not named & first_try  # published once, under the new tenure's own path
    wait_for("the first attempt's objects swept", lambda: objects_under(objects, cluster_config, "c") == named)
    n1.wait_log("swept orphan object")
    with StoreClient(n1.address) as client:  # nothing acknowledged was lost, and appends go on
        assert client.collection_info("c")["here"]["rows"] == 2 * ROWS
        vectors, ids = next(batches(1, seed=500))
        assert len(client.append("c", vectors, ids)) == ROWS
    assert list(published(cluster_config, "c")) == [1]


def test_a_writer_paused_past_its_lease_is_fenced_out_and_steps_down(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    n1 = node(tmp_path, "n1", cluster_config, hook="before_publish:stop", idle_seal_s=1.0)
    n2 = node(tmp_path, "n2", cluster_config)
    started.extend([n1.start(), n2.start()])
    with StoreClient(n1.address) as client:
        client.create_collection("c", dim=DIM)
        for vectors, ids in batches(2):  # shard 1; once idle it is sealed, uploaded, and n1 stops before publishing
            client.append("c", vectors, ids, durable=True)
    assert n1.proc is not None
    wait_for("n1 stopped by its hook", lambda: process_state(n1.proc.pid) == "T" if n1.proc else None)

    def appended_on_n2() -> bool:
        with StoreClient(n2.address) as other:
            try:
                for vectors, ids in batches(3, seed=1000):  # seals a shard of n2's
                    other.append("c", vectors, ids, durable=True)
            except WriterUnreachable as e:  # n1's key lives until its lease's TTL has passed; n2 forwards to it
                assert e.address in (n1.address, None)  # None: its member key went an instant before
                return False
        return True

    wait_for("n2 to take the writer role", appended_on_n2, timeout=10, every=0.25)
    writer = Election(cluster_config, "c").current()
    assert writer is not None and writer.node_id == "n2"
    entries = wait_for("n2's sealed shard published", lambda: published(cluster_config, "c"))
    assert {e.writer for e in entries.values()} == {"n2"} and min(entries) >= 5  # ids n1 never reserved

    n1.signal(signal.SIGCONT)  # wakes just before its publish, still believing it writes "c"
    n1.wait_log("refused by the fence")
    n1.wait_log("stepped down as writer of c")
    assert {e.writer for e in published(cluster_config, "c").values()} == {"n2"}

    vectors, ids = next(batches(1, seed=2000))

    def refused_by_n1() -> str | None:
        with RpcClient(n1.address) as rpc:  # marked as forwarded once: n1 must refuse it, not write it
            try:
                rpc.call("shardmgr.append", {"name": "c", "forwarded": True}, {"vectors": vectors, "ids": ids})
            except CoordinationUnavailable:  # rejoining with a new lease
                return None
            except WriterElsewhere as e:
                return e.address
        raise AssertionError("n1 appended although n2 writes c")

    assert wait_for("n1 to refuse appends naming n2", refused_by_n1) == n2.address
    assert members(cluster_config) == {"n1": n1.address, "n2": n2.address}
    with StoreClient(n1.address) as client:  # a plain append is forwarded to n2; n1's unpublished shard stays
        refs = client.append("c", vectors, ids)
        assert client.collection_info("c")["here"]["rows"] == 2 * ROWS
    with StoreClient(n2.address) as other:
        assert other.ids("c", refs).tolist() == ids.tolist() and other.collection_info("c")["here"]["rows"] == 4 * ROWS
