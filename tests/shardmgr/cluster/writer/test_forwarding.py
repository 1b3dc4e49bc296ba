"""Forwarded writes and ``shardmgr.connect_cluster``, with real ``shardmgr
serve --cluster`` processes (docs/cluster.md, "Forwarded writes and
connect_cluster").

- An append or delete sent to a node that is not the writer is forwarded:
  the refs come back, the rows are on the writer (searchable there), none
  on the forwarding node; ``durable`` reaches the writer; the writer's
  errors come back with their code and message; a request already
  forwarded once is refused, not forwarded again.
- The writer SIGKILLed: the forwarding node answers ``writer_unreachable``
  naming it; after the lease's TTL another node takes the role and
  forwarded appends resume.
- With tokens on, a node forwards with ``SHARDMGR_NODE_TOKEN``; without it
  the writer refuses it, which the client sees as ``forward_denied``.
- ``connect_cluster``: a dead member first in line is passed over; writes go
  to the writer directly, and follow the role when it moves; an append
  whose answer does not come is not sent again; a write refused with
  ``writer_elsewhere`` (by a stand-in node, in process) is sent once more
  to the address named, and no further.
"""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

import shardmgr
from common.wire.client import RpcClient, TimedOut
from common.wire.component import Component, Request
from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import ForwardDenied, WriterElsewhere, WriterUnreachable
from shardmgr.cluster.state.catalog import Catalog, CollectionMeta
from shardmgr.cluster.state.election import Election
from shardmgr.cluster.state.kv import Kv
from shardmgr.errors import ShardmgrError
from shardmgr.server.auth import add_token
from shardmgr.server.config import ServerConfig
from shardmgr.server.server import Server
from shardmgr.store.client import StoreClient
from tests.shardmgr.cluster.nodes import DIM, ROWS, batches, node, start_all, wait_for
from tests.shardmgr.server.certs import make_pki
from tests.shardmgr.server.serverproc import ServerProcess


def cluster_stats(proc: ServerProcess, **options: str) -> dict[str, int]:
    with RpcClient(proc.address, **options) as rpc:  # type: ignore[arg-type]
        stats = rpc.call("stats").result
    return {**stats["cluster"], "flush_rounds": stats["flusher"]["rounds_total"]}


def writer_of(config: ClusterConfig, collection: str) -> str | None:
    writer = Election(config, collection).current()
    return writer.node_id if writer is not None else None


