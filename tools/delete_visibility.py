"""How soon a delete is seen, on the node that acknowledged it and on the
others (docs/cluster.md, "When a delete is seen").

Starts etcd and SeaweedFS on loopback as the tests do (tests/cluster_servers.py)
and three ``shardmgr serve --cluster`` nodes with tiny shards but the
default ``[node]`` timings (``scan_interval_s`` 5 s unless ``--scan``); n1
writes a collection of 8 published shards, each served by its rendezvous
owner. Then, ``--runs`` times, after a pause drawn between 0 and the scan
interval (so that deletes land anywhere in the writer's cycle), one row of
a published shard that a node other than the writer serves (from its
cache: the writer's own copy, which skips the row at once, is not what the
others ask) is deleted through a node (by turns the writer n1 and the
non-writer n2, which forwards it), the acknowledging node's very next
search is checked to skip it, and the two other nodes are searched every
10 ms until neither returns it: the time from the acknowledgement to then
is printed. Everything it started is stopped by PID at the end.

    python tools/delete_visibility.py [--runs 10] [--scan 5.0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shardmgr.cluster.config import ClusterConfig  # noqa: E402
from shardmgr.cluster.published.placement import owners  # noqa: E402
from shardmgr.store.client import StoreClient  # noqa: E402
from tests.cluster_servers import (  # noqa: E402
    S3_ACCESS_KEY,
    S3_SECRET_KEY,
    EtcdServer,
    WeedServer,
    etcd_binary,
    weed_binary,
)
from tests.shardmgr.cluster.nodes import DIM, batches, published, served_by_owners, wait_for  # noqa: E402
from tests.shardmgr.server.serverproc import ServerProcess  # noqa: E402

BUCKET = "vectors"
SETTINGS = """
[store]
seal_bytes = 4096
extent_bytes = 4096

[node]
scan_interval_s = {scan}
"""


def start(directory: Path, config: ClusterConfig, scan: float) -> list[ServerProcess]:
    settings = directory / "node.toml"
    settings.write_text(SETTINGS.format(scan=scan))
    env = {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
           "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null"}
    assert config.s3_endpoint is not None
    nodes = [ServerProcess(directory / name, "--config", str(settings), "--cluster", config.etcd_url,
                           "--object-store", config.s3_url, "--s3-endpoint", config.s3_endpoint, "--node-id", name,
                           env=env) for name in ("n1", "n2", "n3")]
    for proc in nodes:
        proc.start()
    return nodes


def returns(client: StoreClient, vector: np.ndarray, ref: int) -> bool:
    return bool((client.search("docs", vector[None], k=5).refs == ref).any())


def measure(nodes: list[ServerProcess], config: ClusterConfig, runs: int, scan: float) -> list[float]:
    data = list(batches(17, seed=3))
    vectors = np.concatenate([v for v, _ in data])
    clients = [StoreClient(proc.address) for proc in nodes]
    seen: list[float] = []
    try:
        refs = np.concatenate([clients[0].append("docs", v, i, durable=True) for v, i in data])
        wait_for("8 shards published", lambda: len(published(config, "docs")) == 8, timeout=60)
        wait_for("shards served by their owners", lambda: served_by_owners(config, "docs"), timeout=60)
        cached = [s for s in published(config, "docs") if owners(["n1", "n2", "n3"], "docs", s)[0] != "n1"]
        candidates = np.flatnonzero(np.isin(refs >> 40, cached))
        assert len(candidates) >= runs, f"only {len(candidates)} rows in shards {cached}"
        rng = random.Random(1)
        for run in range(runs):
            time.sleep(rng.uniform(0, scan))  # at any point of the writer's pass cycle, not just after one
            row = int(candidates[run * (len(candidates) // runs)])  # spread over those shards
            by = run % 2  # the writer, or n2 (which forwards)
            others = [c for i, c in enumerate(clients) if i != by]
            assert all(returns(c, vectors[row], int(refs[row])) for c in clients)
            clients[by].delete("docs", refs[row:row + 1])
            acked = time.monotonic()
            if returns(clients[by], vectors[row], int(refs[row])):
                raise SystemExit(f"run {run}: the acknowledging node's next search returned the deleted row")
            while any(returns(c, vectors[row], int(refs[row])) for c in others):
                time.sleep(0.01)
            seen.append(time.monotonic() - acked)
            print(f"delete {run + 1} through {nodes[by].data_dir.name}: seen by the others after {seen[-1]:.2f} s")
    finally:
        for client in clients:
            client.close()
    return seen


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--scan", type=float, default=5.0, help="the nodes' scan_interval_s")
    args = parser.parse_args()
    etcd_path, weed_path = etcd_binary(), weed_binary()
    if etcd_path is None or weed_path is None:
        raise SystemExit("needs the etcd and weed binaries (the cluster extra)")
    with tempfile.TemporaryDirectory(prefix="delete-visibility-") as scratch:
        work = Path(scratch)
        etcd, weed = EtcdServer(etcd_path, work / "etcd"), WeedServer(weed_path, work / "weed")
        nodes: list[ServerProcess] = []
        try:
            etcd.start()
            weed.start()
            weed.s3_client().create_bucket(Bucket=BUCKET)
            config = ClusterConfig.from_urls(etcd.url("bench"), f"s3://{BUCKET}/bench", s3_endpoint=weed.endpoint)
            nodes = start(work, config, args.scan)
            with StoreClient(nodes[0].address) as writer:
                writer.create_collection("docs", dim=DIM)
            times = measure(nodes, config, args.runs, args.scan)
        finally:
            for proc in nodes:
                proc.kill()
            weed.stop()
            etcd.stop()
    print(f"acknowledging node: its next search, every time; the others, over {len(times)} deletes "
          f"(scan_interval_s {args.scan:g} s): median {statistics.median(times):.2f} s, "
          f"min {min(times):.2f} s, max {max(times):.2f} s")
