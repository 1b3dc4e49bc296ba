"""Rows by ref from any node: ``get`` and ``ids`` across the cluster.

A ref names its shard (refs.py), so the node that receives ``shardmgr.get``
first refuses a row it acknowledged as deleted and has not seen published
(acked_deletes.py: RowDeleted, as one store answers), then answers the refs
of shards it has itself (its own, or cached, in copies that hold their
newest published deletes: mirror.py, fresh) and asks for the rest where a
search would (routing.py): a published shard of the node
the plan gives it, then its alternates; a shard not published, of each live
holder in turn. Each node answers ``shardmgr.get_shards`` with the rows it
has and says which it has not.

Errors: a peer's own answer (UnknownRef, RowDeleted, ...) is the answer.
Refs that no node answered for raise ShardsUnavailable naming their shards
(retryable) when a node that may hold them did not answer or the plan
lacks some shards or holders; otherwise they are unknown (UnknownRef), as
on one node.

Threads: connection threads, concurrently; peer calls on the fan-out pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from common.wire.errors import ServiceError, Unavailable
from shardmgr.cluster.errors import ShardsUnavailable
from shardmgr.cluster.query.fanout import FanOut
from shardmgr.cluster.query.routing import Plan
from shardmgr.errors import UnknownRef
from shardmgr.store import (
    GET_SECONDS_PER_ROW,  # a peer get's allowance, as a client's
    inputs,
    split_refs,
)


class Lookup:
    """Reads rows by ref wherever they are (module docstring)."""

    def __init__(self, fanout: FanOut) -> None:
        self.fanout = fanout

    def rows(self, name: str, refs: object) -> tuple[np.ndarray, np.ndarray]:
        """(vectors [n, dim], ids [n]) of ``refs``, as Store.rows answers them."""
        checked = inputs.refs(refs, self.fanout.store.config.max_batch_rows)
        state, deleted = self.fanout.acked.refs(name, self.fanout.mirror.state)
        self.fanout.acked.check(name, checked, deleted)
        shards, _ = split_refs(checked)
        published = state.published.get(name, {})
        me = self.fanout.node_id
        stale = [s for s in np.unique(shards).tolist() if s in published and not state.fresh(me, name, s)]
        vectors, ids, here = self.fanout.local.rows(name, checked, elsewhere=stale)
        if here.all():
            return vectors, ids
        the_plan = self.fanout.plan(name, state)
        tried: dict[int, int] = {}
        unreachable: list[str] = []
        while not here.all():
            asks = self._next_asks(the_plan, np.unique(shards[~here]).tolist(), tried)
            if not asks:
                break
            for node, wanted in asks.items():
                mine = np.flatnonzero(np.isin(shards, wanted) & ~here)
                got = self._ask(node, name, checked[mine])
                if got is None:
                    unreachable.append(node)
                else:
                    found = got[2]
                    vectors[mine[found]], ids[mine[found]], here[mine[found]] = got[0][found], got[1][found], True
        if not here.all():
            self._missing(name, the_plan, np.unique(shards[~here]).tolist(), unreachable)
        return vectors, ids

    def _next_asks(self, the_plan: Plan, shards: Sequence[int], tried: dict[int, int]) -> dict[str, list[int]]:
        """Each shard still wanted, to its next candidate node (none left: not asked again)."""
        asks: dict[str, list[int]] = {}
        for shard_id in shards:
            candidates = self._candidates(the_plan, shard_id)
            used = tried.get(shard_id, 0)
            if used < len(candidates):
                tried[shard_id] = used + 1
                asks.setdefault(candidates[used], []).append(shard_id)
        return asks

    def _candidates(self, the_plan: Plan, shard_id: int) -> list[str]:
        me = self.fanout.node_id
        serving = the_plan.served_by.get(shard_id)
        if serving is not None:
            return [n for n in (serving, *the_plan.alternates.get(shard_id, ())) if n != me]
        return [node for node, ask in sorted(the_plan.asks.items()) if ask.unpublished and node != me]

    def _ask(self, node: str, name: str, refs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The node's answer, or None if it could not be reached (its error if it answered one)."""
        address = self.fanout.mirror.state().members.get(node)
        if not address:
            return None
        timeout = self.fanout.peers.options["timeout"] + len(refs) * GET_SECONDS_PER_ROW
        try:
            with self.fanout.peers.client(address) as client:
                reply = client.call("shardmgr.get_shards", {"name": name}, {"refs": refs}, timeout=timeout)
        except Unavailable:
            self.fanout.counters["peer_failures_total"] += 1
            return None
        except ServiceError:
            raise  # the peer's answer about these rows
        except OSError:
            self.fanout.counters["peer_failures_total"] += 1
            return None
        parts = reply.parts
        return parts["vectors"], parts["ids"], parts["here"].astype(bool)

    def _missing(self, name: str, the_plan: Plan, shards: Sequence[int], unreachable: list[str]) -> None:
        """Raise for refs nobody answered: unavailable if a node that may have them did not answer (or
        the plan lacks some shards or holders), else unknown."""
        if unreachable or the_plan.missing:
            why = [f"node(s) {', '.join(sorted(set(unreachable)))} did not answer"] if unreachable else []
            raise ShardsUnavailable(f"collection {name!r}: no live node can serve shard(s) {list(shards)[:10]} now "
                                    f"({'; '.join([*why, *the_plan.missing[:3]])}); retry")
        raise UnknownRef(f"collection {name!r}: no stored row in shard(s) {list(shards)[:10]}")
