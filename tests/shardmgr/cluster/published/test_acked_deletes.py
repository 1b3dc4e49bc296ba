"""Acknowledged deletes held until seen elsewhere (acked_deletes.py), without servers: what a writer
says of a delete it wrote, when a watched state shows the rows published and served fresh, which rows
each node asked is sent, the bound on what is held, its counts under concurrent holds, and the
answer's parts."""

from __future__ import annotations

import dataclasses
import sys
import threading

import numpy as np
import pytest

from shardmgr.cluster.errors import DeletesBacklog
from shardmgr.cluster.published.acked_deletes import Acked, AckedDeletes, asked, decode, encode, written
from shardmgr.cluster.published.mirror import EMPTY, ClusterState
from shardmgr.cluster.state.extras import DeletesEntry
from shardmgr.cluster.state.shard_map import ShardObject
from shardmgr.errors import RowDeleted
from shardmgr.store.refs import ref_of
from shardmgr.store.view import View


def key(shard_id: int, deleted: int, node: str) -> DeletesEntry:
    return DeletesEntry("c", shard_id, ShardObject("deletes", f"k{deleted}", 1, 0), deleted, node=node)


def with_keys(*keys: DeletesEntry, seen: dict[int, dict[str, int]] | None = None,
              serving: dict[str, dict[int, int]] | None = None) -> ClusterState:
    """A state with these deletes keys; ``serving``: live node -> the copies it serves (shard -> its deleted
    rows); by default each key's node serves its shard (a fresh copy: its own log)."""
    by = seen if seen is not None else {k.shard_id: {k.node: k.deleted} for k in keys}
    if serving is None:
        serving = {}
        for k in keys:
            serving.setdefault(k.node, {})[k.shard_id] = k.deleted
    return dataclasses.replace(EMPTY, deletes={"c": {k.shard_id: k for k in keys}}, deletes_by={"c": by},
                               members={node: f"{node}:1" for node in serving},
                               serving={node: {"c": frozenset(copies)} for node, copies in serving.items()},
                               copies={node: {"c": copies} for node, copies in serving.items()})


def view(shard_id: int, deleted: int, *, sealed: bool = True) -> View:
    return View(shard_id, 10, np.zeros((10, 2), np.float32), np.arange(10), sealed=sealed, deleted_count=deleted)


def test_rows_are_published_by_a_key_of_their_writer_with_as_many_rows_or_by_any_key_that_holds_them() -> None:
    only_writer = Acked(1, ref_of(1, np.array([2])), "w", count=3)
    assert not only_writer.published(with_keys(key(1, 10, "x")), "c")  # another node's key: may lack them
    assert not only_writer.published(with_keys(key(1, 2, "w")), "c")  # a copy taken before the delete
    assert only_writer.published(with_keys(key(1, 3, "w")), "c")
    # superseded in the same state by another node's key: the state remembers the writer's
    assert only_writer.published(with_keys(key(1, 9, "x"), seen={1: {"w": 4, "x": 9}}), "c")
    covered = Acked(1, ref_of(1, np.array([2])), "w", count=3, cover=3)  # the writer's copy was the published log
    assert covered.published(with_keys(key(1, 3, "x")), "c") and not covered.published(with_keys(key(1, 2, "x")), "c")
    assert not covered.published(EMPTY, "c")


def test_a_writer_holds_the_rows_of_sealed_shards_and_promises_a_key_where_only_its_own_can_say() -> None:
    refs = np.concatenate([ref_of(1, np.array([4, 1, 4])), ref_of(2, np.array([0])), ref_of(3, np.array([5])),
                           ref_of(9, np.array([0]))])
    views = [view(1, 3), view(2, 2), view(3, 1), view(4, 0, sealed=False)]
    state = with_keys(key(1, 3, "x"), key(2, 1, "w"))
    held, promised = written("c", refs, views, state, "w")
    assert [(a.shard_id, a.refs.tolist(), a.count, a.cover) for a in held] == [
        (1, ref_of(1, np.array([1, 4])).tolist(), 3, 3),  # as many rows as the key, whose log it merged: the same
        (2, ref_of(2, np.array([0])).tolist(), 2, 0),  # more than the key: the writer's next one holds them
        (3, ref_of(3, np.array([5])).tolist(), 1, 0)]  # no key yet (or not published)
    assert [a.shard_id for a in promised] == [2, 3]  # shard 9: not here, shard 4 would be growing


