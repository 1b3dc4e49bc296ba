"""Checking the objects a cluster's entries name (cluster_checks.py calls it).

Each object is asked for with a HEAD: it must exist, with the size the
entry records and, in its ``crc32c`` metadata (written by
``ObjectStore.put_file``), the crc32c the entry records. With ``deep`` it is
also downloaded through ``ObjectStore.fetch`` (the cache fill's own path:
its bytes checksummed on arrival) into a temporary directory, removed
after. Every failure is CORRUPT: a published entry is write-once and the
objects it names are never deleted or replaced. An object without crc32c
metadata (not put by this service) is a NOTE without ``deep``: only reading
it can say.

The checks run on a few threads (boto3's clients are thread-safe; crc32c
releases the GIL); findings are added on the caller's thread, in the order
the entries were read.
"""

from __future__ import annotations

import dataclasses
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common.journal.check import Findings, Problem, Severity
from shardmgr.cluster.errors import ChecksumMismatch, ObjectMissing
from shardmgr.cluster.state.objects import ObjectStore

#: concurrent HEADs (each a round trip), and concurrent deep downloads (each already uses several connections)
HEAD_THREADS = 8
FETCH_THREADS = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Named:
    """An object as an entry names it: ``where`` is the entry's key (as reported)."""

    where: str
    name: str
    key: str
    size: int
    crc32c: int


def check_all(store: ObjectStore, named: list[Named], deep: bool, findings: Findings) -> None:
    """Check every object of ``named`` (an object named twice is read once);
    each one done is counted in ``findings`` (``on_file`` hears of it)."""
    with tempfile.TemporaryDirectory(prefix="shardmgr-verify-") as scratch:
        with ThreadPoolExecutor(max_workers=FETCH_THREADS if deep else HEAD_THREADS) as pool:
            for item, (problems, nbytes) in zip(named, pool.map(lambda n: check(store, n, deep, Path(scratch)),
                                                                named)):
                findings.problems += problems
                findings.done(Path(item.key), nbytes)


def check(store: ObjectStore, item: Named, deep: bool, scratch: Path) -> tuple[list[Problem], int]:
    """The problems of one object, and the bytes read to find them."""
    url = store.url(item.key)
    recorded = f"as {item.where} records ({item.name})"
    info = store.head(item.key)
    if info is None:
        return [Problem(url, None, Severity.CORRUPT, "missing_object", f"an object {recorded}", "no such object")], 0
    problems = []
    if info.size != item.size:
        problems.append(Problem(url, None, Severity.CORRUPT, "object_size", f"{item.size} bytes {recorded}",
                                f"{info.size} bytes"))
    if info.crc32c is not None and info.crc32c != item.crc32c:
        problems.append(Problem(url, None, Severity.CORRUPT, "object_checksum", f"crc32c {item.crc32c:08x} {recorded}",
                                f"its metadata says {info.crc32c:08x}"))
    if info.crc32c is None and not deep:
        problems.append(Problem(url, None, Severity.NOTE, "object_metadata", "crc32c metadata (put_file writes it)",
                                "none: only --deep reads the bytes to check them"))
    if problems or not deep:
        return problems, 0
    return _fetched(store, item, url, recorded, scratch), item.size


def _fetched(store: ObjectStore, item: Named, url: str, recorded: str, scratch: Path) -> list[Problem]:
    """Download and checksum one object (deep); its problems."""
    dest = scratch / uuid.uuid4().hex
    try:
        store.fetch(item.key, dest, size=item.size, crc=item.crc32c)
    except ObjectMissing:  # deleted between the HEAD and the GET
        return [Problem(url, None, Severity.CORRUPT, "missing_object", f"an object {recorded}", "no such object")]
    except ChecksumMismatch as exc:
        return [Problem(url, None, Severity.CORRUPT, "object_checksum",
                        f"{item.size} bytes with crc32c {item.crc32c:08x} {recorded}", f"{exc}")]
    finally:
        dest.unlink(missing_ok=True)
    return []
