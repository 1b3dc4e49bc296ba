"""Published shards a writer deletes in, taken into its own data directory.

A writer deletes in its own store (each shard's delete log there), then
publishes the log (extras_uploader.py). A shard another node wrote is not
there when the writer role has moved since. So before a delete is written
(``WriteGate.deleting``, off the store's lock), the writer takes each
published shard the delete names that its data directory lacks:

- the files a reader uses now (cache.shard_objects: the entry's row files,
  the newest delete log, the published index files) go to ``<id>.tmp/``,
  each checked against the size and crc32c of the key that names it; files
  the node's cache installed from the same object are hard-linked instead
  (they never change), except the delete log, which grows here and so is
  always a copy of its own;
- the directory is renamed into place and the store opens it with every
  check of a reopened shard (``Store.seam.adopt_shard``). A crash before the
  rename leaves a ``.tmp`` directory the next start removes.

A delete by id looks at every shard, so it first takes every published
shard of the collection not here: on a new writer, a download of all it
does not cache (docs/cluster.md, "Deletes and indexes after publish").

From then on the shard is the writer's as if it had written it: its
deletes are published by this node, it stays in the data directory across
restarts, and others holding their own copy merge those deletes
(deletes_merger.py). Taking fails with ShardsUnavailable (retryable) if
the objects cannot be fetched, and nothing is deleted then.

Every shard published before this node's writer tenure began is known
only once the watched state (mirror.py) has reached the tenure's revision
(the shards published after it are this node's own): a take waits for
that, up to ``lease_ttl_s``, and otherwise fails with ShardsUnavailable.
Then the node checks the writer rule once more (``roles.ensure``), since a
take may download for a while.

Threads: the deleting connection's; one lock serialises takes, so two
deletes never fetch one shard twice.
"""

from __future__ import annotations

import logging
import shutil
import threading

from common.journal.filesystem import fsync_dir
from shardmgr.cluster.errors import ClusterError, ShardsUnavailable
from shardmgr.cluster.published.cache import ShardCache, gather_files, shard_objects
from shardmgr.cluster.published.deletes_merger import DeletesMerger
from shardmgr.cluster.published.mirror import ClusterMirror, ClusterState
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.errors import ShardmgrError
from shardmgr.store import ShardDamaged, Store, layout

log = logging.getLogger(__name__)


class ShardTaker:
    """Brings published shards a delete names into this node's store (module docstring)."""

    def __init__(self, store: Store, objects: ObjectStore, mirror: ClusterMirror, cache: ShardCache,
                 merger: DeletesMerger) -> None:
        self.store = store
        self.merger = merger
        self.objects = objects
        self.mirror = mirror
        self.cache = cache
        self._lock = threading.Lock()
        self.counters = {"shards_taken_total": 0}

    def take(self, name: str, shards: frozenset[int] | None, tenure: int, timeout: float) -> None:
        """Have every published shard of ``name`` among ``shards`` (None: all)
        in this node's store; shards not published are left to the store
        (a ref to them is unknown there, or they are here already).
        ``tenure``: the revision of this node's writer tenure. Every shard
        published before it is known only once the watched state has
        reached it (those after are this node's own): ShardsUnavailable if
        that takes over ``timeout`` seconds."""
        if not self.mirror.caught_up(tenure, timeout):
            raise ShardsUnavailable(f"collection {name!r}: this node's view of the cluster has not reached its own "
                                    f"writer tenure (revision {tenure}) after {timeout} s, so the published shards "
                                    "this delete may name are not known yet (nothing was deleted): retry")
        state = self.mirror.state()
        published = state.published.get(name, {})
        wanted = set(published) if shards is None else set(shards) & published.keys()
        if not wanted - self._here(name):
            return
        with self._lock:
            for shard_id in sorted(wanted - self._here(name)):
                self._take(state, name, shard_id)

    def _here(self, name: str) -> set[int]:
        return {view.shard for view in self.store.collection(name).views()}

    def _take(self, state: ClusterState, name: str, shard_id: int) -> None:
        final = self.store.collection(name).shard_path(shard_id)
        tmp = final.with_name(final.name + layout.TMP_SUFFIX)
        objects = shard_objects(state, name, shard_id)
        try:  # the delete log grows here: never a link to the cache's
            fetched = gather_files(self.objects, tmp, objects, lambda file, obj: None if file == layout.DELETES
                                   else self.cache.installed_file(name, shard_id, file, obj.key))
            tmp.rename(final)
            fsync_dir(final.parent)
        except (ClusterError, OSError) as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise ShardsUnavailable(f"shard {shard_id} of {name!r} is published by another node and must be "
                                    f"brought here to delete in it; that failed (nothing was deleted): {e}") from e
        try:
            rows = self.store.seam.adopt_shard(name, shard_id)
        except (ShardmgrError, ShardDamaged, OSError) as e:
            shutil.rmtree(final, ignore_errors=True)
            fsync_dir(final.parent)
            raise ShardsUnavailable(f"shard {shard_id} of {name!r}, brought here to delete in it, failed its "
                                    f"checks (nothing was deleted): {e}") from e
        if layout.DELETES in objects:
            self.merger.note(name, shard_id, objects[layout.DELETES].key)
        self.counters["shards_taken_total"] += 1
        log.info("took shard %d of %s (%d rows) into this node's store to delete in it (fetched %s, the rest "
                 "linked from the cache)", shard_id, name, rows, ", ".join(sorted(fetched)) or "nothing")
