"""Writer election against a real etcd: one winner among racing nodes, the
losers learn who won, and a winner paused past its TTL is replaced and
fenced out of the shard map."""

from __future__ import annotations

import threading
import time

import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import LeaseLost, NotWriter
from shardmgr.cluster.state.election import Election, Writer
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.shard_map import ShardEntry, ShardMap, ShardObject


def entry(shard_id: int, rows: int = 10) -> ShardEntry:
    return ShardEntry(collection="docs", shard_id=shard_id, rows=rows,
                      objects=(ShardObject(name="payload", key=f"k/{shard_id}", size=rows * 16, crc32c=7),))


def test_exactly_one_of_racing_nodes_wins_and_the_others_learn_who(etcd_config: ClusterConfig) -> None:
    nodes = [f"node-{i}" for i in range(6)]
    leases = {n: NodeLease(etcd_config, name=n).start() for n in nodes}
    outcomes: dict[str, tuple[bool, Writer | None]] = {}
    start = threading.Barrier(len(nodes))

    def campaign(node: str) -> None:
        election = Election(etcd_config, "docs")  # each node its own client, as on separate machines
        start.wait(timeout=10)
        outcomes[node] = election.try_acquire(node, leases[node])

    threads = [threading.Thread(target=campaign, args=(n,)) for n in nodes]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        winners = [n for n, (won, _) in outcomes.items() if won]
        assert len(outcomes) == len(nodes) and len(winners) == 1, outcomes
        winner = outcomes[winners[0]][1]
        assert winner is not None and (winner.node_id, winner.lease) == (winners[0], leases[winners[0]].id)
        assert all(w == winner for _, w in outcomes.values())  # every loser was told the same winner
        assert Election(etcd_config, "docs").current() == winner
        assert Election(etcd_config, "other").current() is None  # one election per collection
    finally:
        for lease in leases.values():
            lease.close()


def test_a_writer_paused_past_its_ttl_is_replaced_and_fenced_out(etcd_config: ClusterConfig) -> None:
    old_lease, new_lease = NodeLease(etcd_config, name="a").start(), NodeLease(etcd_config, name="b").start()
    try:
        old = Election(etcd_config, "docs").campaign("node-a", old_lease, timeout_s=2)
        assert old is not None
        ShardMap(etcd_config, "docs").publish(old, entry(1))  # while it is the writer, it publishes
        old_lease.stop_keepalive()  # node-a is paused (SIGSTOP): nothing renews its lease
        began = time.monotonic()
        new = Election(etcd_config, "docs").campaign("node-b", new_lease, timeout_s=old_lease.ttl_s + 5)
        assert new is not None and new.node_id == "node-b", new
        # node-a's own clock told it the lease was over no later than etcd gave the role away.
        assert not old_lease.alive()
        assert old_lease.lost.is_set()  # and once seen, the loss is final
        assert time.monotonic() - began <= old_lease.ttl_s + 2
        assert new.revision > old.revision  # tenures are ordered: a later writer has a larger token
        shards = ShardMap(etcd_config, "docs")
        with pytest.raises(NotWriter, match="node-a"):
            shards.publish(old, entry(2))  # node-a wakes up and tries: refused by etcd, whatever it believes
        assert shards.publish(new, entry(2)) > 0
        published, _ = shards.read()
        assert sorted(published) == [1, 2]
        assert (published[1].writer, published[2].writer) == ("node-a", "node-b")
        assert published[2].writer_revision == new.revision
        with pytest.raises(LeaseLost):
            Election(etcd_config, "docs").try_acquire("node-a", old_lease)  # it cannot campaign on a dead lease
    finally:
        old_lease.close()
        new_lease.close()


def test_resigning_hands_over_at_once_and_never_ends_a_later_tenure(etcd_config: ClusterConfig) -> None:
    a, b = NodeLease(etcd_config, name="a").start(), NodeLease(etcd_config, name="b").start()
    election = Election(etcd_config, "docs")
    try:
        first = election.campaign("node-a", a, timeout_s=2)
        assert first is not None and election.holds(first)
        assert election.campaign("node-b", b, timeout_s=0) is None  # taken: one try, no wait
        assert election.resign(first)
        second = election.campaign("node-b", b, timeout_s=2)
        assert second is not None and not election.holds(first) and election.holds(second)
        assert not election.resign(first)  # a stale token cannot remove the new writer
        assert election.current() == second
        with pytest.raises(NotWriter):
            ShardMap(etcd_config, "docs").publish(first, entry(1))
    finally:
        a.close()
        b.close()
