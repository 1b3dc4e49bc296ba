"""The search phases of tools/bench_cluster.py: real ``shardmgr serve``
processes on the benchmark's etcd and SeaweedFS.

fanout: three cluster nodes (n1 writes the collection; every shard is
published and served by its rendezvous owner) against one plain node (no
cluster) holding the same rows in the same shards (the same appends with
the same settings). A client sends searches to n2, which fans them out to
n1 and n3 and searches its own share, or to the single node; ``nq`` queries
per call, one call at a time, for ``--seconds``. QPS = queries per second.
Target: >= 0.7 x the single node for batches. Every node runs on the same 2
cores, so this measures the cost of fanning out (the wire, the merge), not
the gain from more machines (docs/cluster.md, "How it scales").

takeover: the time from a query node's SIGKILL to the first complete search
result through the surviving node, when no other node held the dead node's
shards (the writer left cleanly before, so its copies are gone: the worst
case with ``replicas`` 1). The model it is compared with: the lease TTL
(when the dead node's member key expires and its shards get new owners) plus
the time a fetch of those shards' objects takes, measured in the same run.
After each measurement the victim restarts and the cluster settles again.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from cluster_phases import Bench

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.published.mirror import ClusterMirror, ClusterState
from shardmgr.cluster.published.placement import owners
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.server import readiness
from shardmgr.store.client import StoreClient

DIM = 128
K = 10
SEARCH = "search"
"""The search phases' group: their state in ``Bench.state`` and their cluster prefixes."""
TTL_S = 2
"""The nodes' lease TTL: etcd's smallest, so that the takeover phase measures the fetch more than the wait."""
SETTINGS = """
[store]
seal_bytes = {seal_bytes}
idle_seal_s = 1.0

[node]
lease_ttl_s = {ttl}
etcd_timeout_s = 1.0
scan_interval_s = 0.5
cache_linger_s = 1.0
join_timeout_s = 30.0
"""


@dataclasses.dataclass(frozen=True)
class SearchCase:
    """One configuration: ``phase`` fanout (``system`` cluster or one-node, ``nq`` queries a call) or takeover."""

    phase: str
    system: str
    nq: int = 0

    def __str__(self) -> str:
        return f"{self.phase} {self.system} nq={self.nq}" if self.phase == "fanout" else f"{self.phase} {self.system}"


class Node:
    """A ``shardmgr serve`` process (cluster node when ``cluster`` is given)."""

    def __init__(self, directory: Path, name: str, settings: Path, cluster: list[str], env: dict[str, str]) -> None:
        self.data, self.name, self.settings, self.cluster, self.env = directory / name, name, settings, cluster, env
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self) -> Node:
        ready, log = self.data.with_suffix(".ready"), self.data.with_suffix(".log")
        with open(log, "ab") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-m", "shardmgr", "serve", "--data", str(self.data),
                                          "--port", "0", "--ready-file", str(ready), "--config", str(self.settings),
                                          *self.cluster], stderr=stderr, env={**os.environ, **self.env})
        host, port = readiness.wait(ready, self.proc, 120, log=log.read_text)
        self.address = f"{host}:{port}"
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(120)


@dataclasses.dataclass
class Search:
    """What the search phases share: the nodes, the queries and the cluster's settings."""

    config: ClusterConfig
    objects: ObjectStore
    nodes: dict[str, Node]
    queries: np.ndarray
    seconds: float
    ttl: int
    layout: dict[str, Any] = dataclasses.field(default_factory=dict)


def prepare_search(bench: Bench, args: argparse.Namespace) -> None:
    """Once for both phases: n1, n2, n3 and one plain node, ``args.rows`` rows loaded into n1 and into the
    plain node alike, every shard sealed, published and served by its owner."""
    if SEARCH in bench.state:
        return
    config = bench.config(SEARCH)
    objects = ObjectStore(config, session=bench.session)
    directory = bench.directory / SEARCH
    directory.mkdir()
    settings = directory / "search.toml"
    settings.write_text(SETTINGS.format(seal_bytes=args.seal_mib << 20, ttl=TTL_S))
    cluster = ["--cluster", config.etcd_url, "--object-store", config.s3_url, "--s3-endpoint",
               str(config.s3_endpoint)]
    threads = {"OMP_NUM_THREADS": str(args.node_threads)} if args.node_threads else {}
    nodes = {name: Node(directory, name, settings, [*cluster, "--node-id", name], {**bench.env, **threads})
             for name in ("n1", "n2", "n3")}
    nodes["one"] = Node(directory, "one", settings, [], {})
    search = bench.state[SEARCH] = Search(config, objects, nodes,
                                          np.random.default_rng(7).random((1000, DIM), dtype=np.float32),
                                          args.seconds, TTL_S)
    for node in nodes.values():
        node.start()
    for name in ("n1", "one"):
        with StoreClient(nodes[name].address, timeout=600) as client:
            client.create_collection("bench", DIM)
            for start in range(0, args.rows, 20_000):
                count = min(20_000, args.rows - start)
                local = np.random.default_rng(start)
                client.append("bench", local.random((count, DIM), dtype=np.float32),
                              np.arange(start, start + count), durable=True)
    _settle(config, nodes, ["n1", "n2", "n3"])
    search.layout = describe(search)


