"""Checking a cluster's shard map against its bucket: ``shardmgr verify --cluster``.

Read-only (nothing in etcd or the bucket is written) and safe beside live
nodes. What it reads, under the cluster's key prefix (docs/cluster.md, "Keys
in etcd"):

* ``/P/collections/<name>``: the catalog; an entry that does not decode is
  CORRUPT (``catalog_entry``).
* ``/P/shards/<collection>/<20-digit id>``: every published shard
  (``ShardEntry``). The entry must decode and agree with its key (``entry``),
  name a collection of the catalog (``unknown_collection``), name the files
  every sealed shard has (``vectors``, ``ids``, ``journal``; ``entry``), and
  its row count must agree with the recorded sizes of its row files
  (``rows_size``: a row file is its 4096-byte header then ``rows`` rows of
  ``dim`` float32 for ``vectors``, one int64 for ``ids`` and ``refs``).
* ``/P/deletes/<collection>/<id>`` and ``/P/indexes/<collection>/<id>``: a
  published shard's later delete log and its index (extras.py:
  ``DeletesEntry``, ``IndexEntry``). A value that does not decode, or that
  names a shard the map does not hold, is CORRUPT (``entry``): the writer
  publishes extras only for published shards.

Every object an entry names is asked for (HEAD, :func:`object_checks.check`):
gone (``missing_object``), another size (``object_size``) or other crc32c
metadata (``object_checksum``) are CORRUPT: a published entry is write-once
and its objects are never deleted. With ``deep`` each object is also
downloaded (checksummed and fsynced, as a node's cache fill does, into a
temporary directory) and its bytes must have the recorded crc32c.

Objects under ``<object prefix>/<collection>/shards/`` that no entry names
are ``orphan``: REPAIRABLE once older than ``orphan_grace_s`` (the
collection's writer's sweep removes them), a NOTE before that or when they
are under the current writer's own tenure (an upload that may still be
published). The bucket is listed *before* the map is read, so a shard
published during the run is never taken for an orphan.

Nothing is repaired here: published entries are write-once (no command may
change one), and the writer's own sweep removes orphans.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from common.journal.check import Findings, Problem, Severity
from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.errors import ClusterError
from shardmgr.cluster.state.catalog import CollectionMeta
from shardmgr.cluster.state.election import Writer
from shardmgr.cluster.state.extras import DeletesEntry, IndexEntry
from shardmgr.cluster.state.kv import Entry, Kv
from shardmgr.cluster.state.objects import ObjectInfo, ObjectStore
from shardmgr.cluster.state.shard_map import ShardEntry, ShardObject
from shardmgr.errors import CannotVerify
from shardmgr.store import layout
from shardmgr.store.rows import HEADER_SIZE

from . import object_checks
from .object_checks import Named
from .report import Report

_NODE = NodeConfig()
#: an unnamed object older than this should have been swept (the sweep's default grace, plus one period)
ORPHAN_GRACE_S = _NODE.sweep_grace_s + _NODE.sweep_interval_s
#: bytes per row of each row file, given the collection's dimension
ROW_BYTES: dict[str, Callable[[int], int]] = {"vectors": lambda dim: 4 * dim, "ids": lambda _: 8, "refs": lambda _: 8}
#: the keys that name objects besides the shard map (extras.py), and the objects each names
EXTRAS: dict[str, Callable[[str, int, bytes], Sequence[ShardObject]]] = {
    "deletes": lambda collection, shard_id, value: (DeletesEntry.decode(collection, shard_id, value).object,),
    "indexes": lambda collection, shard_id, value: IndexEntry.decode(collection, shard_id, value).files}


@dataclasses.dataclass(slots=True)
class ClusterScan:
    """One run's view of the cluster: what the keys say, and what the bucket held."""

    config: ClusterConfig
    findings: Findings
    catalog: dict[str, CollectionMeta] = dataclasses.field(default_factory=dict)
    named: list[Named] = dataclasses.field(default_factory=list)
    listed: dict[str, list[ObjectInfo]] = dataclasses.field(default_factory=dict)
    writers: dict[str, Writer] = dataclasses.field(default_factory=dict)
    published: set[tuple[str, int]] = dataclasses.field(default_factory=set)  # (collection, shard id) of the map

    def where(self, key: str) -> str:
        """An etcd key as it is reported: ``etcd://HOST:PORT/KEY``."""
        return f"etcd://{self.config.etcd_host}:{self.config.etcd_port}{key}"

    def add(self, where: str, severity: Severity, what: str, expected: str, found: str) -> None:
        self.findings.problems.append(Problem(where, None, severity, what, expected, found))


