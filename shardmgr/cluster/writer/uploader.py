"""Upload on seal: the sealed shards of the collections this node writes go
to the object store, are checked, and only then are published in the shard
map under the writer's fencing token.

It runs on the node's thread (node.py), never on the append path: a seal
only wakes that thread (``Store.on_sealed``). One pass, :meth:`run_once`,
for each collection this node writes:

1. At a new tenure, read which shards are published (later, only this
   tenure publishes, so the set is kept up to date locally).
2. For each local sealed shard not published, in id order, whose retry time
   has come: upload each file (``Store.seam.sealed_shards``: vectors, ids,
   journal, deletes if any) with a write-once put to the tenure's path
   (``ShardMap.object_key``) and check the stored size and crc32c
   (``ObjectStore.put_file``). The delete log, which grows with every
   delete, goes up as a durable copy (``Store.seam.copy_deletes``), so its
   checksum is of the bytes sent; later deletes are published by
   extras_uploader.py. An object already there from an earlier
   attempt of this tenure is kept if it matches the file, else replaced
   (only this tenure writes under its path, and an attempt after a failed
   one first looks whether that one's publish went through with its answer
   lost: then the shard is published, and nothing is uploaded again).
3. Publish the entry (``ShardMap.publish``: fenced, write-once). Only now is
   the shard part of the cluster's store.

Failures: an unreachable or failing S3 or etcd is logged and the shard is
retried after a pause that doubles from ``upload_retry_min_s`` to
``upload_retry_max_s``; the shard stays local meanwhile and is searched on
this node as before. ``NotWriter`` (the tenure ended: lease lost, another
node writes now) steps the node down for the collection and publishes
nothing. ``ShardConflict`` (the id is published with other contents: a data
directory from before cluster mode) is logged as an error and not retried.

Test hook (crash tests): with ``SHARDMGR_CLUSTER_TEST_HOOK`` set to
``before_publish:kill`` or ``before_publish:stop`` in its environment, the
uploading thread sends itself SIGKILL or SIGSTOP once (which stops or kills
the whole process), after the uploads of a shard and just before its
publish.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from shardmgr.cluster.backoff import Backoff, Failure
from shardmgr.cluster.config import ClusterConfig, NodeConfig
from shardmgr.cluster.errors import (
    ChecksumMismatch,
    ClusterError,
    NotWriter,
    ObjectExists,
    ShardConflict,
)
from shardmgr.cluster.state.election import Writer
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.objects import ObjectInfo, ObjectStore, file_crc32c
from shardmgr.cluster.state.shard_map import ShardEntry, ShardMap, ShardObject
from shardmgr.errors import UnknownCollection
from shardmgr.store import SealedShard, Store, layout

log = logging.getLogger(__name__)

TEST_HOOK_ENV = "SHARDMGR_CLUSTER_TEST_HOOK"


class Uploader:
    """Uploads and publishes the sealed shards of held collections (one thread: the node's)."""

    def __init__(self, config: ClusterConfig, node: NodeConfig, store: Store, objects: ObjectStore,
                 on_fenced: Callable[[str, Writer, str], None]) -> None:
        self.config = config
        self.node = node
        self.store = store
        self.objects = objects
        self._on_fenced = on_fenced  # (collection, token, why): step down
        self._kv = Kv(config)
        #: shard ids known to be published, per collection (they never become unpublished)
        self._published: dict[str, set[int]] = {}
        self._tenure: dict[str, int] = {}  # the tenure (revision) whose view of the map _published is
        self._retry = Backoff(node.upload_retry_min_s, node.upload_retry_max_s)  # per failed shard
        self._given_up: set[tuple[str, int]] = set()  # ShardConflict: never retried
        #: deleted rows in the delete log each shard this process published went up with (0: none)
        self.entry_deletes: dict[tuple[str, int], int] = {}
        self._hook_fired = False
        self.counters = {"shards_published_total": 0, "objects_uploaded_total": 0, "bytes_uploaded_total": 0,
                         "uploads_failed_total": 0, "publishes_fenced_total": 0, "shard_conflicts_total": 0}

    def close(self) -> None:
        self._kv.close()

    def run_once(self, held: dict[str, Writer], stop: threading.Event) -> None:
        """Upload and publish what is due in every held collection (module docstring)."""
        for name, token in held.items():
            if stop.is_set():
                return
            try:
                if self._tenure.get(name) != token.revision:
                    self._refresh(name)
                    self._tenure[name] = token.revision
                for sealed in self._unpublished_local(name):
                    if stop.is_set() or not self._upload_and_publish(sealed, token):
                        break  # fenced: this tenure is over
            except UnknownCollection:
                continue

    def unpublished(self, name: str) -> list[int]:
        """Ids of local sealed shards of ``name`` not published (as etcd says
        now, if the last look left any); a node campaigns to publish them."""
        missing = [s.shard_id for s in self._unpublished_local(name)]
        if missing:
            self._refresh(name)
            missing = [s.shard_id for s in self._unpublished_local(name)]
        return missing

    def failures(self) -> Mapping[tuple[str, int], Failure]:
        """The shards whose upload or publish is failing now, by (collection,
        shard id): a snapshot, safe from any thread (the node's report)."""
        return self._retry.failures()  # type: ignore[return-value]  # its keys are (collection, shard id)

    def published(self, name: str) -> set[int]:
        return set(self._published.get(name, ()))

    def _refresh(self, name: str) -> None:
        shards, _ = ShardMap(self.config, name, self._kv).read()
        self._published.setdefault(name, set()).update(shards)

    def _unpublished_local(self, name: str) -> list[SealedShard]:
        known = self._published.get(name, set())
        return [s for s in self.store.seam.sealed_shards(name)
                if s.shard_id not in known and (name, s.shard_id) not in self._given_up]

    def _upload_and_publish(self, sealed: SealedShard, token: Writer) -> bool:
        """One shard, if its retry time has come; False if the tenure is over."""
        key = (sealed.collection, sealed.shard_id)
        if not self._retry.due(key):
            return True
        shard_map = ShardMap(self.config, sealed.collection, self._kv)
        try:
            if self._retry.failing(key) and self._ours(shard_map, sealed.shard_id, token):
                # a publish whose answer was lost went through: a new attempt must not replace its objects
                # (its delete log copy would differ), so it ends here
                self._retry.succeeded(key)
                self._published.setdefault(sealed.collection, set()).add(sealed.shard_id)
                return True
            with tempfile.TemporaryDirectory(prefix="shardmgr-upload-") as scratch:
                files, deleted = self._stable_files(sealed, Path(scratch))
                objects = tuple(self._put(sealed, name, path, shard_map.object_key(sealed.shard_id, token, name))
                                for name, path in files)
            self._test_hook("before_publish", sealed)
            entry = ShardEntry(collection=sealed.collection, shard_id=sealed.shard_id, rows=sealed.rows,
                               objects=objects, deleted=deleted)
            revision = shard_map.publish(token, entry)
        except NotWriter as e:
            self.counters["publishes_fenced_total"] += 1
            log.warning("publish of shard %d of %s refused by the fence: %s", sealed.shard_id, sealed.collection, e)
            self._on_fenced(sealed.collection, token, f"fenced: {e}")
            return False
        except ShardConflict as e:
            self.counters["shard_conflicts_total"] += 1
            self._given_up.add(key)
            self._retry.failed(key, f"{type(e).__name__}: {e} (not retried)")  # shown in the node's report
            log.error("shard %d of %s is not published, and will not be: %s", sealed.shard_id, sealed.collection, e)
            return True
        except (ClusterError, OSError) as e:
            self.counters["uploads_failed_total"] += 1
            pause = self._retry.failed(key, f"{type(e).__name__}: {e}")
            log.warning("uploading shard %d of %s failed (retried in %.1f s; the shard stays local): %s",
                        sealed.shard_id, sealed.collection, pause, e)
            return True
        self._retry.succeeded(key)
        self._published.setdefault(sealed.collection, set()).add(sealed.shard_id)
        self.entry_deletes[key] = deleted
        self.counters["shards_published_total"] += 1
        log.info("published shard %d of %s (%d rows, %d objects) at revision %d under tenure %d", sealed.shard_id,
                 sealed.collection, sealed.rows, len(objects), revision, token.revision)
        return True

    @staticmethod
    def _ours(shard_map: ShardMap, shard_id: int, token: Writer) -> bool:
        """Whether ``shard_id`` is published under ``token``'s tenure."""
        entry = shard_map.get(shard_id)
        return entry is not None and entry.writer_revision == token.revision

    def _stable_files(self, sealed: SealedShard, scratch: Path) -> tuple[list[tuple[str, Path]], int]:
        """The shard's files to upload, its delete log replaced by a durable
        copy in ``scratch`` (left out if it holds no deleted row); and the
        deleted rows in that copy."""
        files, deleted = [], 0
        for name, path in sealed.files:
            if name == layout.DELETES:
                path = scratch / name
                deleted = self.store.seam.copy_deletes(sealed.collection, sealed.shard_id, path)
                if not deleted:
                    continue
            files.append((name, path))
        return files, deleted

    def _put(self, sealed: SealedShard, name: str, path: Path, key: str) -> ShardObject:
        """Upload one file write-once and check it (module docstring, step 2)."""
        try:
            info = self.objects.put_file(path, key)
        except ObjectExists:
            info = self._kept_or_replaced(path, key)
        except ChecksumMismatch:
            self.objects.delete(key)  # our own path: a bad copy goes, the retry puts it again
            raise
        self.counters["objects_uploaded_total"] += 1
        self.counters["bytes_uploaded_total"] += info.size
        assert info.crc32c is not None
        return ShardObject(name=name, key=key, size=info.size, crc32c=info.crc32c)

    def _kept_or_replaced(self, path: Path, key: str) -> ObjectInfo:
        stored = self.objects.head(key)
        crc, size = file_crc32c(path)
        if stored is not None and (stored.size, stored.crc32c) == (size, crc):
            return stored
        log.warning("%s holds another version of %s (an earlier attempt of this tenure): replacing it", key, path)
        self.objects.delete(key)
        return self.objects.put_file(path, key)

    def _test_hook(self, point: str, sealed: SealedShard) -> None:
        action = os.environ.get(TEST_HOOK_ENV, "")
        if self._hook_fired or not action.startswith(point + ":"):
            return
        self._hook_fired = True
        sig = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}[action.split(":", 1)[1]]
        log.warning("test hook %s: %s to myself before publishing shard %d of %s", action, sig.name,
                    sealed.shard_id, sealed.collection)
        for handler in logging.getLogger().handlers:
            handler.flush()
        # to this thread, not the process: a process-directed SIGSTOP wakes the main thread to stop the
        # group, and until it runs this thread goes on (a publish slipped through that way on 2 busy cores)
        signal.pthread_kill(threading.get_ident(), sig)
