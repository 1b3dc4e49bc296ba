"""The cluster's status, as ``shardmgr cluster status`` and the metrics
port's ``/cluster`` page show it: one snapshot of etcd, typed.

:func:`read_status` reads:

1. optionally, the objects under the cluster's object prefix (a listing,
   made *before* the etcd read, as the sweep does: every publish that names
   a listed object is then in the snapshot, so an object no entry names (a
   shard entry, or a deletes or indexes key: extras.py) is an orphan, or an
   upload whose publish had not happened at the read);
2. every key under the cluster's key prefix in **one** range read, so
   members, writers, the catalog, the shard map, holders and serving
   reports are all at one etcd revision (``ClusterStatus.revision``);
3. each member's lease's remaining TTL (``/v3/lease/timetolive``, one small
   request per member, after the snapshot: -1 if it expired meanwhile).

From these it derives, per published shard, its rendezvous owners over the
live members (``placement.owners``) and the nodes that report it ready
(``/P/serving/<node-id>``). A node that publishes no serving key shows
"not reported" (``serving`` None), never "serves nothing". From the nodes'
reports (``/P/reports/<node-id>``, report.py) it takes what each node holds
unpublished and which uploads fail on it, and each collection's counts
(counts.py: the same as ``collection_info``'s). A member is *suspect* when
etcd has had no keepalive of its lease for two thirds of its TTL, or its
report is older than ``report.STALE_S``; a node that is not a member but
left a report (it did not stop cleanly) is listed as *gone*.

Guarantees: it only reads (nothing in etcd or the bucket changes); a key
whose value does not decode is listed in ``problems`` and otherwise
skipped, never fatal; etcd unreachable raises ``CoordinationUnavailable``
and an object-store failure an ``ObjectStoreError``, each keeping its
cause. (status_cache.py shares one read among a page's callers.)
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Mapping
from typing import Any

from shardmgr.cluster.config import ClusterConfig, check_node_id
from shardmgr.cluster.published.placement import owners
from shardmgr.cluster.state.catalog import CollectionMeta
from shardmgr.cluster.state.counts import count
from shardmgr.cluster.state.election import Writer
from shardmgr.cluster.state.extras import DeletesEntry, IndexEntry
from shardmgr.cluster.state.kv import Entry, Kv
from shardmgr.cluster.state.membership import Member
from shardmgr.cluster.state.objects import ObjectInfo, ObjectStore
from shardmgr.cluster.state.report import STALE_S, FailingUpload, NodeReport, published_deleted
from shardmgr.cluster.state.shard_map import ShardEntry
from shardmgr.store import check_name

#: what a holder that is not a live member and not clean means for its collection
HOLDER_GONE = "rows unavailable until node returns"
#: a member is suspect once etcd has had no keepalive from it for this fraction of its lease's TTL (it
#: renews every third of it: two renewals missed)
SILENT_FRACTION = 2 / 3


@dataclasses.dataclass(frozen=True, slots=True)
class Problem:
    """A key that could not be decoded, and why."""

    key: str
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class NodeStatus:
    """A live member. ``lease`` is etcd's lease id in hex (as etcdctl prints
    it; 64-bit ids do not fit a JSON number); ``ttl_s`` its remaining seconds
    by etcd (None: not asked, -1: expired since the snapshot); ``serving`` the
    shard ids the node reports ready, by collection (None: not reported)."""

    node_id: str
    address: str
    lease: str
    joined_revision: int
    ttl_s: int | None
    granted_ttl_s: int | None
    writes: tuple[str, ...]
    serving: Mapping[str, tuple[int, ...]] | None
    #: seconds since etcd last had a keepalive of the lease (granted - remaining TTL; None: not asked)
    silent_s: int | None = None
    #: why the node looks dead though it is a member (no keepalive for long, a late report), or None
    suspect: str | None = None
    #: its report (report.py): age in seconds by the reader's clock, None if it has none
    report_age_s: float | None = None
    #: live rows on its disk the shard map does not hold, by collection (as reported; None: no report)
    unpublished_rows: Mapping[str, int] | None = None
    failing: tuple[FailingUpload, ...] = ()
    uploads_failed_total: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class GoneNode:
    """A node that is not a member and left a report (it did not stop
    cleanly: SIGKILLed, or its lease lost): what it said last, ``report_age_s``
    ago, and the collections it holds rows of that are not published."""

    node_id: str
    address: str
    report_age_s: float
    unpublished_rows: Mapping[str, int]
    failing: tuple[FailingUpload, ...]
    holds: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class WriterStatus:
    """A collection's writer: ``revision`` (the key's create revision) is
    its tenure's fencing token; ``live``: the node is a member."""

    node_id: str
    revision: int
    lease: str
    live: bool


