"""The search plan (routing.py): every row asked exactly once, of copies that hold the newest published
deletes, what nobody can answer named."""

from __future__ import annotations

import dataclasses

from shardmgr.cluster.published.mirror import ClusterState
from shardmgr.cluster.published.placement import ranked
from shardmgr.cluster.query.routing import Ask, holder_missing, plan, shard_missing, shard_stale
from shardmgr.cluster.state.extras import DeletesEntry
from shardmgr.cluster.state.shard_map import ShardEntry, ShardObject


def state(members: list[str], shards: list[int], serving: dict[str, list[int]], holders: list[str],
          writer: str | None = None) -> ClusterState:
    entries = {i: ShardEntry("c", i, 10, ()) for i in shards}
    return ClusterState(1, {m: f"{m}:1" for m in members}, {"c": entries}, {"c": dict.fromkeys(holders, False)},
                        {n: {"c": frozenset(ids)} for n, ids in serving.items()},
                        {"c": writer} if writer else {})


def test_each_shard_goes_to_its_best_ranked_ready_node_and_the_rest_are_alternates() -> None:
    s = state(["a", "b", "c"], [1, 2, 3, 4], {"a": [1, 2, 3, 4], "b": [1, 3], "c": [2, 4]}, ["a"], writer="a")
    p = plan(s, "c")
    asked = sorted(i for ask in p.asks.values() for i in ask.shards)
    assert asked == [1, 2, 3, 4]  # each once
    for node, ask in p.asks.items():
        for shard in ask.shards:
            ready = [n for n in ("a", "b", "c") if shard in s.ready(n, "c")]
            assert [node, *p.alternates[shard]] == ranked(ready, "c", shard)
    assert p.asks["a"].unpublished and not any(a.unpublished for n, a in p.asks.items() if n != "a")
    assert p.published.tolist() == [1, 2, 3, 4] and p.missing == ()


def test_unserved_shards_and_dead_holders_are_named() -> None:
    s = state(["b"], [1, 2], {"b": [1]}, ["a", "b"])
    p = plan(s, "c")
    assert p.asks["b"].shards == (1,) and p.asks["b"].unpublished
    assert len(p.missing) == 2
    assert "shard 2" in p.missing[0] and "node a" in p.missing[1]


def test_a_collection_nobody_holds_is_an_empty_complete_plan() -> None:
    p = plan(state(["a"], [], {}, []), "c")
    assert p.asks == {} and p.missing == () and len(p.published) == 0


def test_a_dead_holder_that_was_clean_is_not_missing() -> None:
    s = ClusterState(1, {"b": "b:1"}, {"c": {}}, {"c": {"a": True, "d": False}}, {}, {})
    assert plan(s, "c").missing == (holder_missing("d"),)


def test_copies_without_the_newest_published_deletes_are_asked_only_when_no_other_is_served() -> None:
    key = DeletesEntry("c", 1, ShardObject("deletes", "k", 1, 0), 5, node="a")
    base = state(["a", "b", "c"], [1], {"a": [1], "b": [1], "c": [1]}, [])
    copies = {"b": {"c": {1: 3}}, "c": {"c": {1: 5}}}  # b's copy lacks 2 of the key's rows; a published the key
    s = dataclasses.replace(base, deletes={"c": {1: key}}, copies=copies)
    assert [s.fresh(n, "c", 1) for n in ("a", "b", "c")] == [True, False, True]
    p = plan(s, "c")
    assert sorted([p.served_by[1], *p.alternates[1]]) == ["a", "c"] and p.missing == ()

    only_stale = dataclasses.replace(s, serving={"b": {"c": frozenset({1})}})
    p = plan(only_stale, "c")
    assert p.served_by[1] == "b" and p.missing == (shard_stale(1),)  # answered, and said to be so
    assert plan(dataclasses.replace(only_stale, deletes={}), "c").missing == ()  # no deletes key: every copy is


def test_a_published_shard_no_node_serves_yet_is_asked_of_its_live_publisher() -> None:
    base = state(["a", "b"], [1, 2], {"b": [2]}, ["a"], writer="a")
    entries = {i: dataclasses.replace(e, writer="a") for i, e in base.published["c"].items()}
    p = plan(dataclasses.replace(base, published={"c": entries}), "c")
    assert p.asks["a"] == Ask((1,), True) and p.asks["b"] == Ask((2,), False)
    assert p.alternates[1] == () and p.missing == ()
    gone = dataclasses.replace(base, published={"c": entries}, members={"b": "b:1"})
    assert plan(gone, "c").missing == (shard_missing(1), holder_missing("a"))  # its publisher is not a member
    key = DeletesEntry("c", 1, ShardObject("deletes", "k", 1, 0), 5, node="b")
    stale = plan(dataclasses.replace(base, published={"c": entries}, deletes={"c": {1: key}}), "c")
    assert stale.served_by[1] == "a" and stale.missing == (shard_stale(1),)  # b's deletes: a's copy may lack them
