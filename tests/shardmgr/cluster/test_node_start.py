"""How a node starts (docs/cluster.md, "Running a node"), with real
``shardmgr serve --cluster`` processes: the node id is held before any port
opens, a live holder of it refuses the start at once, naming it, while this
data directory's own previous run is waited for, and said so; a start
without a working object store, or with a wrong etcd address, is refused in
one line naming the cause; a taken metrics port ends the start before any
port opens or anything is written to etcd.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
import threading
from pathlib import Path

import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.membership import DATA_ID_FILE, Membership
from shardmgr.cluster.state.watch import PrefixWatch, WatchEvent
from shardmgr.cluster.testing.loopback import free_ports
from shardmgr.server.readiness import NotReady
from tests.shardmgr.cluster.nodes import node
from tests.shardmgr.server.serverproc import ServerProcess


def members(config: ClusterConfig) -> dict[str, str]:
    return {m.node_id: m.address for m in Membership(config).members()[0]}


def refused(proc: ServerProcess) -> str:
    """Start ``proc``, which must exit before it is ready; its last log line (what ``serve`` printed)."""
    with pytest.raises(NotReady):
        proc.start()
    assert proc.proc is not None and proc.proc.returncode == 1, proc.log
    return proc.log[-1]


def reachable(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_a_node_id_a_live_node_holds_is_refused_at_once_and_a_previous_run_of_the_same_directory_waited_for(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    n1 = node(tmp_path, "n1", cluster_config)
    started.append(n1)
    n1.start()
    port, metrics = free_ports(2)
    twin = node(tmp_path, "twin", cluster_config, metrics_port=metrics, extra=("--node-id", "n1"))
    twin.port = port
    started.append(twin)
    answered: list[int] = []
    said: list[str] = []
    starting = threading.Thread(target=lambda: said.append(refused(twin)))
    starting.start()
    while starting.is_alive():  # until it exits: neither of its ports ever takes a connection
        answered.extend(p for p in (port, metrics) if reachable(p))
        starting.join(0.02)
    assert said, twin.log
    assert answered == [], "a port opened before the node id was held"
    assert said[0].startswith("shardmgr serve: node id 'n1' is held by another live process (at "
                              f"{n1.address}, lease "), said[0]
    assert "another --node-id" in said[0] and not any("waiting" in line for line in twin.log)
    assert members(cluster_config) == {"n1": n1.address}  # the live node is untouched

    # n1 stopped; a key of its data directory left as by a crash (a lease not kept alive, ended by hand here
    # rather than by its TTL): the next start of n1 waits for that key, and says so
    n1.signal(signal.SIGTERM)
    assert n1.wait() == 0 and members(cluster_config) == {}
    previous = NodeLease(dataclasses.replace(cluster_config, lease_ttl_s=30), name="previous run").start()
    previous.stop_keepalive()
    own = json.loads((n1.data_dir / DATA_ID_FILE).read_bytes())["data_id"]
    Membership(cluster_config).join("n1", previous, n1.address, own)
    restarting = threading.Thread(target=n1.start)
    restarting.start()
    try:
        n1.wait_log("node id n1 is still held by this data directory's previous run .*: waiting for its lease "
                    "to expire", timeout=20)
        assert not n1.ready_file.exists()
    finally:
        previous.close()  # its key goes: the start goes on
        restarting.join(30)
    assert members(cluster_config) == {"n1": n1.address}


def test_a_start_without_a_working_object_store_or_etcd_is_refused_in_one_line(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    closed_s3, closed_etcd = free_ports(2)
    cases = {
        "SignatureDoesNotMatch": node(tmp_path, "wrong-secret", cluster_config,
                                      env={"AWS_SECRET_ACCESS_KEY": "not-the-secret"}),
        "no usable S3 credentials": node(tmp_path, "no-credentials", cluster_config,
                                         env={"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
                                              "AWS_EC2_METADATA_DISABLED": "true"}),
        "Could not connect to the endpoint URL": node(
            tmp_path, "no-s3", dataclasses.replace(cluster_config, s3_endpoint=f"http://127.0.0.1:{closed_s3}")),
        f"cannot reach etcd at 127.0.0.1:{closed_etcd}: connection refused": node(
            tmp_path, "no-etcd", dataclasses.replace(cluster_config, etcd_port=closed_etcd)),
    }
    started.extend(cases.values())
    said: dict[str, str] = {}
    threads = [threading.Thread(target=lambda w=want, p=proc: said.__setitem__(w, refused(p)))
               for want, proc in cases.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(said) == sorted(cases), [proc.log for proc in cases.values()]
    for want, line in said.items():
        assert want in line, line
        if "etcd" in want:
            assert line == f"shardmgr serve: {want}"  # the endpoint and the cause, no library text
        else:
            assert line.startswith("shardmgr serve: the object store refused a test write (a put and a delete), "
                                   "so this node could never publish: s3://"), line
    assert members(cluster_config) == {}  # the refused nodes left no member key behind


def test_a_taken_metrics_port_ends_the_start_before_the_node_id_is_held_or_a_port_opens(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    kv = Kv(cluster_config)
    try:
        before = kv.get_prefix(cluster_config.key(""))[1]
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()  # another process's metrics port
            metrics = taken.getsockname()[1]
            [port] = free_ports(1)
            n1 = node(tmp_path, "n1", cluster_config, metrics_port=metrics)
            n1.port = port
            started.append(n1)
            said, answered = [], []
            starting = threading.Thread(target=lambda: said.append(refused(n1)))
            starting.start()
            while starting.is_alive():  # until it exits: its service port never takes a connection
                answered.extend([port] if reachable(port) else [])
                starting.join(0.01)
        assert said and said[0].startswith(f"shardmgr serve: cannot bind the metrics port 127.0.0.1:{metrics}: "
                                           "Address already in use"), n1.log
        assert answered == []
        # nothing was written under the cluster's prefix since: every change from `before` on, up to a last
        # key of the test's own (so that the watch has caught up), is that key
        events: list[WatchEvent] = []
        caught_up = threading.Event()
        watch = PrefixWatch(cluster_config, cluster_config.key(""),
                            lambda e: (events.append(e), e.entry.key.endswith("/caught-up") and caught_up.set()),
                            start_revision=before + 1).start()
        try:
            kv.put(cluster_config.key("caught-up"), b"")
            assert caught_up.wait(30)
        finally:
            watch.stop()
        assert [e.entry.key for e in events] == [cluster_config.key("caught-up")], events
    finally:
        kv.close()
