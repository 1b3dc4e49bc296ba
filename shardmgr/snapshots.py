"""Snapshots: a consistent copy of a data directory at one durable point.

``take(dest, store, broker)`` (the server's ``snapshot`` command, and
embedded callers holding both) freezes the queue (its owner lock) and then
the store (its write lock), flushes once, copies both (workq/disk/copies.py,
shardmgr/store/copies.py: sealed shard files hard-linked where ``dest`` is
on the same file system, everything that still changes copied up to its
durable end) and lets go. The copy is built in ``<dest>.tmp``, synced, and
renamed to ``dest`` at the end: ``dest`` exists whole or not at all.

The snapshot is a data directory: ``shardmgr verify DEST --deep`` passes and
``shardmgr serve --data DEST`` serves the rows, deletes and queue state of
that instant (its growing shards are sealed at their first open, as after a
crash: no row was lost, since everything was flushed). Appends, deletes,
enqueues, leases and completions wait while the files are copied; reads
(searches, gets) do not.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

from common.journal import Flusher, FlusherConfig
from common.journal.copying import sync_tree
from common.journal.filesystem import fsync_dir, make_dirs
from shardmgr.errors import ShardmgrError
from shardmgr.store.config import StoreConfig
from shardmgr.store.store import Store
from workq.broker import Broker

TMP_SUFFIX = ".tmp"


class CannotSnapshot(ShardmgrError):
    """The snapshot could not be taken (its destination exists, or is not writable); nothing was left behind."""

    code = "shardmgr.cannot_snapshot"


def take(dest: str | Path, store: Store, broker: Broker | None = None, *, serving: bool = True) -> dict[str, Any]:
    """Copy ``store`` (and ``broker``'s queue) to the new directory ``dest``
    at one durable point; returns {dest, seconds, paused_s, bytes_copied}.
    ``serving=False``: neither runs its threads (an offline copy), so the
    queue needs no freezing (and has no owner thread to freeze it)."""
    dest = Path(dest).absolute()
    building = dest.with_name(dest.name + TMP_SUFFIX)
    if dest.exists():
        raise CannotSnapshot(f"snapshot destination {dest} exists: give a new path")
    shutil.rmtree(building, ignore_errors=True)  # an attempt a crash cut short
    started = time.monotonic()
    try:
        make_dirs(building)
        paused, copied = broker.frozen(lambda: _copy(building, store, broker)) \
            if broker is not None and serving else _copy(building, store, broker)
        sync_tree(building)
        os.rename(building, dest)
        fsync_dir(dest.parent)
    except OSError as exc:
        shutil.rmtree(building, ignore_errors=True)
        raise CannotSnapshot(f"snapshot to {dest} failed: {exc}") from exc
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return {"dest": str(dest), "seconds": round(time.monotonic() - started, 3), "paused_s": round(paused, 3),
            "bytes_copied": copied}


def _copy(building: Path, store: Store, broker: Broker | None) -> tuple[float, int]:
    """Under the queue's owner lock (if any): freeze the store, flush, copy both; (seconds paused, bytes)."""
    started = time.monotonic()
    with store.frozen():
        store.flusher.flush_now()
        if broker is not None and broker.flusher is not store.flusher:
            broker.flusher.flush_now()
        copied = broker.copy_files(building) if broker is not None else 0
        copied += store.copy_files(building)
    return time.monotonic() - started, copied


def snapshot(data_dir: str | Path, dest: str | Path) -> dict[str, Any]:
    """Snapshot a data directory no server has open (embedded use): recover
    its store and queue (no maintenance, index or owner thread runs: nothing
    but recovery changes the directory), take the snapshot, close."""
    flusher = Flusher(FlusherConfig())
    flusher.start()
    try:
        store = Store(data_dir, StoreConfig(), flusher=flusher)
        store.recover()  # takes the directory's lock, for both
        with store:
            broker = Broker(data_dir, flusher=flusher, lock=False)
            broker.recover()
            try:
                return take(dest, store, broker, serving=False)
            finally:
                broker.close()
    finally:
        flusher.stop()
