"""``shardmgr verify``: an offline integrity check of a whole data directory.

Read-only and lock-free unless ``repair`` is asked for, so it is safe beside
a live server (files being written may show REPAIRABLE findings that are
only writes in flight; sealed files give consistent results). It walks
``DATA/workq`` (queue_checks.py) and ``DATA/shards`` (shard_checks.py) on
top of the journal checks (common/journal/check.py); everything else in the
directory but ``LOCK``, ``quarantine/`` and a cluster node's cache of
fetched shards (``cluster-cache/``, checked as a store) is reported as unknown.

The default run checks structure, headers, sealed checkpoints, sizes and
tails: O(1) per sealed file. ``deep`` also walks every record and verifies
every checksum (records, row batches, index files).

Exit status (:attr:`Report.exit_code`): 0 clean (notes only), 1 only
problems recovery repairs by itself, 2 data corruption, 3 could not run.
With ``repair`` (offline: it takes the directory's lock), corrupt shards,
collections and queue files are moved to quarantine (never deleted), then
the queue's and the store's own recovery runs, then the directory is
checked again; the report is that second check, with the actions taken.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from common.journal.check import Findings, Severity
from common.journal.errors import CannotCheck
from common.journal.lockfile import INCOMPLETE_NAME, SNAPSHOT_SUFFIX
from shardmgr.errors import CannotVerify

from . import queue_checks as queue_check
from . import shard_checks as store_check
from .report import Report

if TYPE_CHECKING:
    from shardmgr.cluster.config import EtcdSecurity

QUARANTINE = "quarantine"  # DATA/quarantine: what --repair moved aside (shards go to their collection's)

CLUSTER_CACHE = "cluster-cache"
"""A cluster node's cache store (shardmgr/cluster/published/cache.py's CACHE_DIR, not
imported from there: the cluster extra is optional; a test checks they agree)."""


def verify(data_dir: str | Path, *, deep: bool = False, repair: bool = False,
           on_file: Callable[[Path, int], None] | None = None) -> Report:
    """Check ``data_dir`` (see the module docstring); CannotVerify if it
    cannot run. ``on_file(path, bytes)`` hears of each file checked."""
    root = Path(data_dir)
    if not root.is_dir():
        raise CannotVerify(f"{root} is not a directory")
    if not repair:
        return scan(root, deep, on_file)
    if _empty_leftover(root):
        raise CannotVerify(f"--repair cannot complete a snapshot: {root} is {EMPTY_LEFTOVER}")
    from .repair import Repair  # repair opens the queue and the store: only when asked

    with Repair(root) as fixer:
        before = scan(root, deep, on_file)
        actions = fixer.run(before.problems)
        try:
            after = scan(root, deep, None)
        except CannotVerify as exc:  # say what was done before saying the check could not finish
            raise CannotVerify(f"repaired ({'; '.join(actions) or 'nothing'}), then the second check could "
                               f"not run: {exc}") from exc
    after.repaired = actions
    return after


def verify_cluster(cluster: str, object_store: str | None, s3_endpoint: str | None = None, *, deep: bool = False,
                   orphan_grace_s: float | None = None, on_object: Callable[[Path, int], None] | None = None,
                   on_total: Callable[[int], None] | None = None,
                   etcd_security: EtcdSecurity | None = None) -> Report:
    """``verify --cluster``: the cluster's shard map against its bucket
    (cluster_checks.py; ``orphan_grace_s``: the age from which an orphan is
    repairable, None for its default; ``etcd_security``: an EtcdSecurity, how
    etcd is reached). CannotVerify if the URLs or the etcd settings are
    malformed, the cluster extra is not installed, or etcd or the bucket cannot be read."""
    if not object_store:
        raise CannotVerify("--cluster needs --object-store s3://BUCKET/PREFIX (where the shards' objects are)")
    try:  # the cluster extra (boto3, etcd3gw) is optional: imported only here
        from shardmgr.cluster.config import ClusterConfig
        from shardmgr.cluster.errors import BadClusterConfig

        from .cluster_checks import ORPHAN_GRACE_S
        from .cluster_checks import verify_cluster as check
    except ImportError as exc:
        raise CannotVerify(f"--cluster needs the cluster extra (pip install 'shardmgr[cluster]'): {exc}") from exc
    try:
        config = ClusterConfig.from_urls(cluster, object_store, s3_endpoint=s3_endpoint,
                                         **({} if etcd_security is None else {"etcd_security": etcd_security}))
    except BadClusterConfig as exc:
        raise CannotVerify(str(exc)) from exc
    return check(config, deep=deep, orphan_grace_s=ORPHAN_GRACE_S if orphan_grace_s is None else orphan_grace_s,
                 on_object=on_object, on_total=on_total)


def scan(root: Path, deep: bool, on_file: Callable[[Path, int], None] | None = None) -> Report:
    """One read-only pass over the directory."""
    started = time.perf_counter()
    findings = Findings(on_file=on_file)
    try:
        if _empty_leftover(root):
            findings.add(root, Severity.CORRUPT, "incomplete_snapshot", "a data directory",
                         f"{EMPTY_LEFTOVER}; remove it and take the snapshot again")
        for entry in sorted(root.iterdir()):
            if entry.name == "LOCK" and entry.is_file():
                continue
            if entry.name == INCOMPLETE_NAME:
                findings.add(entry, Severity.CORRUPT, "incomplete_snapshot", "a data directory",
                             "a snapshot not complete (being built, or cut short by a crash): files may be missing; "
                             "--repair cannot restore them, remove it and take the snapshot again")
                continue
            if entry.name == "workq" and entry.is_dir():
                queue_check.check(entry, findings, deep)
            elif entry.name == "shards" and entry.is_dir():
                store_check.check(entry, findings, deep)
            elif entry.name == CLUSTER_CACHE and entry.is_dir():  # a store of its own: check its shards too
                for part in sorted(entry.iterdir()):
                    if part.name == "shards" and part.is_dir():
                        store_check.check(part, findings, deep)
                    elif part.name not in ("LOCK", "sources"):  # sources: where its shards came from (JSON)
                        findings.unknown(part, "LOCK, shards/, sources/")
            elif entry.name == QUARANTINE and entry.is_dir():
                for moved in sorted(entry.rglob("*")):
                    if moved.parent.parent == entry:  # quarantine/<workq|shards>/<item>
                        findings.add(moved, Severity.NOTE, "quarantined", "nothing in quarantine",
                                     "moved aside by verify --repair")
            else:
                findings.unknown(entry, f"LOCK, workq/, shards/, quarantine/, {CLUSTER_CACHE}/")
    except PermissionError as exc:
        raise CannotVerify(f"cannot read {exc.filename}: {exc.strerror}") from exc
    except CannotCheck as exc:
        raise CannotVerify(f"stopped, nothing concluded: {exc}") from exc
    except OSError as exc:  # listing a directory failed: the run cannot cover it
        raise CannotVerify(f"cannot read {exc.filename or root}: {exc.strerror or exc}") from exc
    return Report(str(root), deep, findings.problems, findings.files, findings.bytes_read,
                  time.perf_counter() - started)


EMPTY_LEFTOVER = (f"an empty directory named like a snapshot being built (*{SNAPSHOT_SUFFIX}): a snapshot cut short "
                  f"right after creating it, before its {INCOMPLETE_NAME} mark; nothing was copied into it")


def _empty_leftover(root: Path) -> bool:
    """True for an empty ``*.tmp`` directory: what a snapshot killed between its mkdir and its mark leaves
    (shardmgr/snapshots.py: such a directory counts as a snapshot cut short)."""
    return root.name.endswith(SNAPSHOT_SUFFIX) and not any(root.iterdir())


def count_files(root: Path) -> int:
    """About how many files a run will check (for a progress bar): all but
    LOCK and what is in quarantine."""
    total = 0
    for _, directories, files in os.walk(root):
        directories[:] = [d for d in directories if d != QUARANTINE]
        total += sum(name != "LOCK" for name in files)
    return total
