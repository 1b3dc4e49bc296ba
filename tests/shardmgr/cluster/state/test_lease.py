"""NodeLease against a real etcd: kept alive past its TTL by its thread, and
lost (flag, callback, local deadline) when etcd ends it or stops answering."""

from __future__ import annotations

import threading
import time

import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import LeaseLost
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.lease import NodeLease
from tests.cluster_servers import EtcdServer


def test_the_keepalive_thread_holds_the_lease_past_its_ttl_and_close_revokes_it(etcd_config: ClusterConfig) -> None:
    kv = Kv(etcd_config)
    lease = NodeLease(etcd_config, name="n1").start()
    try:
        kv.put(etcd_config.key("held"), b"x", lease.id)
        time.sleep(lease.ttl_s + 0.8)  # past the TTL: only the keepalives keep the key
        assert lease.alive() and kv.get(etcd_config.key("held")) is not None
        lease.check()
    finally:
        lease.close()
    assert kv.get(etcd_config.key("held")) is None  # revoked: gone at once, not after the TTL
    assert lease.lost.is_set() and not lease.alive()
    with pytest.raises(LeaseLost):
        lease.check()


def test_a_lease_etcd_ended_is_seen_as_lost_with_its_callback(etcd_config: ClusterConfig) -> None:
    lease = NodeLease(etcd_config, name="n1").start()
    told = threading.Event()
    lease.on_lost(lambda gone: told.set() if gone is lease else None)
    Kv(etcd_config).revoke(lease.id)  # e.g. an operator, or etcd after an expiry the node slept through
    assert told.wait(timeout=lease.ttl_s + 1), "the keepalive did not notice the lease was gone"
    assert lease.lost.is_set() and not lease.alive()
    late = threading.Event()
    lease.on_lost(lambda _: late.set())  # registered after the loss: runs at once
    assert late.is_set()
    lease.close()


def test_keepalives_failing_past_the_ttl_mean_lost_even_before_etcd_answers_again(
        etcd: EtcdServer, etcd_config: ClusterConfig) -> None:
    lease = NodeLease(etcd_config, name="n1").start()
    told = threading.Event()
    lease.on_lost(lambda _: told.set())
    etcd.pause()  # SIGSTOP: connections hang, every keepalive times out
    try:
        began = time.monotonic()
        assert told.wait(timeout=lease.ttl_s + 2), "keepalives failed for a whole TTL, yet no loss was reported"
        # Never later than the TTL (plus one request timeout): the node stops acting before etcd
        # could have given its keys to someone else.
        assert time.monotonic() - began <= lease.ttl_s + etcd_config.etcd_timeout_s + 0.5
        assert not lease.alive()
    finally:
        etcd.resume()
    lease.close()

