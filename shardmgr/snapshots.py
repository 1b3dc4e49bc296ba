"""Snapshots: a consistent copy of a data directory at one durable point.

``take(dest, store, broker)`` (the server's ``snapshot`` command, and
embedded callers holding both) freezes the queue (its owner lock) and then
the store (its write lock), flushes once, copies both (workq/disk/copies.py,
shardmgr/store/copies.py: sealed shard files hard-linked where ``dest`` is
on the same file system, everything that still changes copied up to its
durable end) and lets go.

Crashes: the copy is built in ``<dest>.tmp``, which holds the mark
``SNAPSHOT_INCOMPLETE`` (made durable before anything is copied) until the
end: then every file and directory is synced, the mark removed (its
directory synced), the directory renamed to ``dest`` and ``dest``'s parent
synced, and only then is the snapshot reported done. So ``dest`` exists
whole or not at all, after a SIGKILL or a power cut at any point, and a
snapshot reported done survives a power cut; a ``<dest>.tmp`` a crash left
is refused as a data directory (every owner's lock refuses the mark:
common/journal/lockfile.py; verify reports ``incomplete_snapshot``, for an
empty one too, as a kill between the mkdir and the mark leaves it), and the
next snapshot to ``dest`` removes it (mark last) and starts again. One
snapshot runs at a time per process.

The snapshot is a data directory: ``shardmgr verify DEST --deep`` passes and
``shardmgr serve --data DEST`` serves the rows, deletes and queue state of
that instant (its growing shards are sealed at their first open, as after a
crash: no row was lost, since everything was flushed). Appends, deletes,
enqueues, leases and completions wait while the files are copied; reads
(searches, gets) do not.

A ``shardmgr snapshot`` whose answer is lost (the server died, the
connection broke) checks ``dest`` itself when the server seems to be on
its machine (:func:`after_lost_answer`): a ``dest`` that appeared during
the call, complete and verified, is success; otherwise it fails saying how
to tell.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from common.journal import Flusher, FlusherConfig
from common.journal.copying import sync_tree
from common.journal.filesystem import fsync_dir, make_dirs
from common.journal.lockfile import INCOMPLETE_NAME, SNAPSHOT_SUFFIX, incomplete
from shardmgr.errors import ShardmgrError
from shardmgr.store.config import StoreConfig
from shardmgr.store.store import Store
from workq.broker import Broker

_ONE_AT_A_TIME = threading.Lock()  # two snapshots to one dest would remove each other's <dest>.tmp


class CannotSnapshot(ShardmgrError):
    """The snapshot could not be taken (its destination exists, something that is not a snapshot cut short is
    at ``<dest>.tmp``, or the copy failed: not writable, disk full); nothing was left behind."""

    code = "shardmgr.cannot_snapshot"


def take(dest: str | Path, store: Store, broker: Broker | None = None, *, serving: bool = True) -> dict[str, Any]:
    """Copy ``store`` (and ``broker``'s queue) to the new directory ``dest``
    at one durable point; returns {dest, seconds, paused_s, bytes_copied}
    once ``dest`` is whole and durable. ``serving=False``: neither runs its
    threads (an offline copy), so the queue needs no freezing (and has no
    owner thread to freeze it). CannotSnapshot if ``dest`` exists, if a
    ``<dest>.tmp`` is there that is not a snapshot cut short, or if the copy
    fails (nothing is left behind then)."""
    dest = Path(dest).absolute()
    building = dest.with_name(dest.name + SNAPSHOT_SUFFIX)
    with _ONE_AT_A_TIME:
        if dest.exists():
            raise CannotSnapshot(f"snapshot destination {dest} exists: give a new path")
        _clear_leftover(building)
        started = time.monotonic()
        published = False
        try:
            make_dirs(building)
            _mark_incomplete(building)
            paused, copied = broker.frozen(lambda: _copy(building, store, broker)) \
                if broker is not None and serving else _copy(building, store, broker)
            _publish(building, dest)
            published = True
            fsync_dir(dest.parent)
        except BaseException as exc:
            _discard(dest if published else building)
            if isinstance(exc, OSError):
                raise CannotSnapshot(f"snapshot to {dest} failed: {exc}") from exc
            raise
    return {"dest": str(dest), "seconds": round(time.monotonic() - started, 3), "paused_s": round(paused, 3),
            "bytes_copied": copied}


def _mark_incomplete(building: Path) -> None:
    """Create the mark in the empty ``building`` durably, before anything is copied."""
    fd = os.open(building / INCOMPLETE_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"a snapshot being built: not a data directory until renamed (shardmgr/snapshots.py)\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(building)


def _publish(building: Path, dest: Path) -> None:
    """Sync every directory of the whole copy (its files are synced as they
    are copied), remove the mark durably, rename ``building`` to ``dest``."""
    sync_tree(building)
    (building / INCOMPLETE_NAME).unlink()
    fsync_dir(building)
    os.rename(building, dest)


def _clear_leftover(building: Path) -> None:
    """Remove ``building`` if a crash left it (it holds the mark, or nothing);
    CannotSnapshot if something else is there."""
    if not os.path.lexists(building):
        return
    if not building.is_dir() or building.is_symlink() or not (incomplete(building) or not any(building.iterdir())):
        raise CannotSnapshot(f"{building} exists and is not a snapshot cut short (no {INCOMPLETE_NAME} in it; "
                             f"a crash just before a snapshot's final rename leaves a whole one there): remove it "
                             f"or give another destination")
    _discard(building)


def _discard(directory: Path) -> None:
    """Remove a copy that failed: mark it first if its mark is gone (it
    failed after the mark's removal), then everything but the mark, then the
    mark, then the directory, so that a crash meanwhile leaves it marked."""
    if not directory.is_dir():
        return
    if not incomplete(directory):
        with contextlib.suppress(OSError):
            _mark_incomplete(directory)
    for entry in directory.iterdir():
        if entry.name != INCOMPLETE_NAME:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        fsync_dir(directory)
    (directory / INCOMPLETE_NAME).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        directory.rmdir()
        fsync_dir(directory.parent)


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


def identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what is at ``path`` (a symlink itself), or None if nothing is."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    return found.st_dev, found.st_ino


def after_lost_answer(dest: Path, lost: Exception, *, local: bool, before: tuple[int, int] | None) -> dict[str, Any]:
    """What a ``snapshot`` request whose answer was lost (the server died, the
    connection broke) left, for ``shardmgr snapshot``. The snapshot is
    complete if and only if ``dest`` appeared on the server's machine (it is
    renamed into place only whole and synced; an existing ``dest`` is
    refused). ``local``: the server is on this machine, as far as the
    caller can tell (a loopback host: which an SSH tunnel or a container's
    port-forward makes another machine's). ``before``: :func:`identity` of
    ``dest`` just before the request. If ``local`` and a directory is at
    ``dest`` that was not there before (or was another) and ``verify``
    finds it clean, its rename is made durable (its parent synced: the one
    step a server killed right after the rename may have missed) and
    ``{dest, answer_lost, verified}`` returned. Otherwise CannotSnapshot,
    saying how to tell."""
    now = identity(dest)
    if local and now is not None and now != before and dest.is_dir():
        from shardmgr.verification.runner import verify

        report = verify(dest)
        if report.exit_code != 0:
            raise CannotSnapshot(f"{lost}: the server did not answer, and {dest} exists but 'shardmgr verify "
                                 f"{dest}' finds {len(report.problems)} problem(s) in it (exit {report.exit_code})")
        fsync_dir(dest.parent)
        return {"dest": str(dest), "answer_lost": str(lost), "verified": True}
    how = (f"It is complete if and only if {dest} appeared on the server's machine during the call (check with "
           f"'shardmgr verify {dest}' there); {dest.name}{SNAPSHOT_SUFFIX} beside it is an incomplete one (being "
           f"built while the server runs, else cut short: remove it and take the snapshot again)")
    if not local:
        raise CannotSnapshot(f"{lost}: the server did not answer, so the snapshot may not be complete. {how}")
    here = (f"{dest} was here before this call, so it is not this snapshot (a server on this machine refuses an "
            "existing destination)" if now is not None and now == before else
            f"{dest} is not here{'' if now is None else ' as a directory'}")
    raise CannotSnapshot(f"{lost}: the server did not answer, and {here}: if the server runs on this machine, the "
                         f"snapshot was not taken. But a loopback --host reaches another machine's server through an "
                         f"SSH tunnel or a container's port-forward. {how}")


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