@dataclasses.dataclass(frozen=True, slots=True)
class ShardStatus:
    """A published shard: rows and bytes (its objects' sizes), who published
    it under which tenure, its rendezvous ``owners`` (first choice first) and
    the nodes reporting it ready (``served_by``; None if no node reports)."""

    shard_id: int
    rows: int
    bytes: int
    files: int
    writer: str
    writer_revision: int
    owners: tuple[str, ...]
    served_by: tuple[str, ...] | None
    #: published deleted rows (its deletes key, else its entry); None: recorded nowhere
    deleted: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CollectionStatus:
    """A collection: its catalog parameters (None if it has no catalog entry,
    e.g. a shard map left by a deleted one), writer, published shards;
    ``served`` counts shards some node reports ready (None: no node
    reports); ``bytes`` the published objects' sizes. Its counts are
    ``collection_info``'s (counts.py): ``rows`` live over the whole cluster,
    ``deleted`` every acknowledged delete, ``published_rows`` and
    ``unpublished_rows`` live, ``deletes_unpublished``; ``failing``: uploads
    of it failing now on some node; ``missing``: what could not be counted."""

    name: str
    dim: int | None
    metric: str | None
    index: str | None
    writer: WriterStatus | None
    shards: tuple[ShardStatus, ...]
    rows: int
    bytes: int
    served: int | None
    deleted: int = 0
    published_rows: int = 0
    unpublished_rows: int = 0
    deletes_unpublished: int = 0
    failing: int = 0
    missing: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class HolderStatus:
    """A node that may hold acknowledged rows of ``collection`` not yet
    published (``clean``: its key says every row it holds is published).
    If it is neither live nor clean, those rows are unavailable
    (``unavailable``) until it returns."""

    collection: str
    node_id: str
    live: bool
    clean: bool
    unavailable: bool


