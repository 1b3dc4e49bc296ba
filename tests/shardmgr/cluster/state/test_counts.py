"""A collection's whole count in cluster mode (shardmgr/cluster/state/counts.py).

- Through three real nodes: ``collection_info`` answers the same from
  every node and through ``connect_cluster``: published rows, the writer's
  growing rows, and, after deletes sent to a query node (of a published
  shard and of the growing one), every acknowledged delete, before and
  after the writer publishes it.
- The rules one by one, on values made here: a shard published since a
  node's report is counted once; per shard the largest deleted count any
  node reports; a holder that has not reported, a holder that is not a live
  member, and deleted rows recorded nowhere make the count partial, saying
  so.
"""

from __future__ import annotations

from typing import Any

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.counts import count
from shardmgr.cluster.state.report import CollectionReport, NodeReport, ShardCount
from shardmgr.cluster.state.shard_map import ShardEntry, ShardObject
from shardmgr.store.client import StoreClient
from tests.shardmgr.cluster.nodes import batches, info_everywhere, search, wait_for
from tests.shardmgr.server.serverproc import ServerProcess

#: what every node must answer, of collection_info's keys
KEYS = ("rows", "deleted", "shards", "sealed", "growing", "bytes", "partial", "missing")


def same_everywhere(config: ClusterConfig, nodes: list[ServerProcess], **expected: Any) -> list[dict[str, Any]]:
    """Every node's answer (and connect_cluster's), once all of them hold ``expected``."""
    def probe() -> list[dict[str, Any]] | None:
        found = info_everywhere(config, nodes)
        views = [{k: a[k] for k in KEYS} | {"cluster": {k: v for k, v in a["cluster"].items() if k != "reports"}}
                 for a in found]
        ok = all(v == views[0] for v in views) and all(
            views[0].get(k, views[0]["cluster"].get(k)) == v for k, v in expected.items())
        return found if ok else None
    return wait_for(f"the same count from every node: {expected}", probe)


def test_collection_info_counts_the_whole_collection_the_same_from_every_node(
        three_nodes: list[ServerProcess], cluster_config: ClusterConfig) -> None:
    n1, n2, _ = three_nodes  # n1 writes: 4 published shards of 100 rows, 50 rows growing
    found = same_everywhere(cluster_config, three_nodes, rows=450, deleted=0, partial=False)
    first = found[0]
    assert (first["shards"], first["sealed"], first["growing"], first["missing"]) == (5, 4, 1, [])
    assert first["cluster"]["published"] == {"shards": 4, "rows": 400, "deleted": 0}
    assert first["cluster"]["unpublished"] == {"shards": 1, "rows": 50, "deleted": 0}
    assert first["bytes"] == 450 * (8 * 4 + 8) and first["dim"] == 8 and first["name"] == "docs"
    assert list(first["cluster"]["reports"]) == ["n1"]  # the only node with rows of docs not published

    data = list(batches(9, seed=11))
    published_refs = search(n1.address, data[0][0][:3], k=1).refs[:, 0]  # rows of the first published shard
    growing_refs = search(n1.address, data[8][0][:2], k=1).refs[:, 0]  # rows of the growing shard
    with StoreClient(n2.address) as client:  # forwarded to n1
        assert client.delete("docs", published_refs, durable=True) == 3
        assert client.delete("docs", growing_refs, durable=True) == 2
    found = same_everywhere(cluster_config, three_nodes, rows=445, deleted=5, partial=False, deletes_unpublished=0)
    assert found[0]["cluster"]["published"] == {"shards": 4, "rows": 397, "deleted": 3}
    assert found[0]["cluster"]["unpublished"] == {"shards": 1, "rows": 48, "deleted": 2}


def entry(shard_id: int, rows: int, *, deleted: int | None = 0, log: bool = False) -> ShardEntry:
    objects = (ShardObject("vectors", f"k/{shard_id}", 1, 0),) + ((ShardObject("deletes", "d", 1, 0),) if log else ())
    return ShardEntry("c", shard_id, rows, objects, writer="n1", writer_revision=5, deleted=deleted)


def report(node_id: str, at: float, unpublished: dict[int, tuple[int, int, bool]],
           deleted_here: dict[int, int] | None = None) -> NodeReport:
    shards = {i: ShardCount(*c) for i, c in unpublished.items()}
    return NodeReport(node_id, f"{node_id}:7300", at, {"c": CollectionReport(shards, deleted_here or {})}, (), 0)


def test_a_shard_published_since_a_report_is_counted_once_and_late_deletes_by_the_largest_report() -> None:
    published = {1: entry(1, 100, deleted=2, log=True), 2: entry(2, 100)}
    reports = {"n1": report("n1", 99.0, {2: (100, 0, True), 3: (40, 1, False)}, {1: 5}),
               "n2": report("n2", 99.5, {}, {1: 4})}  # a former writer's copy of shard 1
    c = count("c", published, {}, {"n1": False}, {"n1", "n2"}, reports, 100.0)
    assert (c.published_rows, c.published_deleted, c.unpublished_rows, c.unpublished_deleted) == (200, 2, 40, 1)
    assert (c.deletes_unpublished, c.deleted, c.rows, c.growing, c.missing) == (3, 6, 234, 1, ())
    assert c.reports == {"n1": 1.0, "n2": 0.5}
    # a deletes key holds more than the entry: it counts
    assert count("c", published, {1: 5}, {}, {"n1"}, reports, 100.0).deletes_unpublished == 0


def test_what_cannot_be_counted_is_said() -> None:
    published = {1: entry(1, 100, deleted=None, log=True), 2: entry(2, 100, deleted=None, log=True)}
    reports = {"gone": report("gone", 40.0, {7: (30, 0, False)}, {2: 9})}
    c = count("c", published, {}, {"quiet": False, "gone": False, "clean": True}, {"quiet"}, reports, 100.0)
    assert c.unpublished_rows == 30 and c.published_deleted == 9  # shard 2's count from the node holding it
    assert c.partial and len(c.missing) == 3
    assert "node gone (not a live member) are counted from its last report, 60 s old" in c.missing[0]
    assert "node quiet (a live member) are not counted: it has not reported them yet" in c.missing[1]
    assert "the deleted rows of 1 published shards are recorded nowhere" in c.missing[2]
    assert count("c", {}, {}, {"left": False}, set(), {}, 0.0).missing == (
        "rows not yet published on node left (not a live member) are not counted: it left no report",)
    assert not count("c", {9: entry(9, 10)}, {}, {"n1": True}, set(), {}, 0.0).partial  # clean: nothing held
    assert count("c", {9: entry(9, 10)}, {}, {}, set(), {}, 0.0).rows == 10
