"""The orphan sweep: objects of a collection that no shard-map entry and no
deletes or index entry names.

A crash, a fenced publish or a failed attempt between upload and publish
leaves objects that were never published (docs/cluster.md, "Publishing a
shard"), and a shard's deletes key, when the writer publishes more deletes,
stops naming the delete log copy it named before (extras.py). Nothing reads
them any more; the sweep deletes them. Only the collection's writer sweeps
it, on the node's thread (node.py): at the start of each of its tenures and
every ``sweep_interval_s``.

:func:`sweep_orphans` deletes an object under
``<object prefix>/<collection>/shards/`` only if all of these hold:

1. it was listed *before* the shard map and the deletes and indexes keys
   were read and the writer key was checked to still be the sweeper's tenure
   (so every publish that could name it is in that read: after the check
   only this tenure publishes);
2. no published entry names it (shard, deletes or index);
3. this tenure can never publish it: it is not under the sweeper's own
   tenure's path (``.../<shard>/<its revision>/``), where this tenure may
   still publish objects (its uploaders run on the same thread, so none is
   in flight, but a retry may reuse them); except a ``deletes.<rows>`` copy
   there when the shard's deletes key holds at least that many rows (deletes
   only move forward), and an index file there when another index is
   published for the shard (indexes are write-once);
4. it is older than ``sweep_grace_s`` by the object store's clock; and a
   shard's replaced ``deletes.<rows>`` copy only once the copy its deletes
   key names now is older than that too (so a reader that read the key just
   before it was replaced has had that long to fetch the old copy).

Objects of an earlier tenure can never be published again (publishes are
fenced on the writer key's create revision, unique to each tenure), so 1-3
make the sweep safe; the grace period is a margin on top.
"""

from __future__ import annotations

import logging
import time

from shardmgr.cluster.state.election import Election, Writer
from shardmgr.cluster.state.extras import ExtrasView, ShardExtras
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.cluster.state.shard_map import ShardMap
from shardmgr.store import layout

log = logging.getLogger(__name__)


def sweep_orphans(objects: ObjectStore, shard_map: ShardMap, token: Writer, grace_s: float, kv: Kv) -> int:
    """Delete the orphans of ``shard_map``'s collection (module docstring)
    while ``token`` is its writer; returns how many were deleted (0 and
    nothing deleted if the tenure is over)."""
    config = shard_map.config
    prefix = config.object_key(shard_map.collection, "shards") + "/"
    listed = objects.list(prefix)  # 1: before the maps are read
    published, _ = shard_map.read()
    extras = ShardExtras(config, kv).read(shard_map.collection)
    if not Election(config, shard_map.collection, kv).holds(token):
        log.info("sweep of %s skipped: this node's tenure %d is over", shard_map.collection, token.revision)
        return 0
    named = {o.key for entry in published.values() for o in entry.objects}
    named |= {e.object.key for e in extras.deletes.values()}
    named |= {o.key for e in extras.indexes.values() for o in e.files}
    now = time.time()
    modified = {info.key: info.modified for info in listed}
    deleted = 0
    for info in listed:
        if info.key in named or now - info.modified < grace_s:
            continue
        if not _orphan(info.key[len(prefix):].split("/"), token, extras, modified, now - grace_s):
            continue
        objects.delete(info.key)
        deleted += 1
        log.info("swept orphan object %s (%d bytes, %.0f s old)", objects.url(info.key), info.size,
                 now - info.modified)
    return deleted


def _orphan(parts: list[str], token: Writer, extras: ExtrasView, modified: dict[str, float], before: float) -> bool:
    """Rules 3 and 4 for an unnamed object older than the grace period
    (``before``: now minus the grace period), at ``<shard id>/<tenure
    revision>/<file>`` (``parts``); anything else under the prefix is a
    stray, swept."""
    if len(parts) != 3 or not parts[0].isdigit():
        return True
    shard_id, ours, file = int(parts[0]), parts[1] == str(token.revision), parts[2]
    rows = file.removeprefix(f"{layout.DELETES}.")
    if rows != file and rows.isdigit():  # a delete log copy
        there = extras.deletes.get(shard_id)
        if there is not None and modified.get(there.object.key, before + 1) > before:
            return False  # rule 4: the copy named now is young (or newer than the listing)
        return not ours or (there is not None and int(rows) <= there.deleted)
    if file in (layout.INDEX, layout.INDEX_META):
        return not ours or shard_id in extras.indexes  # write-once: once one is published, ours never is
    return not ours
