"""Membership against a real etcd: join once per node id, list, and watch
joins and leaves, including a node whose keepalives stop (its key expires
with its lease) and a watch that outlives an etcd restart; and a join whose
refusal names no holder, tried again after a pause until the deadline."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import BadClusterConfig
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.membership import Member, MemberEvent, Membership, NodeIdTaken, hold_id
from tests.cluster_servers import EtcdServer


def next_event(events: queue.Queue[MemberEvent], timeout: float) -> MemberEvent:
    try:
        return events.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no membership event within {timeout} s") from None


def test_join_list_and_leave(etcd_config: ClusterConfig) -> None:
    members = Membership(etcd_config)
    a, b = NodeLease(etcd_config, name="a").start(), NodeLease(etcd_config, name="b").start()
    try:
        joined = members.join("node-a", a, address="127.0.0.1:7300")
        members.join("node-b", b)
        assert (joined.node_id, joined.address, joined.lease) == ("node-a", "127.0.0.1:7300", a.id)
        live, revision = members.members()
        assert [m.node_id for m in live] == ["node-a", "node-b"] and revision >= joined.joined_revision
        with pytest.raises(NodeIdTaken, match="node-a"):
            members.join("node-a", b)  # one id, one live member: a second process cannot pose as it
        assert not members.leave("node-a", b)  # nor remove it
        assert members.leave("node-a", a)
        assert [m.node_id for m in members.members()[0]] == ["node-b"]
        with pytest.raises(BadClusterConfig):
            members.join("../x", a)
    finally:
        a.close()
        b.close()
    assert members.members()[0] == []  # revoking a lease removes its member key


def test_a_node_whose_keepalives_stop_is_seen_leaving_by_a_watcher(etcd_config: ClusterConfig) -> None:
    members = Membership(etcd_config)
    live, revision = members.members()
    events: queue.Queue[MemberEvent] = queue.Queue()
    watch = members.watch(events.put, start_revision=revision)
    lease = NodeLease(etcd_config, name="a").start()
    try:
        members.join("node-a", lease, address="h:1")
        event = next_event(events, 5)
        assert (event.kind, event.node_id) == ("joined", "node-a")
        assert event.member is not None and event.member.address == "h:1"
        stopped = time.monotonic()
        lease.stop_keepalive()  # the node hangs (SIGSTOP, a partition): its lease runs out
        event = next_event(events, lease.ttl_s + 5)
        waited = time.monotonic() - stopped
        assert (event.kind, event.node_id, event.member) == ("left", "node-a", None)
        # etcd expires a lease between its TTL and about TTL + 0.5 s after the last keepalive (anchor)
        assert lease.ttl_s - lease.ttl_s / 3 - 0.1 <= waited <= lease.ttl_s + 2, waited
        assert members.members()[0] == [] and not lease.alive()
    finally:
        watch.stop()
        lease.close()


def test_a_watch_resumes_after_etcd_restarts_and_misses_nothing(etcd: EtcdServer, etcd_config: ClusterConfig) -> None:
    members = Membership(etcd_config)
    events: queue.Queue[MemberEvent] = queue.Queue()
    watch = members.watch(events.put)
    first = NodeLease(etcd_config, name="first").start()
    second: NodeLease | None = None
    try:
        assert watch.connected.wait(5)
        members.join("before", first)
        assert next_event(events, 5).node_id == "before"
        etcd.kill()  # SIGKILL: the watch's stream breaks
        etcd.restart()
        second = NodeLease(etcd_config, name="second").start()
        members.join("after", second)  # likely made while the watch is still reconnecting
        seen = []
        while not seen or seen[-1] != ("joined", "after"):
            event = next_event(events, 10)
            seen.append((event.kind, event.node_id))
        # Resumed from the revision after the last delivered one: the earlier join is not repeated.
        assert ("joined", "before") not in seen, seen
    finally:
        watch.stop()
        first.close()
        if second is not None:
            second.close()


def test_a_join_refused_by_a_holder_that_cannot_be_read_is_tried_again_after_a_pause_until_the_deadline(
        etcd_config: ClusterConfig) -> None:
    """The race that leaves a refusal without its holder (its key ended between the transaction's two
    reads) cannot be made on demand with a real etcd: a Membership whose every join meets it stands in."""

    class Vanishing(Membership):
        calls = 0

        def join(self, node_id: str, lease: NodeLease, address: str = "", data: str = "") -> Member:
            self.calls += 1
            if self.calls > 1000:  # (what the loop without a pause or a deadline would do, stopped here)
                raise RuntimeError("joined again at once, over and over")
            raise NodeIdTaken(f"node id {node_id!r} is already a member (a lease that just ended)", holder=None)

    members = Vanishing(etcd_config)
    lease = NodeLease(etcd_config, name="n1")
    with pytest.raises(NodeIdTaken, match="within 0.3 s .join_timeout_s.: its key kept ending"):
        hold_id(members, "n1", lease, "127.0.0.1:1", "data", 0.3, threading.Event())
    assert 1 <= members.calls <= 10  # a pause of 0.1 s between tries, for 0.3 s