def test_held_refs_are_sent_until_a_state_shows_them_published_and_a_get_of_one_is_refused() -> None:
    acked = AckedDeletes()
    assert acked.refs("c", lambda: EMPTY) == (EMPTY, None)
    acked.hold("c", [Acked(1, ref_of(1, np.array([7, 2])), "w", 2), Acked(2, ref_of(2, np.array([1])), "w", 5)])
    assert acked.last() is not None and acked.last() is None  # once
    state, refs = acked.refs("c", lambda: EMPTY)
    assert state is EMPTY and refs is not None and refs.tolist() == sorted(ref_of(1, np.array([2, 7])).tolist()
                                                                           + ref_of(2, np.array([1])).tolist())
    with pytest.raises(RowDeleted, match=str(ref_of(2, np.array([1]))[0])):
        acked.check("c", np.array([ref_of(1, np.array([3]))[0], ref_of(2, np.array([1]))[0]]), refs)
    acked.check("c", ref_of(1, np.array([3])), refs)  # not held: the store answers
    _, refs = acked.refs("c", lambda: with_keys(key(1, 2, "w")))
    assert refs is not None and refs.tolist() == ref_of(2, np.array([1])).tolist() and acked.rows_held() == 1
    assert acked.refs("c", lambda: with_keys(key(2, 6, "w")))[1] is None and acked.rows_held() == 0


def test_the_answers_parts_round_trip_and_malformed_ones_are_refused() -> None:
    sent = [Acked(1, ref_of(1, np.array([1, 2])), "w", 4, 4), Acked(3, ref_of(3, np.array([0])), "w", 1)]
    got = decode(encode(sent), "w")
    assert [(a.shard_id, a.refs.tolist(), a.writer, a.count, a.cover) for a in got] == \
        [(a.shard_id, a.refs.tolist(), a.writer, a.count, a.cover) for a in sent]
    assert decode({}, "w") == [] and decode(encode([]), "w") == []
    parts = encode(sent)
    with pytest.raises(ValueError, match="malformed"):
        decode({**parts, "acked_refs": parts["acked_refs"][:1]}, "w")


def test_published_rows_are_kept_while_no_live_node_serves_a_fresh_copy_of_their_shard() -> None:
    acked = AckedDeletes()
    refs = ref_of(1, np.array([4]))
    acked.hold("c", [Acked(1, refs, "w", count=3)])
    published = key(1, 3, "w")
    # the writer published the key and died before any other copy installed it: only a stale copy is served
    _, held = acked.refs("c", lambda: with_keys(published, serving={"q": {1: 1}}))
    assert held is not None and held.tolist() == refs.tolist()
    _, held = acked.refs("c", lambda: with_keys(published, serving={"q": {1: 1}, "w": {2: 0}}))  # w: not shard 1
    assert held is not None and acked.rows_held() == 1 and acked.holds("c")
    _, held = acked.refs("c", lambda: with_keys(published, serving={"q": {1: 3}}))  # q installed the key's log
    assert held is None and acked.rows_held() == 0 and not acked.holds("c")


def test_only_the_held_rows_of_the_shards_asked_of_a_node_are_sent_to_it() -> None:
    held = np.sort(np.concatenate([ref_of(1, np.array([1, 2])), ref_of(2, np.array([0])), ref_of(5, np.array([3]))]))
    published = np.array([1, 2, 3], np.int64)  # shard 5 is not published: its rows are on a holder
    assert asked(held, (2,), False, published).tolist() == ref_of(2, np.array([0])).tolist()
    assert asked(held, (3,), False, published) is None
    assert asked(held, (1,), True, published).tolist() == \
        [*ref_of(1, np.array([1, 2])).tolist(), *ref_of(5, np.array([3])).tolist()]
    assert asked(None, (1,), True, published) is None


def test_a_delete_past_the_bound_is_refused_until_what_is_held_is_seen() -> None:
    woken: list[int] = []
    acked = AckedDeletes(max_rows=4, publish_now=lambda: woken.append(1))
    acked.admit()
    acked.hold("c", [Acked(1, ref_of(1, np.array([0])), "w", 1)])
    assert woken == []
    acked.hold("c", [Acked(2, ref_of(2, np.array([0])), "w", 1)])
    assert woken == [1]  # half the bound: the writer is asked to publish now
    acked.hold("d", [Acked(3, ref_of(3, np.array([0, 1])), "w", 2)])
    with pytest.raises(DeletesBacklog, match="holds 4 rows of acknowledged deletes.*max_held_deletes is 4"):
        acked.admit()
    assert acked.counters["deletes_refused_held_total"] == 1 and len(woken) == 3
    seen = with_keys(key(1, 1, "w"), key(2, 1, "w"))
    acked.states = lambda: seen  # collection c's rows are seen elsewhere now: admit drops them first
    acked.admit()
    assert acked.rows_held() == 2 and acked.holds("d") and not acked.holds("c")


def test_concurrent_holds_lose_no_count() -> None:
    acked = AckedDeletes()
    threads, holds = 8, 1500
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: a lost update would show
    try:
        def holder(n: int) -> None:
            for i in range(holds):
                acked.hold(f"c{n}", [Acked(i, ref_of(i, np.array([0])), "w", 1)])

        workers = [threading.Thread(target=holder, args=(n,)) for n in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(before)
    assert acked.counters["acked_deletes_held_total"] == threads * holds
    assert acked.rows_held() == threads * holds