def test_writes_sent_to_a_non_writer_are_forwarded_to_the_writer_once(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    n1 = node(tmp_path, "n1", cluster_config, flush_interval_ms=60_000)  # only a durable write makes it flush
    n2 = node(tmp_path, "n2", cluster_config)
    start_all(started, [n1, n2])
    (first, first_ids), (second, second_ids), (third, third_ids) = batches(3)
    with StoreClient(n1.address) as writer, StoreClient(n2.address) as other:
        writer.create_collection("c", dim=DIM)  # created here: n1 campaigns and writes c
        assert writer_of(cluster_config, "c") == "n1"
        refs = other.append("c", first, first_ids)
        rounds = cluster_stats(n1)["flush_rounds"]
        refs = np.concatenate([refs, other.append("c", second, second_ids)])
        assert cluster_stats(n1)["flush_rounds"] == rounds  # not durable: no flush before the next in a minute
        refs = np.concatenate([refs, other.append("c", third, third_ids, durable=True)])
        assert cluster_stats(n1)["flush_rounds"] > rounds  # durable=True reached the writer, which flushed
        assert refs.shape == (3 * ROWS,) and len(set(refs.tolist())) == 3 * ROWS
        assert writer.collection_info("c")["here"]["rows"] == 3 * ROWS
        assert other.collection_info("c")["here"]["rows"] == 0
        vectors = np.concatenate([first, second, third])
        assert np.array_equal(writer.get("c", refs), vectors)  # the refs name the writer's rows
        _, found_ids, found_refs = writer.search("c", third[:5], k=1)
        assert found_ids[:, 0].tolist() == third_ids[:5].tolist()
        assert found_refs[:, 0].tolist() == refs[2 * ROWS:2 * ROWS + 5].tolist()

        assert other.delete("c", refs[:10], durable=True) == 10  # deletes are forwarded too
        assert other.delete_ids("c", second_ids[:5]) == 5
        assert writer.collection_info("c")["here"]["deleted"] == 15

        wrong = np.ones((2, DIM + 1), dtype=np.float32)  # the writer's error comes back as it is
        with pytest.raises(ShardmgrError) as direct:
            writer.append("c", wrong, np.arange(2))
        with pytest.raises(ShardmgrError) as forwarded:
            other.append("c", wrong, np.arange(2))
        assert (forwarded.value.code, forwarded.value.message) == (direct.value.code, direct.value.message)
        assert forwarded.value.code == "shardmgr.bad_vectors"
    assert cluster_stats(n2)["writes_forwarded_total"] == 6  # 3 appends, 2 deletes, the refused append

    with RpcClient(n2.address) as rpc:  # a request forwarded once is refused, never forwarded again
        with pytest.raises(WriterElsewhere) as refused:
            rpc.call("shardmgr.append", {"name": "c", "forwarded": True}, {"vectors": first, "ids": first_ids})
    assert refused.value.address == n1.address
    assert cluster_stats(n2)["writes_forwarded_total"] == 6
    with StoreClient(n1.address) as writer:
        assert writer.collection_info("c")["here"]["rows"] == 3 * ROWS - 15


def test_a_killed_writer_gives_a_retryable_error_then_forwarding_resumes_to_the_next_writer(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    nodes = [node(tmp_path, f"n{i}", cluster_config) for i in (1, 2, 3)]
    start_all(started, nodes)
    n1, n2, n3 = nodes
    data = list(batches(4))
    with StoreClient(n1.address) as writer:
        writer.create_collection("c", dim=DIM)
        writer.append("c", *data[0], durable=True)
    n1.kill()  # SIGKILL: its writer and member keys live until its lease's TTL (2 s) has passed
    with StoreClient(n2.address) as other:
        with pytest.raises(WriterUnreachable) as unreachable:
            other.append("c", *data[1])
        assert unreachable.value.code == "shardmgr.cluster.writer_unreachable"
        assert unreachable.value.address == n1.address and "nothing was written" in unreachable.value.message

    def appended_on_n3() -> bool:
        with StoreClient(n3.address) as third:
            try:
                return len(third.append("c", *data[2], durable=True)) == ROWS
            except WriterUnreachable:  # n1's key is still there
                return False

    wait_for("n3 to take the writer role once n1's lease ended", appended_on_n3, timeout=10, every=0.25)
    assert writer_of(cluster_config, "c") == "n3"
    with StoreClient(n2.address) as other:  # forwarding resumes, to the new writer
        refs = other.append("c", *data[3], durable=True)
    with StoreClient(n3.address) as third:
        assert third.collection_info("c")["here"]["rows"] == 2 * ROWS
        assert np.array_equal(third.get("c", refs), data[3][0])
    assert cluster_stats(n2)["forwards_failed_total"] == 1


def test_forwarding_with_tokens_and_mutual_tls_uses_the_node_credentials(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    pki = make_pki(tmp_path / "pki")
    tokens = tmp_path / "tokens"
    node_token = add_token(tokens, "nodes", ["read", "write"])
    client_token = add_token(tokens, "app", ["write", "read"])
    secured = ("--auth-file", str(tokens), "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
               "--tls-client-ca", str(pki.ca))
    forward_tls = (f'forward_ca = "{pki.ca}"\nforward_cert = "{pki.client_cert}"\n'
                   f'forward_key = "{pki.client_key}"\n')
    with_token = {"SHARDMGR_NODE_TOKEN": node_token}
    nodes = [node(tmp_path, "n1", cluster_config, extra=secured, env=with_token, node_settings=forward_tls),
             node(tmp_path, "n2", cluster_config, extra=secured, env=with_token, node_settings=forward_tls),
             node(tmp_path, "n3", cluster_config, extra=secured, node_settings=forward_tls)]  # no node token
    start_all(started, nodes)
    n1, n2, n3 = nodes
    (first, first_ids), (second, second_ids) = batches(2)
    options = {"token": client_token, "ca": pki.ca, "client_cert": pki.client_cert, "client_key": pki.client_key}
    with StoreClient(n1.address, **options) as writer:
        writer.create_collection("c", dim=DIM)
        with StoreClient(n2.address, **options) as other:
            refs = other.append("c", first, first_ids, durable=True)
            # n2's get and search ask n1 (which holds these rows) with the node's credentials too
            assert np.array_equal(other.get("c", refs), first)
            found = other.search("c", first[:3], k=1)
            assert not found.partial and np.array_equal(found.refs[:, 0], refs[:3])
        assert np.array_equal(writer.get("c", refs), first)
        with StoreClient(n3.address, **options) as bare:
            with pytest.raises(ForwardDenied) as denied:
                bare.append("c", second, second_ids)
        assert denied.value.code == "shardmgr.cluster.forward_denied"
        assert "SHARDMGR_NODE_TOKEN" in denied.value.message and "unauthenticated" in denied.value.message
        assert writer.collection_info("c")["here"]["rows"] == ROWS


def dead_address() -> str:
    """A loopback address nothing listens on (a port just bound and released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_connect_cluster_passes_over_a_dead_member_and_writes_to_the_writer(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    n1 = node(tmp_path, "n1", cluster_config)
    n2 = node(tmp_path, "n2", cluster_config)
    start_all(started, [n1, n2])
    kv = Kv(cluster_config)  # a member whose process is gone (its key not yet expired)
    kv.put(cluster_config.key("members", "a-dead"), f'{{"node": "a-dead", "address": "{dead_address()}"}}'.encode())
    data = list(batches(3))
    with shardmgr.connect_cluster(cluster_config.etcd_url, prefer="a-dead", retry_for=0.2) as client:
        assert client.create_collection("c", dim=DIM)["dim"] == DIM  # a-dead refused: retried on a live node
        assert "c" in client.collections()
        writer = wait_for("a writer for c", lambda: writer_of(cluster_config, "c"))
        refs = client.append("c", *data[0], durable=True)
        assert cluster_stats(n1)["writes_forwarded_total"] + cluster_stats(n2)["writes_forwarded_total"] == 0
        first = n1 if writer == "n1" else n2
        with StoreClient(first.address) as direct:
            assert np.array_equal(direct.get("c", refs), data[0][0])

        first.signal(signal.SIGTERM)  # a clean stop resigns the role: the next append goes elsewhere
        assert first.wait() == 0
        refs = client.append("c", *data[1], durable=True)
        second = n2 if first is n1 else n1
        assert writer_of(cluster_config, "c") == second.data_dir.name
        refs = np.concatenate([refs, client.append("c", *data[2])])
        assert np.array_equal(client.get("c", refs), np.concatenate([data[1][0], data[2][0]]))
        assert client.collection_info("c")["here"]["rows"] == 2 * ROWS  # reads moved to the live node too
        _, found_ids, found_refs = client.search("c", data[2][0][:3], k=1)
        assert found_ids[:, 0].tolist() == data[2][1][:3].tolist()
        assert found_refs[:, 0].tolist() == refs[ROWS:ROWS + 3].tolist()

        second.signal(signal.SIGSTOP)  # an append sent, then no answer: it may apply later, so it is not retried
        try:
            with pytest.raises(TimedOut):
                client.append("c", *data[0], timeout=0.5)
        finally:
            second.signal(signal.SIGCONT)
    kv.close()


class Refuser(Component):
    """A stand-in node that refuses every append with WriterElsewhere naming ``target``."""

    name = "refuser"

    def __init__(self) -> None:
        self.target = "unknown"
        self.appends = 0

    def commands(self) -> Iterable[str]:
        return ["shardmgr.append"]

    def handle(self, request: Request) -> None:
        self.appends += 1
        raise WriterElsewhere(f"collection {request.arg('name', str)!r} is written by another node, "
                              f"writer_address={self.target}")


def test_connect_cluster_sends_a_refused_write_once_more_to_the_address_the_refusal_names(
        cluster_config: ClusterConfig, tmp_path: Path, started: list[ServerProcess]) -> None:
    n1 = node(tmp_path, "n1", cluster_config)
    start_all(started, [n1])
    refuser = Refuser()
    stale = Server(ServerConfig(data_dir=tmp_path / "stale", port=0), [refuser])
    stale.start()
    try:
        address = f"127.0.0.1:{stale.address[1]}"
        kv = Kv(cluster_config)  # a member that refuses: what a node whose role just moved answers
        kv.put(cluster_config.key("members", "a-stale"), json.dumps({"node": "a-stale", "address": address}).encode())
        kv.close()
        catalog = Catalog(cluster_config)  # collections no node writes yet
        for name in ("c", "d"):
            catalog.publish(CollectionMeta(name, DIM, "l2", "flat"))
        catalog.kv.close()
        with StoreClient(n1.address) as direct:
            wait_for("n1 to know c and d", lambda: {"c", "d"} <= set(direct.collections()))
        (first, first_ids), (second, second_ids) = batches(2)
        with shardmgr.connect_cluster(cluster_config.etcd_url, prefer="a-stale") as client:
            refuser.target = n1.address
            refs = client.append("c", first, first_ids)  # no writer: sent to a-stale, refused, then to n1
            assert refuser.appends == 1 and writer_of(cluster_config, "c") == "n1"
            refs = np.concatenate([refs, client.append("c", second, second_ids)])  # straight to the writer now
            assert refuser.appends == 1
            with StoreClient(n1.address) as direct:  # (the client reads from a-stale, which serves no reads)
                assert np.array_equal(direct.get("c", refs), np.concatenate([first, second]))

            refuser.target = address  # a refusal naming the refuser itself: sent there once more, no further
            with pytest.raises(WriterElsewhere):
                client.append("d", first, first_ids)
            assert refuser.appends == 3 and writer_of(cluster_config, "d") is None
    finally:
        stale.stop()
