"""Deletes and indexes after publish: the writer uploads what changes in a
shard after its first publish, and publishes it beside the shard map
(extras.py; docs/cluster.md, "Deletes and indexes after publish").

It runs on the node's thread (node.py), after the uploader in each pass,
for each collection this node writes, over the shards that are published:

- **Deletes.** A delete that newly deletes rows of a sealed shard is
  announced by the store (``Store.on_deleted``, under its write lock: it
  only notes the shard; it does not wake the thread, so the deletes of a
  busy shard go up at most once a pass, normally every
  ``scan_interval_s``, unless the node holds half of ``max_held_deletes``:
  acked_deletes.py). If the shard's local deleted rows are more than
  those published, a durable copy of its delete log is taken
  (``Store.seam.copy_deletes``), uploaded write-once to ``<shard
  id>/<tenure>/deletes.<rows>`` and checked (``ObjectStore.put_file``), and
  published (``ShardExtras.publish_deletes``: fenced, forward only). A
  shard this node *promised* a deletes key for (:meth:`promise`: it
  acknowledged a delete whose rows only a key it publishes itself can be
  known to hold; acked_deletes.py) gets one even if its log holds no more
  rows than the published one.
- **Indexes.** A built index is announced (``Store.on_indexed``, which
  wakes the thread); once the shard is published, its files go up
  write-once under the tenure's path and are published
  (``ShardExtras.publish_index``: fenced, write-once). An index built before
  the shard was published goes up right after the shard.

What is published already: at each new tenure, read from etcd (the shard
map and both kinds of extras) and every published shard is looked at once;
later, only this tenure publishes, so it is kept locally, with the deleted
rows each shard this process published went up with (the uploader's
``entry_deletes``). A shard published with a delete log by an earlier run,
and with no deletes key, holds an unknown number of deleted rows in its
entry: if it has any locally, its log is published once more.

A node that holds deletes or an index of a published shard that are not
published, and does not write the collection (it restarted, or stepped
down), campaigns for it as for unpublished shards (:meth:`unpublished`,
node.py), and publishes them once it writes it again.

Failures: as the uploader's. S3 or etcd failing is logged and retried after
a pause that doubles from ``upload_retry_min_s`` to ``upload_retry_max_s``
(backoff.py), per shard and kind; ``NotWriter`` steps the node down for the
collection (``on_fenced``) and publishes nothing.

Threads: the store's callbacks run on writing threads under the store's
write lock and take ``_lock`` only to note a shard; the node's thread takes
``_lock`` only to collect those notes, never while it calls the store.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from common.journal.errors import JournalError
from shardmgr.cluster.backoff import Backoff, Failure
from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.errors import ChecksumMismatch, ClusterError, NotWriter, ObjectExists
from shardmgr.cluster.published.deletes_merger import DeletesMerger
from shardmgr.cluster.state.election import Writer
from shardmgr.cluster.state.extras import DeletesEntry, IndexEntry, Kind, ShardExtras
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.objects import ObjectInfo, ObjectStore, file_crc32c
from shardmgr.cluster.state.shard_map import ShardMap, ShardObject
from shardmgr.cluster.writer.uploader import Uploader
from shardmgr.errors import UnknownCollection
from shardmgr.store import SealedShard, Store, layout

log = logging.getLogger(__name__)


class ExtrasUploader:
    """Uploads and publishes the deletes and indexes of published shards (module docstring)."""

    def __init__(self, config: ClusterConfig, node: NodeConfig, store: Store, objects: ObjectStore,
                 uploader: Uploader, on_fenced: Callable[[str, Writer, str], None],
                 wake: Callable[[], None], merger: DeletesMerger | None = None) -> None:
        self.config = config
        self.store = store
        self.objects = objects
        self.uploader = uploader
        self._on_fenced = on_fenced  # (collection, token, why): step down
        self._wake = wake
        self._merger = merger  # before a delete log goes up, the one published now is merged into it
        self._kv = Kv(config)
        self._extras = ShardExtras(config, self._kv)
        self._lock = threading.Lock()
        self._announced: set[tuple[str, int]] = set()  # by the store's callbacks, under _lock
        self._tenure: dict[str, int] = {}  # the tenure whose view the sets below are
        self._seen: dict[str, set[int]] = {}  # published shards already looked at in this tenure
        self._pending: dict[str, set[int]] = {}  # published shards to look at (again)
        #: deleted rows published per shard (deletes key, or the entry's own log); None: unknown
        self._deletes_there: dict[tuple[str, int], int | None] = {}
        self._index_there: set[tuple[str, int]] = set()
        self._promised: dict[tuple[str, int], int] = {}  # shard -> deleted rows a key of this node's must hold
        self._retry = Backoff(node.upload_retry_min_s, node.upload_retry_max_s)
        self.counters = {"deletes_published_total": 0, "indexes_published_total": 0, "extras_failed_total": 0,
                         "extras_fenced_total": 0}
        store.on_deleted.append(self._deleted)
        store.on_indexed.append(self._indexed)

    def close(self) -> None:
        self._kv.close()

    def _deleted(self, name: str, shard_id: int) -> None:
        with self._lock:
            self._announced.add((name, shard_id))

    def promise(self, name: str, shard_id: int, count: int) -> None:
        """Publish a deletes key of shard ``shard_id`` of ``name`` holding at
        least ``count`` rows (module docstring), once the shard is published."""
        with self._lock:
            self._promised[(name, shard_id)] = max(count, self._promised.get((name, shard_id), 0))
            self._announced.add((name, shard_id))

    def _indexed(self, name: str, shard_id: int) -> None:
        with self._lock:
            self._announced.add((name, shard_id))
        self._wake()

    # ------------------------------------------------------------- a pass

    def run_once(self, held: dict[str, Writer], stop: threading.Event) -> None:
        """Publish what is due in every held collection (module docstring)."""
        with self._lock:
            announced, self._announced = self._announced, set()
        for name, token in held.items():
            if stop.is_set():
                return
            try:
                if self._tenure.get(name) != token.revision:
                    self._start_tenure(name)
                    self._tenure[name] = token.revision
                for shard_id in self._due(name, {s for c, s in announced if c == name}):
                    if stop.is_set() or not self._shard(name, shard_id, token):
                        break  # fenced: this tenure is over
            except UnknownCollection:
                continue
        # announcements of collections not held are dropped: a tenure's start looks at every shard

    def failures(self) -> Mapping[tuple[str, int, str], Failure]:
        """The deletes and indexes whose publish is failing now, by
        (collection, shard id, "deletes" or "indexes"): a snapshot, safe from
        any thread (the node's report)."""
        return self._retry.failures()  # type: ignore[return-value]  # its keys are (collection, shard id, kind)

    def unpublished(self, name: str) -> bool:
        """Whether deletes or an index of a published shard of ``name`` are
        here and not published (as etcd says now, if the last look left
        any): a node that does not write ``name`` campaigns to publish them,
        as for unpublished shards (node.py)."""
        if not self._missing(name):
            return False
        self._read(name)
        return self._missing(name)

    def _missing(self, name: str) -> bool:
        published = self.uploader.published(name)
        return any(s.shard_id in published and (self._needs("deletes", s) or self._needs("indexes", s))
                   for s in self.store.seam.sealed_shards(name))

    def _start_tenure(self, name: str) -> None:
        """Read what is published of ``name`` (module docstring); look at every published shard."""
        self._read(name)
        self._seen[name] = set()
        self._pending[name] = set()

    def _read(self, name: str) -> None:
        shards, _ = ShardMap(self.config, name, self._kv).read()
        view = self._extras.read(name)
        for shard_id, entry in shards.items():
            key = (name, shard_id)
            if shard_id in view.deletes:
                self._deletes_there[key] = view.deletes[shard_id].deleted
            elif key in self.uploader.entry_deletes:
                self._deletes_there[key] = self.uploader.entry_deletes[key]
            else:
                self._deletes_there[key] = None if any(o.name == layout.DELETES for o in entry.objects) else 0
            if shard_id in view.indexes:
                self._index_there.add(key)

    def _due(self, name: str, announced: set[int]) -> list[int]:
        """The published shards of ``name`` to look at in this pass, by id."""
        published = self.uploader.published(name)
        seen, pending = self._seen[name], self._pending[name]
        pending |= (published - seen) | announced
        seen |= published
        pending &= published  # an unpublished shard is looked at once it is published
        return sorted(pending)

    def _shard(self, name: str, shard_id: int, token: Writer) -> bool:
        """Publish what one shard needs; False if the tenure is over."""
        sealed = self.store.seam.sealed_shard(name, shard_id)
        done = True
        for kind in ("deletes", "indexes"):
            if sealed is None or not self._needs(kind, sealed):
                continue
            retry = (name, shard_id, kind)
            if not self._retry.due(retry):
                done = False
                continue
            try:
                if kind == "deletes":
                    self._publish_deletes(sealed, token)
                else:
                    self._publish_index(sealed, token)
            except NotWriter as e:
                self.counters["extras_fenced_total"] += 1
                log.warning("publishing the %s of shard %d of %s refused by the fence: %s", kind, shard_id, name, e)
                self._on_fenced(name, token, f"fenced: {e}")
                return False
            except (ClusterError, JournalError, OSError) as e:  # JournalError: a published log is not this shard's
                self.counters["extras_failed_total"] += 1
                done = False
                log.warning("publishing the %s of shard %d of %s failed (retried in %.1f s): %s", kind, shard_id,
                            name, self._retry.failed(retry, f"{type(e).__name__}: {e}"), e)
                continue
            self._retry.succeeded(retry)
        if done:
            self._pending[name].discard(shard_id)
        return True

    def _needs(self, kind: Kind, sealed: SealedShard) -> bool:
        key = (sealed.collection, sealed.shard_id)
        if kind == "indexes":
            return bool(sealed.index_files) and key not in self._index_there
        return sealed.deleted > (self._there(key) or 0) or key in self._promised

    def _there(self, key: tuple[str, int]) -> int | None:
        """Deleted rows of a shard published (None: unknown, module docstring)."""
        return self._deletes_there.get(key, self.uploader.entry_deletes.get(key))

    # ---------------------------------------------------------- publishing

    def _publish_deletes(self, sealed: SealedShard, token: Writer) -> None:
        """A durable copy of the delete log, uploaded and published (module docstring)."""
        name, shard_id = sealed.collection, sealed.shard_id
        shard_map = ShardMap(self.config, name, self._kv)
        if self._merger is not None:
            now = self._extras.deletes_of(name, shard_id)
            if now is not None:
                self._merger.merge(now, always=True)  # it may hold rows this log lacks (another node's)
        with tempfile.TemporaryDirectory(prefix="shardmgr-deletes-") as scratch:
            copy = Path(scratch) / layout.DELETES
            deleted = self.store.seam.copy_deletes(name, shard_id, copy)
            if deleted <= (self._there((name, shard_id)) or 0) and (name, shard_id) not in self._promised:
                return  # nothing beyond what is published
            key = shard_map.object_key(shard_id, token, f"{layout.DELETES}.{deleted}")
            stored = self._put(copy, key, same_rows=True)
        obj = ShardObject(layout.DELETES, key, stored.size, _crc(stored))
        there = self._extras.publish_deletes(token, DeletesEntry(name, shard_id, obj, deleted))
        self._deletes_there[(name, shard_id)] = there.deleted
        with self._lock:  # kept (this node's key with as many rows), or moot (the key there holds every row here)
            if self._promised.get((name, shard_id), 0) <= deleted:
                self._promised.pop((name, shard_id), None)
        if there.object == obj:
            if self._merger is not None:
                self._merger.note(name, shard_id, obj.key)  # a copy of the log here: never fetched back
            self.counters["deletes_published_total"] += 1
            log.info("published the deletes of shard %d of %s: %d rows (%s)", shard_id, name, deleted, key)

    def _publish_index(self, sealed: SealedShard, token: Writer) -> None:
        """The shard's index files, uploaded and published (module docstring)."""
        shard_map = ShardMap(self.config, sealed.collection, self._kv)
        files = []
        for file_name, path in sealed.index_files:
            key = shard_map.object_key(sealed.shard_id, token, file_name)
            stored = self._put(path, key, same_rows=False)
            files.append(ShardObject(file_name, key, stored.size, _crc(stored)))
        entry = IndexEntry(sealed.collection, sealed.shard_id, tuple(files))
        there = self._extras.publish_index(token, entry)
        self._index_there.add((sealed.collection, sealed.shard_id))
        if there.files == entry.files:
            self.counters["indexes_published_total"] += 1
        log.info("published the index of shard %d of %s (%s)", sealed.shard_id, sealed.collection,
                 ", ".join(f"{o.name}: {o.size} bytes" for o in there.files))

    def _put(self, path: Path, key: str, *, same_rows: bool) -> ObjectInfo:
        """Upload ``path`` write-once to ``key`` (this tenure's path) and check it.

        An object already there is an earlier attempt of this tenure (whose
        publish may have gone through with its answer lost, so it is never
        replaced): a delete log copy named for the same deleted rows holds
        the same rows (``same_rows``), and is kept; an index file is kept if
        its bytes are the file's, else ChecksumMismatch."""
        try:
            return self.objects.put_file(path, key)
        except ObjectExists:
            stored = self.objects.head(key)
            if stored is None or stored.crc32c is None:
                raise ChecksumMismatch(f"{self.objects.url(key)}: an earlier attempt's object without a checksum "
                                       f"(or gone since); not replaced") from None
            if same_rows or (stored.crc32c, stored.size) == file_crc32c(path):
                return stored
            raise ChecksumMismatch(f"{self.objects.url(key)} holds other bytes than {path}; not replaced") from None
        except ChecksumMismatch:
            self.objects.delete(key)  # the stored copy is not what was sent: never published, the retry puts it again
            raise


def _crc(info: ObjectInfo) -> int:
    assert info.crc32c is not None, f"{info.key}: checked objects have a crc32c"
    return info.crc32c
