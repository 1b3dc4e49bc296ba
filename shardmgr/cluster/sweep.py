"""The orphan sweep: objects of a collection that no shard-map entry names.

A crash, a fenced publish or a failed attempt between upload and publish
leaves objects that were never published (docs/cluster.md, "Publishing a
shard"). Nothing reads them; the sweep deletes them. Only the collection's
writer sweeps it, on the node's thread (node.py): at the start of each of its
tenures and every ``sweep_interval_s``.

:func:`sweep_orphans` deletes an object under
``<object prefix>/<collection>/shards/`` only if all of these hold:

1. it was listed *before* the shard map was read and the writer key was
   checked to still be the sweeper's tenure (so every publish that could name
   it is in that read: after the check only this tenure publishes);
2. no published entry names it;
3. it is not under the sweeper's own tenure's path (``.../<shard>/<its
   revision>/``): this tenure may still publish those (its uploader runs on
   the same thread, so none is in flight, but a retry may reuse them);
4. it is older than ``sweep_grace_s`` by the object store's clock.

Objects of an earlier tenure can never be published again (publishes are
fenced on the writer key's create revision, unique to each tenure), so 1-3
make the sweep safe; the grace period is a margin on top.
"""

from __future__ import annotations

import logging
import time

from shardmgr.cluster.election import Election, Writer
from shardmgr.cluster.kv import Kv
from shardmgr.cluster.objects import ObjectStore
from shardmgr.cluster.shard_map import ShardMap

log = logging.getLogger(__name__)


def sweep_orphans(objects: ObjectStore, shard_map: ShardMap, token: Writer, grace_s: float, kv: Kv) -> int:
    """Delete the orphans of ``shard_map``'s collection (module docstring)
    while ``token`` is its writer; returns how many were deleted (0 and
    nothing deleted if the tenure is over)."""
    config = shard_map.config
    prefix = config.object_key(shard_map.collection, "shards") + "/"
    listed = objects.list(prefix)  # 1: before the map is read
    published, _ = shard_map.read()
    if not Election(config, shard_map.collection, kv).holds(token):
        log.info("sweep of %s skipped: this node's tenure %d is over", shard_map.collection, token.revision)
        return 0
    named = {o.key for entry in published.values() for o in entry.objects}
    now = time.time()
    deleted = 0
    for info in listed:
        parts = info.key[len(prefix):].split("/")  # <shard id>/<tenure revision>/<file>
        ours = len(parts) == 3 and parts[1] == str(token.revision)
        if info.key in named or ours or now - info.modified < grace_s:
            continue
        objects.delete(info.key)
        deleted += 1
        log.info("swept orphan object %s (%d bytes, %.0f s old)", objects.url(info.key), info.size,
                 now - info.modified)
    return deleted
