"""The cluster's status (shardmgr/cluster/operations/status.py) read from keys written
straight into the session's etcd, and ``shardmgr cluster status`` on them.

- One read shows members with their leases' TTLs, the catalog, writers
  with their fencing tokens, published shards with their rendezvous owners
  and where they are served, holders (flagged when neither live nor
  clean), totals.
- Without serving keys every shard says "not reported", not "unserved".
- A key that does not decode is reported and the rest still shown.
- With the bucket listed, orphans are the objects no entry names.
- The cache shares a read for its age, and remembers a failure as long.
- The command prints the same as JSON, tables off a terminal, and exits 1
  with a clear message when etcd is unreachable.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from shardmgr.cli import main
from shardmgr.cli.cluster import COLLECTION_COLUMNS, NODE_COLUMNS
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import CoordinationUnavailable
from shardmgr.cluster.operations.status import HOLDER_GONE, read_status
from shardmgr.cluster.operations.status_cache import StatusCache
from shardmgr.cluster.published.placement import owners
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.shard_map import ShardEntry, ShardObject
from tests.cluster_servers import free_ports


def put_json(kv: Kv, key: str, value: object, lease: int = 0) -> int:
    return kv.put(key, json.dumps(value).encode(), lease)


def entry(config: ClusterConfig, collection: str, shard_id: int, rows: int, sizes: tuple[int, ...]) -> ShardEntry:
    objects = tuple(ShardObject(name, config.object_key(collection, "shards", f"{shard_id:020d}", "7", name), size,
                                0x1234) for name, size in zip(("vectors", "ids", "journal"), sizes))
    return ShardEntry(collection, shard_id, rows, objects, writer="n1", writer_revision=7)


def publish(kv: Kv, config: ClusterConfig, e: ShardEntry) -> None:
    kv.put(config.key("shards", e.collection, f"{e.shard_id:020d}"), e.encode())


def populate(config: ClusterConfig, *, serving: bool) -> dict[str, int]:
    """Two members (n1 writes c), catalog c and d, shards 1-3 of c, holders; returns the leases and c's token."""
    kv = Kv(config)
    leases = {n: kv.grant(30)[0] for n in ("n1", "n2")}
    for n, lease in leases.items():
        put_json(kv, config.key("members", n), {"node": n, "address": f"10.0.0.{n[1]}:7300"}, lease)
    token = put_json(kv, config.key("writers", "c"), {"node": "n1"}, leases["n1"])
    for name, dim in (("c", 8), ("d", 4)):
        put_json(kv, config.key("collections", name), {"name": name, "dim": dim, "metric": "l2", "index": "flat"})
    for shard_id in (1, 2, 3):
        publish(kv, config, entry(config, "c", shard_id, 100, (3200, 800, 120)))
    put_json(kv, config.key("holders", "c", "n1"), {"node": "n1"})
    put_json(kv, config.key("holders", "d", "gone"), {"node": "gone"})
    put_json(kv, config.key("holders", "d", "left"), {"node": "left", "clean": True})  # all it held is published
    kv.put(config.key("shard_ids", "c"), b'{"next": 5}')  # a kind the status does not show
    if serving:
        put_json(kv, config.key("serving", "n1"), {"node": "n1", "address": "10.0.0.1:7300",
                                                   "collections": {"c": [1, 3]}}, leases["n1"])
        put_json(kv, config.key("serving", "n2"), {"node": "n2", "address": "10.0.0.2:7300",
                                                   "collections": {"c": [3], "d": []}}, leases["n2"])
    kv.close()
    return {**leases, "token": token}


