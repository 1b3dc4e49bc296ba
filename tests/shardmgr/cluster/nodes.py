"""``shardmgr serve --cluster ...`` children for the cluster-mode tests, and
what the tests read back from etcd and the bucket.

Each node is a real ``python -m shardmgr serve`` process (tests/shardmgr/
server/serverproc.py) on a free loopback port, on the session's etcd and
SeaweedFS, under the test's own key and object prefixes, with tiny shards
(``seal_bytes`` 4096: two batches of 50 rows of 8 dimensions) and a 2 s lease.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import boto3
import numpy as np

import shardmgr
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.published.mirror import ClusterMirror
from shardmgr.cluster.published.placement import owners
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.cluster.state.shard_map import ShardEntry, ShardMap
from shardmgr.cluster.writer.uploader import TEST_HOOK_ENV
from shardmgr.store.client import StoreClient
from shardmgr.store.knn import SearchResult
from tests.cluster_servers import S3_ACCESS_KEY, S3_SECRET_KEY
from tests.shardmgr.server.serverproc import ServerProcess

T = TypeVar("T")
DIM = 8
ROWS = 50  # per batch: 1,600 bytes, so a shard (seal_bytes 4,096) takes two and the third seals it

SETTINGS = """
flush_interval_ms = {flush_interval_ms}

[store]
seal_bytes = 4096
extent_bytes = 4096
idle_seal_s = {idle_seal_s}
{store_settings}

[node]
lease_ttl_s = {lease_ttl_s}
etcd_timeout_s = 0.5
scan_interval_s = 0.5
upload_retry_min_s = 0.2
upload_retry_max_s = 1.0
sweep_grace_s = 1.0
sweep_interval_s = {sweep_interval_s}
shard_id_block = 4
join_timeout_s = 15.0
"""


def node(tmp_path: Path, node_id: str, config: ClusterConfig, *, hook: str | None = None,
         sweep_interval_s: float = 60.0, idle_seal_s: float = 300.0, metrics_port: int | None = None,
         flush_interval_ms: float = 5.0, extra: Sequence[str] = (), env: dict[str, str] | None = None,
         node_settings: str = "", lease_ttl_s: int = 2, s3_endpoint: str | None = None,
         store_settings: str = "") -> ServerProcess:
    """A cluster node (not started) with data in ``tmp_path/node_id``; ``hook``: the uploader's test hook
    (with it, let the idle timer seal the shard, so that no client waits for a reply when the hook fires);
    ``metrics_port``: serve the metrics endpoint (and the cluster pages) there; ``extra``: more ``serve``
    options; ``env``: more environment variables; ``node_settings``: more lines of the ``[node]`` table;
    ``s3_endpoint``: another way to the bucket than ``config``'s (a relay that a test cuts);
    ``store_settings``: more lines of the ``[store]`` table."""
    settings = tmp_path / f"{node_id}.toml"
    settings.write_text(SETTINGS.format(sweep_interval_s=sweep_interval_s, idle_seal_s=idle_seal_s,
                                        flush_interval_ms=flush_interval_ms, lease_ttl_s=lease_ttl_s,
                                        store_settings=store_settings) + node_settings)
    variables = {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
                 "AWS_CONFIG_FILE": "/dev/null", "AWS_SHARED_CREDENTIALS_FILE": "/dev/null", **(env or {})}
    if hook is not None:
        variables[TEST_HOOK_ENV] = hook
    assert config.s3_endpoint is not None
    metrics = ("--metrics-port", str(metrics_port)) if metrics_port is not None else ()
    return ServerProcess(tmp_path / node_id, "--config", str(settings), "--cluster", config.etcd_url,
                         "--object-store", config.s3_url, "--s3-endpoint", s3_endpoint or config.s3_endpoint,
                         "--node-id", node_id,
                         *metrics, *extra, env=variables)


def bucket(config: ClusterConfig) -> ObjectStore:
    return ObjectStore(config, session=boto3.session.Session(aws_access_key_id=S3_ACCESS_KEY,
                                                             aws_secret_access_key=S3_SECRET_KEY))


def batches(count: int, seed: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``count`` batches of ROWS random vectors with distinct ids."""
    rng = np.random.default_rng(seed)
    for i in range(count):
        yield rng.random((ROWS, DIM), dtype=np.float32), np.arange(i * ROWS, (i + 1) * ROWS, dtype=np.int64) + seed


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 15.0, every: float = 0.1) -> T:
    """``probe()``'s first truthy answer; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def published(config: ClusterConfig, collection: str) -> dict[int, ShardEntry]:
    return ShardMap(config, collection).read()[0]


def objects_under(store: ObjectStore, config: ClusterConfig, collection: str) -> set[str]:
    return {o.key for o in store.list(config.object_key(collection, "shards") + "/")}


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` (``T``: stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def served_by_owners(config: ClusterConfig, collection: str) -> bool:
    """Every published shard is listed in the serving key of each of its owners."""
    state = ClusterMirror(config, Kv(config)).read()
    live = sorted(state.members)
    return all(all(shard in state.ready(owner, collection) for owner in owners(live, collection, shard))
               for shard in state.published.get(collection, {}))


def search(address: str, queries: np.ndarray, collection: str = "docs", k: int = 7) -> SearchResult:
    """One search through a fresh client of the node at ``address``."""
    with StoreClient(address) as client:
        return client.search(collection, queries, k=k)


def start_all(started: list[ServerProcess], nodes: list[ServerProcess]) -> None:
    """Start ``nodes`` at once (each start waits for its ready file), listed in ``started`` first."""
    started.extend(nodes)
    with ThreadPoolExecutor(len(nodes)) as pool:
        list(pool.map(lambda proc: proc.start(), nodes))


def info_everywhere(config: ClusterConfig, nodes: list[ServerProcess], name: str = "docs") -> list[dict[str, Any]]:
    """``collection_info(name)`` from each node, then through connect_cluster."""
    answers = []
    for proc in nodes:
        with StoreClient(proc.address) as client:
            answers.append(client.collection_info(name))
    with shardmgr.connect_cluster(config.etcd_url) as cluster:
        answers.append(cluster.collection_info(name))
    return answers