def verify_cluster(config: ClusterConfig, *, deep: bool = False, orphan_grace_s: float = ORPHAN_GRACE_S,
                   store: ObjectStore | None = None, on_object: Callable[[Path, int], None] | None = None,
                   on_total: Callable[[int], None] | None = None) -> Report:
    """Check the cluster ``config`` names (module docstring). CannotVerify if
    etcd or the bucket cannot be read (unreachable, refused, no credentials).
    ``on_total(n)`` hears how many objects will be checked, ``on_object``
    of each one done (a progress bar)."""
    started = time.perf_counter()
    findings = Findings(on_file=on_object)
    objects = store if store is not None else ObjectStore(config)
    kv = Kv(config)
    try:
        scan = read(config, kv, objects, findings)
        if on_total is not None:
            on_total(len(scan.named))
        object_checks.check_all(objects, scan.named, deep, findings)
        orphans(scan, orphan_grace_s)
    except ClusterError as exc:
        raise CannotVerify(f"cannot read the cluster: {exc}") from exc
    finally:
        kv.close()
        if store is None:
            objects.close()
    return Report("", deep, findings.problems, findings.files, findings.bytes_read, time.perf_counter() - started,
                  cluster=f"{config.etcd_url} {config.s3_url}")


def read(config: ClusterConfig, kv: Kv, objects: ObjectStore, findings: Findings) -> ClusterScan:
    """The catalog, the bucket's listing (before the map), the writers, and
    every object the map and the side keys name (their entries checked)."""
    scan = ClusterScan(config, findings)
    for e in kv.get_prefix(config.key("collections", ""))[0]:
        try:
            meta = CollectionMeta.from_entry(e)
            scan.catalog[meta.name] = meta
        except (ValueError, KeyError, TypeError) as exc:
            scan.add(scan.where(e.key), Severity.CORRUPT, "catalog_entry", "JSON {name, dim, metric, index}",
                     f"{type(exc).__name__}: {exc}")
    for name in scan.catalog:
        scan.listed[name] = objects.list(config.object_key(name, "shards") + "/")
    for e in kv.get_prefix(config.key("writers", ""))[0]:
        name = e.key.rsplit("/", 1)[-1]
        try:
            scan.writers[name] = Writer.from_entry(name, e)
        except (ValueError, KeyError, TypeError):
            continue  # a writer key is the election's (a lease key), not data: nothing to report
    for e in kv.get_prefix(config.key("shards", ""))[0]:
        _shard_entry(scan, e)
    for kind in EXTRAS:
        for e in kv.get_prefix(config.key(kind, ""))[0]:
            _side_entry(scan, kind, e)
    return scan


def _key_parts(scan: ClusterScan, e: Entry, kind: str) -> tuple[str, int] | None:
    """(collection, shard id) from ``/P/<kind>/<collection>/<id>``; None (reported) if malformed."""
    rest = e.key[len(scan.config.key(kind, "")):].split("/")
    if len(rest) == 2 and rest[1].isdigit() and len(rest[1]) == 20:
        return rest[0], int(rest[1])
    scan.add(scan.where(e.key), Severity.CORRUPT, "entry",
             f"a key {scan.config.key(kind, '')}<collection>/<shard id, 20 digits>", "another key under that prefix")
    return None


