"""Each node's report (shardmgr/cluster/state/report.py) through real nodes: what
``cluster status`` and ``collection_info`` make of it.

- A writer whose S3 endpoint is cut (a relay on loopback, refusing
  connections) keeps taking appends; its report names the shard whose upload
  fails, with the error, and its rows not yet published. ``cluster status``
  (the read and the piped command, which names its columns) shows both per
  node, and ``collection_info`` on both nodes and through
  ``connect_cluster`` counts every row, published or not.
- SIGKILLed, the writer is shown *suspect* while its lease still runs (no
  keepalive for two thirds of it), then *gone* (not a member, with its
  last report: the rows it holds and the failing upload) instead of
  vanishing; ``collection_info`` still counts its rows from that report and
  says plainly that it does (``partial``).
- A reporter whose thread is stuck in a pass when a clean stop removes the
  report writes nothing after it (before, the thread wrote it again).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardmgr.cli import main
from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.operations.status import ClusterStatus, read_status
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.report import NodeReport, Reporter
from shardmgr.store.client import StoreClient
from tests.cluster_servers import WeedServer
from tests.shardmgr.cluster.nodes import DIM, batches, info_everywhere, node, published, start_all, wait_for
from tests.shardmgr.cluster.relay import Relay
from tests.shardmgr.server.serverproc import ServerProcess


@pytest.fixture
def relay(weed: WeedServer) -> Iterator[Relay]:
    r = Relay(weed.s3_port)
    yield r
    r.close()


def node_status(found: ClusterStatus, node_id: str) -> Any:
    return next((n for n in found.nodes if n.node_id == node_id), None)


def test_failing_uploads_and_unpublished_rows_per_node_then_a_killed_writer_is_suspect_and_gone(
        cluster_config: ClusterConfig, tmp_path: Path, relay: Relay, started: list[ServerProcess]) -> None:
    n1 = node(tmp_path, "n1", cluster_config, lease_ttl_s=4, s3_endpoint=relay.endpoint)
    n2 = node(tmp_path, "n2", cluster_config)
    start_all(started, [n1, n2])
    data = list(batches(6))
    with StoreClient(n1.address) as client:
        client.create_collection("docs", dim=DIM)
        for vectors, ids in data[:3]:  # shard 1 sealed and published, 50 rows growing
            client.append("docs", vectors, ids, durable=True)
        wait_for("shard 1 published", lambda: published(cluster_config, "docs"))
        relay.cut()
        for vectors, ids in data[3:]:  # shard 2 sealed (its upload fails), 100 rows growing
            client.append("docs", vectors, ids, durable=True)
    shards = published(cluster_config, "docs")
    assert [e.rows for e in shards.values()] == [100]

    def failing() -> ClusterStatus | None:
        found = read_status(cluster_config)
        n = node_status(found, "n1")
        return found if n is not None and n.failing and n.unpublished_rows == {"docs": 200} else None

    found = wait_for("n1 reporting a failing upload", failing)
    n = node_status(found, "n1")
    assert [(f.collection, f.what) for f in n.failing] == [("docs", "shard")] and n.failing[0].tries >= 1
    assert "ObjectStore" in n.failing[0].error and f"127.0.0.1:{relay.port}" in n.failing[0].error
    assert n.failing[0].shard_id not in shards and n.suspect is None and n.report_age_s is not None
    assert node_status(found, "n2").unpublished_rows == {} and node_status(found, "n2").failing == ()
    docs = found.collections[0]
    assert (docs.rows, docs.published_rows, docs.unpublished_rows, docs.deleted, docs.failing, docs.missing) == (
        300, 100, 200, 0, 1, ())

    piped = CliRunner().invoke(main, ["cluster", "status", "--cluster", cluster_config.etcd_url])
    assert piped.exit_code == 0, piped.output
    lines = [line.split("\t") for line in piped.output.splitlines()]
    assert ["#node", "node", "address", "lease", "ttl", "state", "report", "writes", "serving", "unpublished rows",
            "failing uploads"] in lines
    assert ["#failing", "node", "collection", "shard", "what", "tries", "since", "last error"] in lines
    row = next(line for line in lines if line[:2] == ["node", "n1"])
    assert row[5] == "ok" and row[9] == "docs 200" and row[10] == "1"
    assert any(line[:5] == ["failing", "n1", "docs", str(n.failing[0].shard_id), "shard"] for line in lines)

    for answer in info_everywhere(cluster_config, [n1, n2]):
        assert (answer["rows"], answer["deleted"], answer["partial"]) == (300, 0, False), answer
        assert answer["cluster"]["published"]["rows"] == 100 and answer["cluster"]["unpublished"]["rows"] == 200
        assert (answer["shards"], answer["growing"]) == (3, 1)

    n1.kill()
    suspect = wait_for("n1 suspect while still a member", lambda: (
        lambda n: n if n is not None and n.suspect else None)(node_status(read_status(cluster_config), "n1")),
        timeout=10, every=0.05)
    assert "no keepalive" in suspect.suspect or "expired" in suspect.suspect

    gone = wait_for("n1 gone", lambda: (lambda s: s if node_status(s, "n1") is None else None)(
        read_status(cluster_config)), timeout=10)
    assert [(g.node_id, g.address, dict(g.unpublished_rows), g.holds) for g in gone.gone] == [
        ("n1", n1.address, {"docs": 200}, ("docs",))]
    assert [f.what for f in gone.gone[0].failing] == ["shard"]
    piped = CliRunner().invoke(main, ["cluster", "status", "--cluster", cluster_config.etcd_url])
    assert any(line.split("\t")[:2] == ["gone", "n1"] for line in piped.output.splitlines()), piped.output

    for answer in info_everywhere(cluster_config, [n2]):
        assert (answer["rows"], answer["partial"]) == (300, True), answer
        assert len(answer["missing"]) == 1 and "node n1 (not a live member)" in answer["missing"][0]
        assert "counted from its last report" in answer["missing"][0]


def test_a_reporter_stopped_while_its_thread_is_stuck_writes_nothing_after_its_last_report(
        etcd_config: ClusterConfig) -> None:
    """A reporter thread stuck in a pass when stop() removes the report (a clean stop) must not write it
    again when it comes back: the node would show as gone for gone_keep_s."""
    stuck, release = threading.Event(), threading.Event()
    built = itertools.count()

    def make() -> NodeReport:
        n = next(built)  # each report differs from the last, so each pass writes
        if n >= 1 and threading.current_thread().name == "cluster-report":
            stuck.set()
            release.wait(10)
        return NodeReport("me", "127.0.0.1:1", time.time(), {}, (), n)

    reporter = Reporter(etcd_config, NodeConfig(report_interval_s=0.05), "me", make, dict, dict)
    kv = Kv(etcd_config)
    try:
        reporter.start()
        wait_for("the first report", lambda: kv.get(reporter.key) is not None)
        assert stuck.wait(10)
        reporter.stop(remove=True)
        assert kv.get(reporter.key) is None
        release.set()
        reporter._thread.join(10)
        assert not reporter._thread.is_alive()
        assert kv.get(reporter.key) is None
    finally:
        release.set()
        kv.close()