def put_report(config: ClusterConfig, node_id: str, *, unpublished: dict[str, dict[int, list[Any]]],
               failing: Sequence[tuple[str, int, str, int, str]] = (), age_s: float = 0.5) -> None:
    """A node's report (shardmgr/cluster/state/report.py), ``age_s`` old: rows (rows, deleted, sealed) by shard, per
    collection, not published; failing uploads (collection, shard, what, tries, error)."""
    kv = Kv(config)
    put_json(kv, config.key("reports", node_id), {
        "node": node_id, "address": f"{node_id}:7300", "at": time.time() - age_s, "uploads_failed_total": 9,
        "collections": {c: {"unpublished": {str(i): v for i, v in shards.items()}, "deleted_here": {}}
                        for c, shards in unpublished.items()},
        "failing": [{"collection": c, "shard_id": i, "what": what, "tries": tries, "since": time.time() - 30,
                     "error": error} for c, i, what, tries, error in failing]})
    kv.close()


def test_one_read_shows_nodes_collections_writers_shards_served_and_holders(etcd_config: ClusterConfig) -> None:
    made = populate(etcd_config, serving=True)
    found = read_status(etcd_config)
    assert found.revision == Kv(etcd_config).get_prefix(etcd_config.key(""))[1]  # nothing written since
    assert [(n.node_id, n.address, n.lease) for n in found.nodes] == [
        ("n1", "10.0.0.1:7300", f"{made['n1']:x}"), ("n2", "10.0.0.2:7300", f"{made['n2']:x}")]
    for n in found.nodes:
        assert n.granted_ttl_s == 30 and n.ttl_s is not None and 0 < n.ttl_s <= 30
    assert found.nodes[0].writes == ("c",) and found.nodes[1].writes == ()
    assert found.nodes[0].serving == {"c": (1, 3)} and found.nodes[1].serving == {"c": (3,), "d": ()}
    c, d = found.collections
    assert (c.name, c.dim, c.metric, c.index, d.name, d.dim) == ("c", 8, "l2", "flat", "d", 4)
    assert c.writer is not None and (c.writer.node_id, c.writer.revision, c.writer.live) == ("n1", made["token"], True)
    assert d.writer is None and d.shards == () and d.served == 0
    assert [s.shard_id for s in c.shards] == [1, 2, 3]
    assert [s.served_by for s in c.shards] == [("n1",), (), ("n1", "n2")]
    for s in c.shards:
        assert s.owners == tuple(owners(["n1", "n2"], "c", s.shard_id, 1))
        assert (s.rows, s.bytes, s.files, s.writer, s.writer_revision) == (100, 4120, 3, "n1", 7)
    assert (c.rows, c.bytes, c.served) == (300, 3 * 4120, 2)
    assert (found.shards, found.rows, found.bytes) == (3, 300, 3 * 4120)
    assert [(h.collection, h.node_id, h.live, h.clean, h.unavailable) for h in found.holders] == [
        ("c", "n1", True, False, False), ("d", "gone", False, False, True), ("d", "left", False, True, False)]
    assert found.problems == () and found.objects is None and found.serving_reported
    two = read_status(etcd_config, replicas=2, leases=False)
    assert all(len(s.owners) == 2 for s in two.collections[0].shards) and two.nodes[0].ttl_s is None
    assert json.loads(json.dumps(found.as_dict()))["collections"][0]["shards"][2]["served_by"] == ["n1", "n2"]


