"""A collection's whole count in cluster mode: what ``collection_info``
answers on every node (query.py), and what ``cluster status`` shows
(status.py), from the same inputs by the same rules.

Every row is in a published shard or on a node's disk (mirror.py). So:

- **published** shards: their rows from the shard map, their deleted rows
  from each shard's deletes key (extras.py), else its entry's own count;
- **unpublished** rows: each node's report (report.py) lists its local
  shards the map does not hold (the growing shard, sealed shards not
  uploaded yet); a shard published since the report was written is counted
  once, as published;
- **deletes not yet published**: a node's report lists the published
  shards here holding more deleted rows than are published; per shard the
  largest count any node reports is taken (a writer's log holds every
  published row, merged: deletes_merger.py).

``rows`` is the live rows by the writer's deletes: every delete a writer
acknowledged is subtracted, published or not (so the count is the same on
every node, though a query node's searches return a row until its delete is
published: docs/cluster.md, "When a delete is seen"); ``deletes_unpublished``
says how many such deletes there are.

What cannot be known is said, as a search says ``partial``: the rows of a
holder (a node whose holder key is not clean) that has not reported, or is
not a live member (its rows are counted from its last report, whose age is
given), and the deleted rows of published shards whose count is recorded
nowhere (entries from before it was, unless a node holding the shard
reports it). The counts lag each node by its
report's age (``reports``: at most ``report_interval_s`` and one etcd write
for a live node) and the cluster by this node's watch (milliseconds).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Set
from typing import Any

from shardmgr.cluster.state.report import STALE_S, NodeReport, published_deleted
from shardmgr.cluster.state.shard_map import ShardEntry


@dataclasses.dataclass(frozen=True, slots=True)
class CollectionCount:
    """A collection's rows across the cluster (module docstring); ``rows``
    fields count stored rows, deleted ones included; ``reports``: the age in
    seconds of each node report that was counted."""

    published_shards: int
    published_rows: int
    published_deleted: int
    unpublished_shards: int
    unpublished_rows: int
    unpublished_deleted: int
    growing: int
    deletes_unpublished: int
    missing: tuple[str, ...]
    reports: Mapping[str, float]

    @property
    def deleted(self) -> int:
        return self.published_deleted + self.unpublished_deleted + self.deletes_unpublished

    @property
    def rows(self) -> int:
        """Live rows: every stored row less every acknowledged delete."""
        return self.published_rows + self.unpublished_rows - self.deleted

    @property
    def partial(self) -> bool:
        return bool(self.missing)

    def as_dict(self) -> dict[str, Any]:
        """The cluster part of ``collection_info``'s answer (docs/cluster.md)."""
        return {"published": {"shards": self.published_shards, "rows": self.published_rows - self.published_deleted,
                              "deleted": self.published_deleted},
                "unpublished": {"shards": self.unpublished_shards,
                                "rows": self.unpublished_rows - self.unpublished_deleted,
                                "deleted": self.unpublished_deleted},
                "deletes_unpublished": self.deletes_unpublished,
                "reports": {n: round(age, 3) for n, age in sorted(self.reports.items())}}


def count(name: str, published: Mapping[int, ShardEntry], deletes: Mapping[int, int],
          holders: Mapping[str, bool], members: Set[str], reports: Mapping[str, NodeReport],
          now: float) -> CollectionCount:
    """Collection ``name``'s count (module docstring) from: its published
    entries and deletes keys' counts by shard id; its holder keys (node ->
    clean); the live members; every node's report; the reader's wall clock."""
    missing: list[str] = []
    unpublished: dict[int, tuple[int, int, bool]] = {}
    here: dict[int, int] = {}
    ages: dict[str, float] = {}
    for node_id, report in sorted(reports.items()):
        mine = report.collections.get(name)
        if mine is None:
            continue
        ages[node_id] = max(0.0, now - report.at)
        for shard_id, c in mine.unpublished.items():
            if shard_id not in published:
                unpublished[shard_id] = (c.rows, c.deleted, c.sealed)
        for shard_id, n in mine.deleted_here.items():
            here[shard_id] = max(here.get(shard_id, 0), n)
    published_del, late, unknown = 0, 0, 0
    for shard_id, entry in published.items():
        known = published_deleted(entry, deletes.get(shard_id))
        if known is None and shard_id in here:  # recorded nowhere in etcd, but a node that has it says
            published_del += here[shard_id]
        elif known is None:
            unknown += 1
        else:
            published_del += known
            late += max(0, here.get(shard_id, 0) - known)
    for node_id, clean in sorted(holders.items()):
        if not clean:
            missing.extend(_holder_missing(node_id, node_id in members, reports.get(node_id), now))
    if unknown:
        missing.append(f"the deleted rows of {unknown} published shards are recorded nowhere (published before "
                       "entries carried them): counted as live")
    return CollectionCount(
        published_shards=len(published), published_rows=sum(e.rows for e in published.values()),
        published_deleted=published_del, unpublished_shards=len(unpublished),
        unpublished_rows=sum(r for r, _, _ in unpublished.values()),
        unpublished_deleted=sum(d for _, d, _ in unpublished.values()),
        growing=sum(1 for _, _, sealed in unpublished.values() if not sealed), deletes_unpublished=late,
        missing=tuple(missing), reports=ages)


def _holder_missing(node_id: str, live: bool, report: NodeReport | None, now: float) -> list[str]:
    """What is not known of the rows of a holder that is not clean."""
    if report is None:
        return [f"rows not yet published on node {node_id} " + (
            "(a live member) are not counted: it has not reported them yet" if live
            else "(not a live member) are not counted: it left no report")]
    age = max(0.0, now - report.at)
    if not live:
        return [f"rows not yet published on node {node_id} (not a live member) are counted from its last report, "
                f"{age:.0f} s old: rows it took after that are not"]
    if age > STALE_S:
        return [f"rows not yet published on node {node_id} are counted from a report {age:.0f} s old "
                "(its reporter is late)"]
    return []