def _shard_entry(scan: ClusterScan, e: Entry) -> None:
    """One published shard: decode it, check it against its key and the
    catalog, and queue its objects for checking."""
    where = scan.where(e.key)
    parts = _key_parts(scan, e, "shards")
    if parts is None:
        return
    try:
        entry = ShardEntry.decode(e.value)
        if not isinstance(entry.rows, int) or any(not _valid(o.key, o.size, o.crc32c) for o in entry.objects):
            raise ValueError("rows, object keys, sizes or crc32c of the wrong type or range")
    except (ValueError, KeyError, TypeError) as exc:
        scan.add(where, Severity.CORRUPT, "entry", "a JSON ShardEntry {collection, shard_id, rows, objects, ...}",
                 f"undecodable: {type(exc).__name__}: {exc}")
        return
    scan.published.add(parts)
    if (entry.collection, entry.shard_id) != parts:
        scan.add(where, Severity.CORRUPT, "entry", f"shard {parts[1]} of {parts[0]!r} (its key)",
                 f"an entry of shard {entry.shard_id} of {entry.collection!r}")
    names = [o.name for o in entry.objects]
    if missing := [n for n in layout.ALWAYS if n not in names]:
        scan.add(where, Severity.CORRUPT, "entry", f"objects {', '.join(layout.ALWAYS)} (every sealed shard's files)",
                 f"no {', '.join(missing)} (it names {', '.join(names) or 'nothing'})")
    meta = scan.catalog.get(parts[0])
    if meta is None:
        scan.add(where, Severity.CORRUPT, "unknown_collection", "a collection of the catalog",
                 f"{parts[0]!r} is not in {scan.config.key('collections', '')}")
    else:
        _rows(scan, where, entry, meta.dim)
    scan.named += [Named(where, o.name, o.key, o.size, o.crc32c) for o in entry.objects]


def _rows(scan: ClusterScan, where: str, entry: ShardEntry, dim: int) -> None:
    """The row count against each row file's recorded size."""
    for o in entry.objects:
        per_row = ROW_BYTES.get(o.name)
        if per_row is None:
            continue
        expected = HEADER_SIZE + entry.rows * per_row(dim)
        if o.size != expected:
            scan.add(where, Severity.CORRUPT, "rows_size",
                     f"{o.name}: {expected} bytes ({HEADER_SIZE} + {entry.rows} rows x {per_row(dim)})",
                     f"{o.size} bytes recorded")


def _side_entry(scan: ClusterScan, kind: str, e: Entry) -> None:
    """A deletes or indexes key: decode it, check that its shard is published, and queue its objects."""
    where = scan.where(e.key)
    parts = _key_parts(scan, e, kind)
    if parts is None:
        return
    try:
        named = [Named(where, o.name, o.key, o.size, o.crc32c) for o in EXTRAS[kind](*parts, e.value)]
        if not named or any(not _valid(n.key, n.size, n.crc32c) for n in named):
            raise ValueError("no object, or object keys, sizes or crc32c of the wrong type or range")
    except (ValueError, KeyError, TypeError) as exc:
        scan.add(where, Severity.CORRUPT, "entry", f"a JSON {'DeletesEntry' if kind == 'deletes' else 'IndexEntry'}",
                 f"undecodable: {type(exc).__name__}: {exc}")
        return
    if parts not in scan.published:
        scan.add(where, Severity.CORRUPT, "entry", f"{kind} of a published shard",
                 f"shard {parts[1]} of {parts[0]!r} is not in the shard map")
    scan.named += named


def _valid(key: object, size: object, crc: object) -> bool:
    return (isinstance(key, str) and bool(key) and isinstance(size, int) and size >= 0
            and isinstance(crc, int) and 0 <= crc < 1 << 32)


def orphans(scan: ClusterScan, grace_s: float) -> None:
    """Listed objects no entry names (module docstring), with their age."""
    named = {n.key for n in scan.named}
    now = time.time()
    for collection, listed in scan.listed.items():
        prefix = scan.config.object_key(collection, "shards") + "/"
        writer = scan.writers.get(collection)
        for info in listed:
            if info.key in named:
                continue
            age = now - info.modified
            parts = info.key[len(prefix):].split("/")  # <shard id>/<tenure revision>/<file>
            current = writer is not None and len(parts) == 3 and parts[1] == str(writer.revision)
            late = age >= grace_s and not current
            why = ("past the grace period: the collection's writer's sweep removes it" if late else
                   f"under the current writer's tenure ({writer.revision if writer else ''}): it may yet be "
                   f"published" if current else f"younger than {grace_s:.0f} s: an upload not published yet, "
                   f"or an orphan the sweep removes later")
            scan.add(f"s3://{scan.config.bucket}/{info.key}", Severity.REPAIRABLE if late else Severity.NOTE,
                     "orphan", "every object under <collection>/shards/ named by a published entry",
                     f"named by none; {info.size} bytes, {age:.0f} s old; {why}")