def test_reports_show_rows_not_yet_published_failing_uploads_late_members_and_gone_nodes(
        etcd_config: ClusterConfig) -> None:
    populate(etcd_config, serving=True)
    put_report(etcd_config, "n1", unpublished={"c": {4: [100, 3, True], 5: [20, 0, False]}},
               failing=[("c", 4, "shard", 7, "ObjectStoreUnavailable: s3 http://10.0.0.9:8333: put c/4: refused")])
    put_report(etcd_config, "gone", unpublished={"d": {2: [30, 0, False]}}, age_s=120)
    put_report(etcd_config, "n2", unpublished={}, age_s=100)
    found = read_status(etcd_config)
    n1, n2 = found.nodes
    assert (n1.suspect, n1.unpublished_rows, n1.uploads_failed_total) == (None, {"c": 117}, 9)
    assert n1.silent_s is not None and 0 <= n1.silent_s < 10  # kept alive by nobody, granted 30 s
    assert n1.report_age_s is not None and 0.5 <= n1.report_age_s < 30
    assert [(f.collection, f.shard_id, f.what, f.tries) for f in n1.failing] == [("c", 4, "shard", 7)]
    assert n2.suspect is not None and n2.suspect.startswith("its report is 10") and n2.unpublished_rows == {}
    c, d = found.collections
    assert (c.rows, c.deleted, c.published_rows, c.unpublished_rows, c.failing, c.missing) == (417, 3, 300, 117, 1, ())
    assert (d.rows, d.unpublished_rows) == (30, 30) and "node gone (not a live member)" in d.missing[0]
    assert [(g.node_id, g.address, dict(g.unpublished_rows), g.holds) for g in found.gone] == [
        ("gone", "gone:7300", {"d": 30}, ("d",))] and 119 < found.gone[0].report_age_s < 150
    assert found.rows == 447
    assert json.loads(json.dumps(found.as_dict()))["gone"][0]["node_id"] == "gone"

    lines = [line.split("\t") for line in CliRunner().invoke(
        main, ["cluster", "status", "--cluster", etcd_config.etcd_url]).output.splitlines()]
    assert ["#gone", "node", "address", "last report", "unpublished rows", "holds unpublished"] in lines
    assert [line[:3] + line[4:] for line in lines if line[0] == "gone"] == [["gone", "gone", "gone:7300", "d 30", "d"]]
    assert [line[:6] for line in lines if line[0] == "failing"] == [["failing", "n1", "c", "4", "shard", "7"]]
    assert next(line for line in lines if line[:2] == ["node", "n2"])[5].startswith("suspect: its report is 10")


def test_without_serving_keys_shards_are_not_reported_rather_than_unserved(etcd_config: ClusterConfig) -> None:
    populate(etcd_config, serving=False)
    found = read_status(etcd_config)
    assert not found.serving_reported
    assert all(n.serving is None for n in found.nodes)
    assert all(c.served is None and all(s.served_by is None for s in c.shards) for c in found.collections)


def test_keys_that_do_not_decode_are_reported_and_the_rest_is_shown(etcd_config: ClusterConfig) -> None:
    populate(etcd_config, serving=True)
    kv = Kv(etcd_config)
    bad = {etcd_config.key("collections", "x"): b"not json",
           etcd_config.key("shards", "c", f"{9:020d}"): entry(etcd_config, "c", 8, 1, (1,)).encode(),  # wrong id
           etcd_config.key("members", "n3"): b"\xff\xfe",
           etcd_config.key("holders", "c", "n2"): b'{"node": "n1"}',  # not the key's node
           etcd_config.key("writers", "-c"): b'{"node": "n1"}',  # not a collection name
           etcd_config.key("serving", "n2"): b'{"node": "n2"}'}  # no "collections"
    for key, value in bad.items():
        kv.put(key, value)
    found = read_status(etcd_config)
    assert sorted(p.key for p in found.problems) == sorted(bad)
    assert [n.node_id for n in found.nodes] == ["n1", "n2"] and found.nodes[1].serving is None
    assert [c.name for c in found.collections] == ["c", "d"] and len(found.collections[0].shards) == 3


def test_the_listing_counts_the_objects_no_entry_names_as_orphans(cluster_config: ClusterConfig,
                                                                  tmp_path: Path) -> None:
    from tests.shardmgr.cluster.nodes import bucket

    store = bucket(cluster_config)
    kv = Kv(cluster_config)
    named = entry(cluster_config, "c", 1, 10, (5, 6, 7))
    for obj in named.objects:
        path = tmp_path / obj.name
        path.write_bytes(b"x" * obj.size)
        store.put_file(path, obj.key)
    orphan = tmp_path / "orphan"
    orphan.write_bytes(b"y" * 11)
    store.put_file(orphan, cluster_config.object_key("c", "shards", f"{2:020d}", "9", "vectors"))
    publish(kv, cluster_config, named)
    found = read_status(cluster_config, objects=store)
    assert found.objects is not None
    assert (found.objects.objects, found.objects.bytes, found.objects.orphan_bytes) == (4, 29, 11)
    assert found.objects.orphans == (cluster_config.object_key("c", "shards", f"{2:020d}", "9", "vectors"),)
    assert found.bytes == 18 and found.objects.url == cluster_config.s3_url