@dataclasses.dataclass(frozen=True, slots=True)
class ObjectsStatus:
    """The bucket under the object prefix: every object, and the orphans
    (objects no published entry names) with their bytes."""

    url: str
    objects: int
    bytes: int
    orphans: tuple[str, ...]
    orphan_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterStatus:
    """One snapshot of the cluster (module docstring). ``bytes`` sums the
    published entries' file sizes: the store's bytes in object storage;
    ``rows`` the collections' live rows; ``gone``: nodes that left a report
    and are not members."""

    etcd: str
    revision: int
    read_at: float
    replicas: int
    nodes: tuple[NodeStatus, ...]
    collections: tuple[CollectionStatus, ...]
    holders: tuple[HolderStatus, ...]
    objects: ObjectsStatus | None
    problems: tuple[Problem, ...]
    serving_reported: bool
    shards: int
    rows: int
    bytes: int
    gone: tuple[GoneNode, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """The status as plain JSON values (``/cluster.json``, ``--json``)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Keys:
    """The snapshot's keys, decoded, by kind."""

    members: dict[str, Member] = dataclasses.field(default_factory=dict)
    writers: dict[str, Writer] = dataclasses.field(default_factory=dict)
    catalog: dict[str, CollectionMeta] = dataclasses.field(default_factory=dict)
    shards: dict[str, list[ShardEntry]] = dataclasses.field(default_factory=dict)
    holders: list[tuple[str, str, bool]] = dataclasses.field(default_factory=list)
    serving: dict[str, dict[str, tuple[int, ...]]] = dataclasses.field(default_factory=dict)
    #: objects the deletes and indexes keys name (extras.py), by key: their sizes
    extras: dict[str, int] = dataclasses.field(default_factory=dict)
    #: the deletes keys' deleted rows: collection -> shard id -> rows
    deleted: dict[str, dict[int, int]] = dataclasses.field(default_factory=dict)
    reports: dict[str, NodeReport] = dataclasses.field(default_factory=dict)
    problems: list[Problem] = dataclasses.field(default_factory=list)


def read_status(config: ClusterConfig, *, kv: Kv | None = None, objects: ObjectStore | None = None,
                replicas: int = 1, leases: bool = True) -> ClusterStatus:
    """The cluster's status now (module docstring). ``kv``: the etcd client
    to use (default: a new one, closed after); ``objects``: list the bucket
    too; ``leases``: ask etcd each member's remaining TTL."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    listed = objects.list(f"{config.object_prefix}/" if config.object_prefix else "") if objects is not None else None
    client = kv if kv is not None else Kv(config)
    try:
        entries, revision = client.get_prefix(config.key(""))
        keys = decode_keys(config.key(""), entries)
        ttls = {lease: lease_ttl(client, lease) for lease in {m.lease for m in keys.members.values()}} \
            if leases else {}
    finally:
        if kv is None:
            client.close()
    return assemble(config, keys, revision, ttls, replicas, listed)


def decode_keys(prefix: str, entries: Iterable[Entry]) -> _Keys:
    """Sort ``entries`` (keys under ``prefix``) by kind; a value that fails
    to decode becomes a Problem. Kinds this module does not show are skipped."""
    keys = _Keys()
    for e in entries:
        parts = e.key[len(prefix):].split("/")
        try:
            _decode_one(keys, parts, e)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            keys.problems.append(Problem(e.key, f"{type(error).__name__}: {error}"))
    return keys


def _decode_one(keys: _Keys, parts: list[str], e: Entry) -> None:
    kind, rest = parts[0], parts[1:]
    if kind == "members" and len(rest) == 1:
        keys.members[check_node_id(rest[0])] = Member.from_entry(e)
    elif kind == "writers" and len(rest) == 1:
        keys.writers[check_name(rest[0])] = Writer.from_entry(rest[0], e)
    elif kind == "collections" and len(rest) == 1:
        meta = CollectionMeta.from_entry(e)
        if meta.name != rest[0]:
            raise ValueError(f"the entry names collection {meta.name!r}")
        keys.catalog[check_name(rest[0])] = meta
    elif kind == "shards" and len(rest) == 2:
        entry = ShardEntry.decode(e.value)
        if (entry.collection, entry.shard_id) != (rest[0], int(rest[1])):
            raise ValueError(f"the entry names shard {entry.shard_id} of {entry.collection!r}")
        keys.shards.setdefault(check_name(rest[0]), []).append(entry)
    elif kind == "holders" and len(rest) == 2:
        value = json.loads(e.value)
        if value["node"] != rest[1]:
            raise ValueError(f"the value names node {value['node']!r}")
        keys.holders.append((check_name(rest[0]), check_node_id(rest[1]), value.get("clean") is True))
    elif kind in ("deletes", "indexes") and len(rest) == 2:
        decoded = DeletesEntry.decode(check_name(rest[0]), int(rest[1]), e.value) if kind == "deletes" \
            else IndexEntry.decode(check_name(rest[0]), int(rest[1]), e.value)
        files = (decoded.object,) if isinstance(decoded, DeletesEntry) else decoded.files
        keys.extras.update((o.key, o.size) for o in files)
        if isinstance(decoded, DeletesEntry):
            keys.deleted.setdefault(rest[0], {})[int(rest[1])] = decoded.deleted
    elif kind == "reports" and len(rest) == 1:
        keys.reports[check_node_id(rest[0])] = NodeReport.decode(rest[0], e.value)
    elif kind == "serving" and len(rest) == 1:
        report = json.loads(e.value)["collections"]
        keys.serving[check_node_id(rest[0])] = {check_name(str(name)): tuple(sorted(int(i) for i in ids))
                                               for name, ids in report.items()}


def lease_ttl(kv: Kv, lease: int) -> tuple[int, int | None]:
    """The lease's (remaining, granted) TTL in seconds by etcd; (-1, None) if it has expired."""
    answer = kv.post("/lease/timetolive", {"ID": lease}, f"time to live of lease {lease:x}")
    granted = answer.get("grantedTTL")
    return int(answer.get("TTL", -1)), int(granted) if granted is not None else None


def assemble(config: ClusterConfig, keys: _Keys, revision: int, ttls: Mapping[int, tuple[int, int | None]],
             replicas: int, listed: list[ObjectInfo] | None) -> ClusterStatus:
    """The ClusterStatus of decoded keys (and the bucket's listing, if made)."""
    now = time.time()
    live = sorted(keys.members)
    reported = bool(keys.serving)
    names = sorted({*keys.catalog, *keys.writers, *keys.shards, *(c for c, _, _ in keys.holders)})
    collections = tuple(_collection(name, keys, live, replicas, reported, now) for name in names)
    nodes = tuple(_node(m, keys, ttls.get(m.lease, (None, None)), now) for m in (keys.members[n] for n in live))
    holders = tuple(HolderStatus(c, n, n in keys.members, clean, n not in keys.members and not clean)
                    for c, n, clean in sorted(keys.holders))
    gone = tuple(GoneNode(n, r.address, max(0.0, now - r.at), _unpublished(r), r.failing,
                          tuple(c for c, h, clean in sorted(keys.holders) if h == n and not clean))
                 for n, r in sorted(keys.reports.items()) if n not in keys.members)
    named = {o.key: o.size for entries in keys.shards.values() for e in entries for o in e.objects} | keys.extras
    return ClusterStatus(etcd=config.etcd_url, revision=revision, read_at=now, replicas=replicas,
                         nodes=nodes, collections=collections, holders=holders,
                         objects=_objects(config, listed, named) if listed is not None else None,
                         problems=tuple(keys.problems), serving_reported=reported,
                         shards=sum(len(c.shards) for c in collections), rows=sum(c.rows for c in collections),
                         bytes=sum(c.bytes for c in collections), gone=gone)


def _node(m: Member, keys: _Keys, ttl: tuple[int | None, int | None], now: float) -> NodeStatus:
    remaining, granted = ttl
    silent = granted - remaining if remaining is not None and granted is not None and remaining >= 0 else None
    report = keys.reports.get(m.node_id)
    age = max(0.0, now - report.at) if report is not None else None
    suspect = None
    if remaining is not None and remaining < 0:
        suspect = "its lease expired after the read"
    elif silent is not None and granted is not None and silent > granted * SILENT_FRACTION:
        suspect = f"no keepalive for {silent} s of its {granted} s lease"
    elif age is not None and age > STALE_S:
        suspect = f"its report is {age:.0f} s old"
    return NodeStatus(node_id=m.node_id, address=m.address, lease=f"{m.lease:x}", joined_revision=m.joined_revision,
                      ttl_s=remaining, granted_ttl_s=granted,
                      writes=tuple(c for c, w in sorted(keys.writers.items()) if w.node_id == m.node_id),
                      serving=keys.serving.get(m.node_id), silent_s=silent, suspect=suspect, report_age_s=age,
                      unpublished_rows=_unpublished(report) if report is not None else None,
                      failing=report.failing if report is not None else (),
                      uploads_failed_total=report.uploads_failed_total if report is not None else None)


def _unpublished(report: NodeReport) -> dict[str, int]:
    """Live rows of each collection on the node the shard map does not hold, as it reported them."""
    return {name: sum(c.rows - c.deleted for c in r.unpublished.values())
            for name, r in sorted(report.collections.items()) if r.unpublished}


def _collection(name: str, keys: _Keys, live: list[str], replicas: int, reported: bool,
                now: float) -> CollectionStatus:
    meta = keys.catalog.get(name)
    writer = keys.writers.get(name)
    entries = sorted(keys.shards.get(name, []), key=lambda e: e.shard_id)
    deleted = keys.deleted.get(name, {})
    shards = tuple(
        ShardStatus(shard_id=e.shard_id, rows=e.rows, bytes=sum(o.size for o in e.objects), files=len(e.objects),
                    writer=e.writer, writer_revision=e.writer_revision,
                    owners=tuple(owners(live, name, e.shard_id, replicas)),
                    served_by=tuple(n for n, report in sorted(keys.serving.items())
                                    if e.shard_id in report.get(name, ())) if reported else None,
                    deleted=published_deleted(e, deleted.get(e.shard_id)))
        for e in entries)
    c = count(name, {e.shard_id: e for e in entries}, deleted,
              {n: clean for h, n, clean in keys.holders if h == name}, set(keys.members), keys.reports, now)
    return CollectionStatus(
        name=name, dim=meta.dim if meta else None, metric=meta.metric if meta else None,
        index=meta.index if meta else None,
        writer=WriterStatus(writer.node_id, writer.revision, f"{writer.lease:x}", writer.node_id in keys.members)
        if writer is not None else None,
        shards=shards, rows=c.rows, bytes=sum(s.bytes for s in shards),
        served=sum(1 for s in shards if s.served_by) if reported else None, deleted=c.deleted,
        published_rows=c.published_rows - c.published_deleted,
        unpublished_rows=c.unpublished_rows - c.unpublished_deleted,
        deletes_unpublished=c.deletes_unpublished,
        failing=sum(1 for r in keys.reports.values() for f in r.failing if f.collection == name),
        missing=c.missing)


def _objects(config: ClusterConfig, listed: list[ObjectInfo], named: Mapping[str, int]) -> ObjectsStatus:
    orphans = [o for o in listed if o.key not in named]
    return ObjectsStatus(url=config.s3_url, objects=len(listed), bytes=sum(o.size for o in listed),
                         orphans=tuple(o.key for o in orphans), orphan_bytes=sum(o.size for o in orphans))
