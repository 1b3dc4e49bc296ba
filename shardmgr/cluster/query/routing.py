"""Where a search of one collection goes: the plan a coordinating node makes
from its :class:`ClusterState` (mirror.py), with no etcd request.

Every row of a collection is in one of two places (mirror.py): a published
shard, or a holder's data directory (the writer's growing shard, and sealed
shards not yet published). So a search asks:

- for each published shard, one node that says it can search it now
  (its ``serving`` key lists it) with a *fresh* copy (mirror.py: it holds
  the shard's newest published deletes): of those, the one rendezvous
  hashing ranks first (placement.py), so load settles on the shard's owners
  once they have fetched it, and its publisher (which keeps its own copy)
  answers until then. The other fresh ones are the shard's *alternates*,
  asked in turn if that node fails or no longer has it. A shard no node
  serves yet is asked of its publisher when that is a live member: between
  the publish and the publisher's next ``serving`` key (a few milliseconds,
  a cache pass) the holder's search already leaves it out, so without this
  a search in that window was partial. A copy that lacks
  the newest deletes is asked only when no fresh one is served, and the
  answer then says so (``missing``: it may hold rows deleted since).
- each holder that is a live member, for its rows *not* in the plan's
  published set (``exclude``). A shard published after this plan was made
  is therefore searched on its holder, and never twice.

What no live node can answer is named in ``missing`` (a published shard no
live node serves; a holder that is not a member and not clean): the search
result is then ``partial``, never silently short.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from shardmgr.cluster.published.mirror import ClusterState
from shardmgr.cluster.published.placement import ranked


@dataclasses.dataclass(frozen=True, slots=True)
class Ask:
    """What one node is asked: these published shards, and whether its unpublished rows too."""

    shards: tuple[int, ...] = ()
    unpublished: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """One collection's search plan at one cluster state."""

    collection: str
    #: every shard id the plan counts as published (sorted): holders skip these
    published: np.ndarray
    asks: dict[str, Ask]
    #: per published shard, the other nodes ready to search it, best first
    alternates: dict[int, tuple[str, ...]]
    #: what no live node can search now, in words
    missing: tuple[str, ...]
    #: per published shard with a ready node, the node asked first
    served_by: dict[int, str] = dataclasses.field(default_factory=dict)


def shard_missing(shard_id: int) -> str:
    return f"shard {shard_id} (no live node serves it now)"


def shard_stale(shard_id: int) -> str:
    return f"shard {shard_id} (answered from a copy without its newest published deletes)"


def holder_missing(node: str) -> str:
    return f"rows not yet published, held by node {node} (not a live member)"


def plan(state: ClusterState, collection: str) -> Plan:
    """The plan for ``collection`` at ``state`` (module docstring)."""
    entries = state.published.get(collection, {})
    live = sorted(state.members)
    ready_sets = [(node, state.ready(node, collection)) for node in live]
    shards: dict[str, list[int]] = {}
    alternates: dict[int, tuple[str, ...]] = {}
    missing: list[str] = []
    for shard_id, entry in sorted(entries.items()):
        ready = [node for node, ids in ready_sets if shard_id in ids]
        if not ready and entry.writer in state.members:
            ready = [entry.writer]  # just published: its serving key does not list it yet
        if not ready:
            missing.append(shard_missing(shard_id))
            continue
        fresh = [node for node in ready if state.fresh(node, collection, shard_id)]
        if fresh:
            ready = fresh
        else:
            missing.append(shard_stale(shard_id))
        order = ranked(ready, collection, shard_id) if len(ready) > 1 else ready
        shards.setdefault(order[0], []).append(shard_id)
        alternates[shard_id] = tuple(order[1:])
    holders = dict(state.holders.get(collection, {}))
    writer = state.writers.get(collection)
    if writer is not None:
        holders.setdefault(writer, False)  # its holder key is written before its first acknowledged write
    asks = {node: Ask(tuple(ids), False) for node, ids in shards.items()}
    for node, clean in sorted(holders.items()):
        if node in state.members:
            asks[node] = Ask(asks[node].shards if node in asks else (), True)
        elif not clean:
            missing.append(holder_missing(node))
    served_by = {shard_id: node for node, ids in shards.items() for shard_id in ids}
    return Plan(collection, np.fromiter(sorted(entries), np.int64, len(entries)), asks, alternates, tuple(missing),
                served_by)
