"""The search plan (routing.py): every row asked exactly once, what nobody can answer named."""

from __future__ import annotations

from shardmgr.cluster.mirror import ClusterState
from shardmgr.cluster.placement import ranked
from shardmgr.cluster.routing import holder_missing, plan
from shardmgr.cluster.shard_map import ShardEntry


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
