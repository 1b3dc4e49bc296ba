"""Writer roles in one process against real etcd (roles.py): the writer
rule's answers, shard ids granted to the store, stepping down, and a role
this node won but did not record (its id reservation failed) taken up again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.errors import WriterElsewhere
from shardmgr.cluster.state.election import Election
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.membership import Membership
from shardmgr.cluster.writer.roles import WriterRoles
from shardmgr.errors import NoShardIds
from shardmgr.store.config import StoreConfig
from shardmgr.store.store import Store


def store_at(path: Path) -> Store:
    store = Store(path, StoreConfig(seal_bytes=4096, extent_bytes=4096))
    store.shard_ids_granted = True
    store.open()
    store.create_collection("c", 8)
    return store


def rows(seed: int) -> tuple[np.ndarray, np.ndarray]:
    return np.random.default_rng(seed).random((100, 8), dtype=np.float32), np.arange(100, dtype=np.int64)


def test_the_writer_rule_grants_ids_refuses_others_and_steps_down(etcd_config: ClusterConfig, tmp_path: Path) -> None:
    leases = [NodeLease(etcd_config, name=n).start() for n in ("a", "b")]
    stores = [store_at(tmp_path / n) for n in ("a", "b")]
    wakes: list[str] = []
    a, b = (WriterRoles(etcd_config, NodeConfig(shard_id_block=4), n, s, lease, lambda: wakes.append("wake"))
            for n, s, lease in zip(("a", "b"), stores, leases))
    try:
        Membership(etcd_config).join("a", leases[0], "10.0.0.1:7300")
        a.ensure("c")  # no writer: a campaigns, wins, reserves ids 1..4 and grants them
        assert set(a.held()) == {"c"} and stores[0].seam.shard_ids("c") == (1, 5)
        for seed in range(3):  # a shard per batch (3,200 bytes each): ids 1-3; the last half of the block wakes
            stores[0].append("c", *rows(seed))
            a.ensure("c")
        assert wakes and stores[0].seam.shard_ids("c") == (4, 5)
        a.maintain()  # the node's thread reserves the next block ahead
        assert stores[0].seam.shard_ids("c") == (4, 9)
        with pytest.raises(WriterElsewhere) as refused:
            b.ensure("c")
        assert refused.value.address == "10.0.0.1:7300" and b.counters["writes_refused_total"] == 1
        a.step_down("c", "a test")
        assert a.held() == {} and stores[0].seam.shard_ids("c") == (4, 4)
        with pytest.raises(NoShardIds):  # the growing shard is full: no new one may start
            stores[0].append("c", *rows(9))
        assert Election(etcd_config, "c").resign(Election(etcd_config, "c").current())  # as if a's lease ended
        b.ensure("c")
        assert stores[1].seam.shard_ids("c") == (9, 13)  # after every id a ever reserved
    finally:
        for roles in (a, b):
            roles.close()
        for store in stores:
            store.close()
        for lease in leases:
            lease.close()


def test_a_role_won_without_its_ids_is_taken_up_again(etcd_config: ClusterConfig, tmp_path: Path) -> None:
    lease = NodeLease(etcd_config, name="a").start()
    store = store_at(tmp_path / "a")
    roles = WriterRoles(etcd_config, NodeConfig(), "a", store, lease, lambda: None)
    try:
        won = Election(etcd_config, "c").try_acquire("a", lease)  # a campaign whose reservation then failed
        assert won[0]
        roles.ensure("c")
        assert roles.held()["c"] == won[1] and store.seam.shard_ids("c") == (1, 65)
    finally:
        roles.close()
        store.close()
        lease.close()
