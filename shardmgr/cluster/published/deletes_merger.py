"""Deletes published by another node, merged into the copies of a shard in
this node's own data directory.

A published shard's deleted rows are a set that only grows, and the
deletes key (extras.py) says how many the newest published delete log
holds. Its publisher compares counts: "as many or more" means "the same
rows or more" only while every log it compares holds the published one.
Since a writer may take a shard another node wrote in order to delete in
it (taker.py), two nodes can hold their own delete logs of one shard, each
with rows the other lacks. So a node merges before it relies on its log:

- a writer, before it copies a delete log to publish it
  (extras_uploader.py), merges the log published now;
- every node, when the watch shows a newer delete log of a shard it holds
  in its own data directory (its first writer, or a writer that took it),
  merges it, so that searches it answers from that copy skip those rows
  (cache.py calls :meth:`DeletesMerger.catch_up` at each state change).

Merging fetches the published log (checked against its key's size and
crc32c), and deletes in the local shard every row it deletes
(``Store.seam.merge_deletes``: through the store's delete log, durable on
return). A log already merged is not fetched again, nor one that is not
this shard's (FormatError, logged). At a state change, a log this node
published is skipped while the local log holds as many rows (logs only
grow; fewer means a data directory restored from a copy); before a
publish, the published log is merged whoever published it.

A writer also merges, before it writes a delete, the logs it is behind on
among the shards the delete names (:meth:`DeletesMerger.merge_named`), so
that what it tells of the delete holds (acked_deletes.py).

Until a log another node published is merged, the node does not announce
its own copy of that shard as ready (:meth:`DeletesMerger.behind`, used by
cache.py): searches go to other copies, or name the shard as missing, but
never return rows deleted elsewhere from a copy that lacks those deletes.

Threads: any (a connection's, the node's, the cache's); one lock
serialises merges.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from pathlib import Path

from common.journal.errors import FormatError, JournalError
from shardmgr.cluster.errors import ClusterError, ShardsUnavailable
from shardmgr.cluster.published.mirror import ClusterState
from shardmgr.cluster.state.extras import DeletesEntry
from shardmgr.cluster.state.objects import ObjectStore
from shardmgr.errors import UnknownCollection
from shardmgr.store import SealedShard, Store, layout

log = logging.getLogger(__name__)


class DeletesMerger:
    """Merges other nodes' published delete logs into this node's own shards (module docstring)."""

    def __init__(self, node_id: str, store: Store, objects: ObjectStore) -> None:
        self.node_id = node_id
        self.store = store
        self.objects = objects
        self._lock = threading.Lock()
        self._merged: dict[tuple[str, int], str] = {}  # shard -> object key of the log last merged
        self._refused: dict[tuple[str, int], str] = {}  # shard -> object key of a log that is not its own
        self._own: dict[tuple[str, int], str] = {}  # shard -> object key of its own log, skipped (not held)
        self.counters = {"deletes_merged_total": 0, "delete_merges_failed_total": 0}

    def merge(self, entry: DeletesEntry, *, always: bool = False) -> int:
        """Merge ``entry``'s log into the local shard; the rows newly deleted
        (0 if the shard is not sealed here). Without ``always``, a log this
        node published is skipped unless the local log holds fewer rows (a
        data directory restored from a copy). Raises what fetching raises
        (ClusterError), and FormatError for a log that is not this shard's
        (nothing deleted; that log is not fetched again)."""
        key = (entry.collection, entry.shard_id)
        if entry.object.key in (self._merged.get(key), self._refused.get(key)) \
                or (not always and entry.object.key == self._own.get(key)):
            return 0
        with self._lock:
            sealed = self._sealed(entry)
            if entry.object.key == self._merged.get(key) or sealed is None:
                return 0
            if not always and entry.node == self.node_id and sealed.deleted >= entry.deleted:
                self._own[key] = entry.object.key  # not looked at again at each pass
                return 0  # its own log, and no shorter here: logs only grow
            with tempfile.TemporaryDirectory(prefix="shardmgr-merge-") as scratch:
                self.objects.fetch(entry.object.key, Path(scratch) / layout.DELETES, size=entry.object.size,
                                   crc=entry.object.crc32c)
                try:
                    deleted = self.store.seam.merge_deletes(entry.collection, entry.shard_id, Path(scratch))
                except FormatError:
                    self._refused[key] = entry.object.key
                    raise
            self._merged[key] = entry.object.key
        self.counters["deletes_merged_total"] += deleted
        if deleted:
            log.info("merged %d rows deleted by %s into shard %d of %s (%s)", deleted, entry.node, entry.shard_id,
                     entry.collection, entry.object.key)
        return deleted

    def note(self, name: str, shard_id: int, object_key: str) -> None:
        """The local log of a shard holds every row of ``object_key`` (a log taken here, or published from
        here): nothing to merge from it."""
        with self._lock:
            self._merged[(name, shard_id)] = object_key

    def behind(self, state: ClusterState) -> set[tuple[str, int]]:
        """The shards of this node's own store whose published log (in
        ``state``) another node published and this one has not merged: its
        copy may return rows deleted elsewhere, so it is not served."""
        late: set[tuple[str, int]] = set()
        for name, entries in state.deletes.items():
            foreign = [shard_id for shard_id, entry in entries.items()
                       if entry.node != self.node_id and self._merged.get((name, shard_id)) != entry.object.key]
            if foreign:
                here = self.store.seam.sealed_ids(name)
                late.update((name, shard_id) for shard_id in foreign if shard_id in here)
        return late

    def merge_named(self, state: ClusterState, name: str, shards: frozenset[int] | None) -> None:
        """Before a delete of ``shards`` of ``name`` (None: every shard) is
        written on the writer: merge the logs :meth:`behind` names among them,
        so that its copy holds every row of each key in ``state``
        (acked_deletes.written). ShardsUnavailable (nothing deleted) if one
        cannot be fetched."""
        for collection, shard_id in sorted(self.behind(state)):
            if collection != name or (shards is not None and shard_id not in shards):
                continue
            try:
                self.merge(state.deletes[name][shard_id])
            except (ClusterError, OSError) as e:
                raise ShardsUnavailable(f"shard {shard_id} of {name!r}: merging the deletes another node published "
                                        f"failed (nothing was deleted): {e}") from e
            except JournalError as e:  # not this shard's log: logged, and never merged (module docstring)
                log.warning("shard %d of %s: the published deletes are not merged: %s", shard_id, name, e)

    def _sealed(self, entry: DeletesEntry) -> SealedShard | None:
        try:
            return self.store.seam.sealed_shard(entry.collection, entry.shard_id)
        except UnknownCollection:
            return None

    def catch_up(self, state: ClusterState) -> None:
        """Merge the published delete log of every sealed shard in this
        node's own store that :meth:`merge` would take; failures are logged
        and retried at the next call."""
        for name, entries in state.deletes.items():
            for shard_id in sorted(self.store.seam.sealed_ids(name) & entries.keys()):
                try:
                    self.merge(entries[shard_id])
                except (ClusterError, JournalError, OSError) as e:
                    self.counters["delete_merges_failed_total"] += 1
                    log.warning("merging the published deletes of shard %d of %s failed (retried): %s", shard_id,
                                name, e)
