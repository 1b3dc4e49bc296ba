"""Rendezvous placement: deterministic, balanced, and minimal movement."""

from __future__ import annotations

from collections import Counter

import pytest

from shardmgr.cluster.published.placement import assignment, owners, ranked, weight


def test_weight_is_stable_across_processes() -> None:
    # a fixed value: hash() would differ per process, BLAKE2b does not
    assert weight("n1", "docs", 7) == int.from_bytes(
        __import__("hashlib").blake2b(b"n1\0docs\x007", digest_size=8).digest(), "big")
    assert ranked(["a", "b", "c"], "docs", 7) == ranked(["c", "a", "b"], "docs", 7)


def test_owners_are_the_first_ranked_and_distinct() -> None:
    nodes = [f"n{i}" for i in range(5)]
    for shard in range(50):
        two = owners(nodes, "c", shard, replicas=2)
        assert len(set(two)) == 2 and two == ranked(nodes, "c", shard)[:2]
    assert owners(["only"], "c", 1, replicas=3) == ["only"]
    with pytest.raises(ValueError):
        owners(nodes, "c", 1, replicas=0)


def test_balance_and_minimal_movement_when_a_node_leaves() -> None:
    nodes = [f"n{i}" for i in range(4)]
    before = assignment(nodes, "c", range(4000))
    load = Counter(owner[0] for owner in before.values())
    assert all(800 <= load[n] <= 1200 for n in nodes), load
    after = assignment([n for n in nodes if n != "n2"], "c", range(4000))
    moved = [s for s in before if before[s][0] != after[s][0]]
    assert moved and all(before[s][0] == "n2" for s in moved)  # only the leaver's shards move
    grown = assignment(nodes + ["n4"], "c", range(4000))
    assert all(grown[s][0] in (before[s][0], "n4") for s in before)  # a joiner only takes shards


def test_verify_knows_the_cache_directory_by_the_cluster_name() -> None:
    from shardmgr.cluster.published.cache import CACHE_DIR
    from shardmgr.verification.runner import CLUSTER_CACHE

    assert CACHE_DIR == CLUSTER_CACHE