def finish_search(bench: Bench) -> None:
    search: Search | None = bench.state.pop(SEARCH, None)
    if search is not None:
        for node in search.nodes.values():
            node.stop()
        search.objects.close()


def fanout_cases(args: argparse.Namespace) -> list[SearchCase]:
    return [SearchCase("fanout", system, nq) for nq in args.nq for system in ("cluster", "one-node")]


def takeover_cases(args: argparse.Namespace) -> list[SearchCase]:
    return [SearchCase("takeover", system) for system in ("ours", "model")]


def _state(config: ClusterConfig) -> ClusterState:
    kv = Kv(config)
    try:
        return ClusterMirror(config, kv).read()
    finally:
        kv.close()


def _settle(config: ClusterConfig, nodes: dict[str, Node], live: list[str], timeout: float = 600) -> None:
    """Wait until every shard is sealed, published and served by its owners among ``live``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with StoreClient(nodes["one"].address) as one:
            sealed = one.collection_info("bench")["growing"] == 0
        state = _state(config)
        entries = state.published.get("bench", {})
        with StoreClient(nodes["one"].address) as one:
            shards = one.collection_info("bench")["shards"]
        if sealed and len(entries) == shards and sorted(state.members) == sorted(live) and all(
                all(s in state.ready(o, "bench") for o in owners(live, "bench", s)) for s in entries):
            return
        time.sleep(0.5)
    raise TimeoutError("the cluster did not settle")


def measure_fanout(bench: Bench, case: SearchCase) -> dict[str, float]:
    search: Search = bench.state[SEARCH]
    address = search.nodes["n2" if case.system == "cluster" else "one"].address
    done, calls, started = 0, 0, time.perf_counter()
    with StoreClient(address) as client:
        client.search("bench", search.queries[: case.nq], k=K)  # warm: connections, plans, pages
        started = time.perf_counter()
        while time.perf_counter() - started < search.seconds:
            batch = search.queries[(calls * case.nq) % 900:][: case.nq]
            found = client.search("bench", batch, k=K)
            assert not found.partial, found.missing
            done, calls = done + len(batch), calls + 1
    return {"QPS": done / (time.perf_counter() - started)}


def measure_takeover(bench: Bench, case: SearchCase) -> dict[str, float]:
    """Seconds from a SIGKILL to complete results (ours), or TTL + fetch of the victim's shards (model).
    Ours leaves the cluster as it found it: n1 leaves cleanly first (so that only owners serve), n3 is
    killed and timed, then both start again and the cluster settles."""
    search: Search = bench.state[SEARCH]
    entries = _state(search.config).published["bench"]
    victim_shards = [e for s, e in entries.items() if owners(["n2", "n3"], "bench", s) == ["n3"]]
    if case.system == "model":
        return {"seconds": search.ttl + _fetch_seconds(search, victim_shards)}
    n1, n2, n3 = (search.nodes[n] for n in ("n1", "n2", "n3"))
    n1.stop()
    _settle(search.config, search.nodes, ["n2", "n3"])
    queries = search.queries[:10]
    n3.stop(signal.SIGKILL)
    killed = time.perf_counter()
    with StoreClient(n2.address) as client:
        while client.search("bench", queries, k=K).partial:
            time.sleep(0.02)
    took = time.perf_counter() - killed
    n3.start()
    n1.start()
    _settle(search.config, search.nodes, ["n1", "n2", "n3"])
    return {"seconds": took, "shards": float(len(victim_shards))}


def _fetch_seconds(search: Search, entries: list[Any]) -> float:
    scratch = search.nodes["n2"].data.parent / "fetch-model"
    scratch.mkdir(exist_ok=True)
    started = time.perf_counter()
    for entry in entries:
        for obj in entry.objects:
            search.objects.fetch(obj.key, scratch / f"{entry.shard_id}-{obj.name}", size=obj.size, crc=obj.crc32c)
    took = time.perf_counter() - started
    shutil.rmtree(scratch, ignore_errors=True)
    return took


def describe(search: Search) -> dict[str, Any]:
    with StoreClient(search.nodes["one"].address) as one:
        info = one.collection_info("bench")
    return {"rows": info["rows"], "shards": info["shards"], "dim": DIM, "k": K, "ttl_s": search.ttl,
            "owned": {n: len([s for s in range(1, info["shards"] + 1) if owners(["n1", "n2", "n3"], "bench", s) == [n]])
                      for n in ("n1", "n2", "n3")}}
