"""The store's background work: idle seals, rewrites and index builds.

Two threads, started by ``Store.start`` and stopped by ``Store.close``:
``shardmgr-maintenance`` wakes every second, seals each collection's growing
shard if it stayed idle for ``idle_seal_s`` and runs one due rewrite per
collection (rewrite.py); ``shardmgr-index`` builds the approximate index of
one sealed shard at a time (index.py), persists it beside the shard and
installs it. Both hold the store's write lock only to read what is due and
to install what was built; rewrites and index builds run off it, so
appends, deletes and searches go on meanwhile. One rewrite runs at a time,
the thread's or ``compact()``'s (``_rewriting``). A shard whose index build
failed stays searched exactly, and is not tried again until a restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from common.journal import Flusher

from . import index, rewrite
from .collection import Collection
from .config import StoreConfig

log = logging.getLogger(__name__)

MAX_REWRITES = 10_000
"""Most rewrites one compact() call runs (each removes a shard or a share of deleted rows)."""


class Maintenance:
    """The background work over the collections ``collections()`` lists, under the store's ``write`` lock."""

    def __init__(self, collections: Callable[[], list[Collection]], write: threading.Lock, config: StoreConfig,
                 flusher: Flusher) -> None:
        self._collections = collections
        self._write = write
        self._config = config
        self._flusher = flusher
        self._rewriting = threading.Lock()  # one rewrite at a time: the maintenance thread's or compact()'s
        self._index_failed: set[Path] = set()  # shards whose index build failed (index thread)
        self._stop = threading.Event()
        self._maintainer = threading.Thread(target=self._maintain, name="shardmgr-maintenance", daemon=True)
        self._indexer = threading.Thread(target=self._index, name="shardmgr-index", daemon=True)

    def start(self) -> None:
        self._maintainer.start()
        self._indexer.start()

    def stop(self, *, wait_for_index: bool = True) -> None:
        """Stop both threads; return once the maintenance thread has ended (and
        the index thread, unless not ``wait_for_index``: a crash's stop)."""
        self._stop.set()
        for thread in (self._maintainer, self._indexer) if wait_for_index else (self._maintainer,):
            if thread.is_alive():
                thread.join()

    def compact(self, collections: list[Collection]) -> int:
        """Run the rewrites due now in ``collections``, each until none is; how many ran."""
        done = 0
        for collection in collections:
            while done < MAX_REWRITES and self._rewrite_once(collection):
                done += 1
        return done

    def wait_for_indexes(self, timeout: float = 600.0) -> None:
        """Block until every sealed shard that should have an index has one (tests, benchmarks)."""
        deadline = time.monotonic() + timeout
        while any(s.directory not in self._index_failed for c in self._collections() for s in c.unindexed()):
            if time.monotonic() > deadline:
                raise TimeoutError("indexes were not built in time")
            time.sleep(0.1)

    def _maintain(self) -> None:
        while not self._stop.wait(1.0):
            idle_since = time.monotonic() - self._config.idle_seal_s
            for collection in self._collections():
                try:
                    with self._write:
                        collection.seal_idle(idle_since)
                    self._rewrite_once(collection)
                except Exception:  # keep maintaining the others; the error is in the log
                    log.exception("shardmgr: maintaining %s (idle seal, rewrite) failed", collection.name)

    def _rewrite_once(self, collection: Collection) -> bool:
        """Plan, build (off the write lock) and publish one rewrite; False if none is due."""
        with self._rewriting:
            with self._write:
                plan = collection.plan_rewrite(self._index_failed)
            if plan is None:
                return False
            built = rewrite.build(collection.directory, plan, collection.dim, collection.name, self._flusher)
            with self._write:
                collection.publish_rewrite(built, plan)
            return True

    def _index(self) -> None:
        """Build approximate indexes of sealed shards, one at a time, off the write lock."""
        while not self._stop.wait(0.5):
            with self._write:
                todo = [(c, s) for c in self._collections() for s in c.unindexed()
                        if s.directory not in self._index_failed]
            for collection, shard in todo[:1]:
                try:
                    built = index.build(shard.view().vectors, collection.metric, collection.index,
                                        self._config.hnsw_m, self._config.index_train_rows)
                    index.save(shard.directory, built, shard.rows, collection.index, self._config.hnsw_m,
                               shard.uuid)
                except Exception:  # the shard stays searched exactly; not retried until a restart
                    log.exception("shardmgr: building the index of %s failed", shard.directory)
                    self._index_failed.add(shard.directory)
                    continue
                with self._write:
                    collection.install_index(shard, built)
                log.info("shardmgr: %s: %s index of %d rows built", shard.directory, collection.index, shard.rows)
