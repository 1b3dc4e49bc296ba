"""The acknowledged deletes a node holds (shardmgr/cluster/published/acked_deletes.py)
with real ``shardmgr serve --cluster`` nodes, each reaching S3 through a
relay the test can cut (docs/cluster.md, "When a delete is seen"):

- while the writer cannot publish (its S3 cut), a query node holds more
  rows than ``max_batch_rows``: the nodes it asks still take them, and its
  search is complete and skips them (before, every node refused them:
  ``bad_vectors``, and the search was partial); at ``max_held_deletes`` its
  next delete is refused (``deletes_backlog``, retryable, nothing deleted),
  and once the writer publishes again the same delete goes through;
- the writer publishes a shard's deletes and is SIGKILLed before the only
  other copy installs them: the node that acknowledged the delete still
  skips the rows when its search is answered from that stale copy (before,
  it had dropped them when it saw the key published).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from common.wire.client import RpcClient
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import DeletesBacklog
from shardmgr.cluster.published.mirror import ClusterMirror, ClusterState
from shardmgr.cluster.published.placement import owners
from shardmgr.cluster.query.routing import shard_stale
from shardmgr.cluster.state.kv import Kv
from shardmgr.store.client import StoreClient
from shardmgr.store.refs import ref_of
from tests.cluster_servers import WeedServer
from tests.shardmgr.cluster.nodes import DIM, batches, node, published, served_by_owners, start_all, wait_for
from tests.shardmgr.cluster.relay import Relay
from tests.shardmgr.server.serverproc import ServerProcess

K = 7
NODES = ("n1", "n2", "n3")


@pytest.fixture
def relays(weed: WeedServer) -> Iterator[dict[str, Relay]]:
    """Each node's way to S3."""
    found = {node_id: Relay(weed.s3_port) for node_id in NODES}
    yield found
    for relay in found.values():
        relay.close()


@pytest.fixture
def watched(cluster_config: ClusterConfig) -> Iterator[ClusterMirror]:
    """The cluster state as a node watches it, for the test to read."""
    mirror = ClusterMirror(cluster_config, Kv(cluster_config)).start()
    yield mirror
    mirror.stop()


def cluster(config: ClusterConfig, tmp_path: Path, started: list[ServerProcess], relays: dict[str, Relay],
            **options: str) -> dict[str, ServerProcess]:
    """Nodes n1 (the writer of "docs": 4 published shards of 100 rows, 50 rows growing), n2 and n3, every
    published shard served by its owner; ``options`` for each node (nodes.node)."""
    nodes = {node_id: node(tmp_path, node_id, config, s3_endpoint=relays[node_id].endpoint, **options)
             for node_id in NODES}
    start_all(started, list(nodes.values()))
    with StoreClient(nodes["n1"].address) as client:
        client.create_collection("docs", dim=DIM)
        for vectors, ids in batches(9, seed=11):
            client.append("docs", vectors, ids, durable=True)
    wait_for("4 shards published", lambda: len(published(config, "docs")) == 4)
    wait_for("shards served by their owners", lambda: served_by_owners(config, "docs"), timeout=20)
    return nodes


def owner(state: ClusterState, shard_id: int) -> str:
    return owners(sorted(state.members), "docs", shard_id)[0]


def held(proc: ServerProcess) -> int:
    with RpcClient(proc.address) as rpc:
        return int(rpc.call("stats").result["cluster"]["acked_rows_held"])


def test_more_held_rows_than_max_batch_rows_are_skipped_and_past_max_held_deletes_a_delete_waits(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess], relays: dict[str, Relay],
        watched: ClusterMirror) -> None:
    nodes = cluster(cluster_config, tmp_path, started, relays, store_settings="max_batch_rows = 60",
                    node_settings="max_held_deletes = 100\n")
    shard, other = sorted(published(cluster_config, "docs"))[:2]
    # asked of a query node that does not serve the shard: every node it asks for it gets the held rows
    asking = next(nodes[n] for n in ("n2", "n3") if n != owner(watched.state(), shard))
    relays["n1"].cut()  # the writer cannot publish the deletes: nothing held is dropped meanwhile
    refs = ref_of(shard, np.arange(100))
    with StoreClient(asking.address) as client:
        queries = np.concatenate([client.get("docs", refs[:50]), client.get("docs", refs[50:])])[:70:5]
        assert client.delete("docs", refs[:35]) == 35 and client.delete("docs", refs[35:70]) == 35
        assert held(asking) == 70  # > max_batch_rows
        found = client.search("docs", queries, k=K)
        assert not found.partial, found.missing
        assert (found.refs >= 0).all() and not np.isin(found.refs, refs[:70]).any()

        assert client.delete("docs", refs[70:]) == 30  # 70 held, below the bound: taken
        assert held(asking) == 100
        later = ref_of(other, np.arange(10))
        with pytest.raises(DeletesBacklog, match="holds 100 rows of acknowledged deletes"):
            client.delete("docs", later)
        relays["n1"].restore()  # the writer publishes; once the asking node sees it, deletes go through

        def deleted() -> int | None:
            try:
                return client.delete("docs", later)
            except DeletesBacklog:
                return None

        assert wait_for("the delete to be taken", deleted, timeout=20) == 10  # the refused ones deleted nothing
        found = client.search("docs", queries, k=K)
        assert not found.partial and not np.isin(found.refs, refs).any()


def test_rows_a_dead_writer_published_before_any_other_copy_installed_them_are_still_skipped(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess], relays: dict[str, Relay],
        watched: ClusterMirror) -> None:
    nodes = cluster(cluster_config, tmp_path, started, relays)
    state = watched.state()
    shard = next(s for s in sorted(published(cluster_config, "docs")) if owner(state, s) != "n1")
    acknowledging = nodes[owner(state, shard)]  # serves the shard's only copy besides the writer's
    relays[owner(state, shard)].cut()  # so its copy cannot install the deletes the writer publishes
    refs = ref_of(shard, np.arange(0, 100, 10))
    with StoreClient(acknowledging.address) as client:
        queries = client.get("docs", refs)
        assert client.delete("docs", refs, durable=True) == 10  # forwarded to n1; held here

    def published_key() -> bool:
        key = watched.state().deletes.get("docs", {}).get(shard)
        return key is not None and key.deleted >= 10

    wait_for("the writer to publish the shard's deletes", published_key)
    nodes["n1"].signal(signal.SIGKILL)

    def writer_gone() -> ClusterState | None:
        now = watched.state()
        return now if "n1" not in now.members and "n1" not in now.serving else None

    gone = wait_for("the writer's lease to end", writer_gone)
    assert not gone.fresh(acknowledging.data_dir.name, "docs", shard)  # its copy lacks the published deletes
    with RpcClient(acknowledging.address) as rpc:  # planned by a state at least as new as this test's
        reply = rpc.call("shardmgr.search", {"name": "docs", "k": K, "after": gone.applied}, {"queries": queries})
    assert shard_stale(shard) in reply.result["missing"]  # answered from that copy, and it says so
    assert (reply.parts["refs"] >= 0).all() and not np.isin(reply.parts["refs"], refs).any()
