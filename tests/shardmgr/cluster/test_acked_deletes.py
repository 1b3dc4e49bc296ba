"""Acknowledged deletes held until published (acked_deletes.py), without servers: what a writer says
of a delete it wrote, when a watched state shows the rows published, and the answer's parts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from shardmgr.cluster.acked_deletes import Acked, AckedDeletes, decode, encode, written
from shardmgr.cluster.extras import DeletesEntry
from shardmgr.cluster.mirror import EMPTY, ClusterState
from shardmgr.cluster.shard_map import ShardObject
from shardmgr.errors import RowDeleted
from shardmgr.store.refs import ref_of
from shardmgr.store.view import View


def key(shard_id: int, deleted: int, node: str) -> DeletesEntry:
    return DeletesEntry("c", shard_id, ShardObject("deletes", f"k{deleted}", 1, 0), deleted, node=node)


def with_keys(*keys: DeletesEntry, seen: dict[int, dict[str, int]] | None = None) -> ClusterState:
    by = seen if seen is not None else {k.shard_id: {k.node: k.deleted} for k in keys}
    return dataclasses.replace(EMPTY, deletes={"c": {k.shard_id: k for k in keys}}, deletes_by={"c": by})


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