def test_the_cache_shares_a_read_for_its_age_and_remembers_a_failure(etcd_config: ClusterConfig) -> None:
    populate(etcd_config, serving=False)
    now = [0.0]
    cache = StatusCache(etcd_config, max_age_s=1.0, clock=lambda: now[0])
    first = cache.get()
    put_json(Kv(etcd_config), etcd_config.key("collections", "e"),
             {"name": "e", "dim": 2, "metric": "ip", "index": "flat"})
    assert cache.get() is first
    now[0] = 1.0
    assert [c.name for c in cache.get().collections] == ["c", "d", "e"]
    cache.close()

    port = free_ports(1)[0]  # nothing listens there
    down = StatusCache(ClusterConfig(etcd_host="127.0.0.1", etcd_port=port, key_prefix="/x", bucket="none",
                                     etcd_timeout_s=0.5), clock=lambda: now[0])
    with pytest.raises(CoordinationUnavailable, match=f"127.0.0.1:{port}") as first_error:
        down.get()
    with pytest.raises(CoordinationUnavailable) as again:
        down.get()
    assert again.value is first_error.value  # not asked again within max_age_s
    down.close()


def test_the_command_prints_json_and_plain_rows_and_fails_clearly_without_etcd(etcd_config: ClusterConfig) -> None:
    populate(etcd_config, serving=True)
    runner = CliRunner()
    result = runner.invoke(main, ["cluster", "status", "--cluster", etcd_config.etcd_url, "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert [n["node_id"] for n in found["nodes"]] == ["n1", "n2"]
    assert [(c["name"], c["writer"]["node_id"], len(c["shards"])) for c in found["collections"][:1]] == [("c", "n1", 3)]

    result = runner.invoke(main, ["cluster", "status", "--cluster", etcd_config.etcd_url, "--replicas", "2"])
    assert result.exit_code == 0, result.output
    lines = [line.split("\t") for line in result.output.splitlines()]
    assert lines[0][0].startswith(f"cluster {etcd_config.etcd_url} at revision ")
    assert lines[1] == ["#node", *NODE_COLUMNS] and ["#collection", *COLLECTION_COLUMNS] in lines
    assert ["#holder", "collection", "node", "state"] in lines
    assert lines[3][:3] == ["node", "n2", "10.0.0.2:7300"] and lines[3][5:9] == ["ok", "not reported", "-", "c 1, d 0"]
    rows = {line[1]: line for line in lines if line[0] == "collection"}
    assert rows["c"][4].startswith("n1 (token ") and rows["c"][5:9] == ["3", "300 (partial)", "0", "300"]
    assert rows["c"][12] == "12360" and rows["c"][14] == "2/3 (n1 2, n2 1)" and rows["d"][14] == "0/0"
    assert ["partial", "c", "rows not yet published on node n1 (a live member) are not counted: it has not "
            "reported them yet"] in lines
    assert ["holder", "d", "gone", f"not a member: {HOLDER_GONE}"] in lines
    assert ["holder", "d", "left", "not a member, clean"] in lines and ["holder", "c", "n1", "live"] in lines

    port = free_ports(1)[0]
    result = runner.invoke(main, ["cluster", "status", "--cluster", f"etcd://127.0.0.1:{port}/x", "--timeout", "0.5"])
    assert result.exit_code == 1
    assert f"shardmgr cluster status: etcd 127.0.0.1:{port}" in result.output
