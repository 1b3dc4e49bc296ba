"""Checking a work queue's files offline: workq's part of ``shardmgr verify``.

Read-only; safe beside a live broker. On top of the journal checks
(common/journal/check.py) it checks what the queue's own rules say about its files:

* names: ``segments/<id:010d>.wqsg`` and ``results/<job id hex>/<seq:08d>.wqcl``,
  and that each file's metadata names the same segment, job and sequence;
* segments the collector should have removed (sealed, every item retired,
  not the newest): REPAIRABLE, the broker deletes them;
* with ``deep``: every completion-log ledger entry decodes; segments a
  ledger says are collected but are still there (REPAIRABLE: recovery
  deletes them); input items of jobs that have no completion log
  (REPAIRABLE: recovery starts one);
"""

from __future__ import annotations

from pathlib import Path

import msgpack
import numpy as np

from common.journal import Marker
from common.journal.check import Findings, JournalCheck, Severity
from common.journal.errors import CorruptJournal
from workq.disk import catalog
from workq.disk.completion_log import SUFFIX as RESULTS_SUFFIX
from workq.disk.completion_log import Ledger
from workq.disk.records import (
    HANDLE_AT,
    HEAD_BYTES,
    JOB_AT,
    LEDGER,
    RESULTS_DIR,
    RESULTS_KIND,
    SEGMENT_KIND,
    SEGMENTS_DIR,
    job_dir,
)
from workq.disk.segment import SUFFIX as SEGMENT_SUFFIX
from workq.disk.segment import Segment


def check(root: Path, findings: Findings, deep: bool) -> None:
    """Check ``DATA/workq`` (``root``)."""
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(f"{catalog.FILE}.damaged-"):
            findings.add(entry, Severity.NOTE, "damaged_catalog", "no damaged catalog",
                         "a catalog the broker found damaged, moved aside and rebuilt: a queue file lost before "
                         "then would go unnoticed (kept for forensics; delete it once seen)")
        elif entry.name not in (SEGMENTS_DIR, RESULTS_DIR, catalog.FILE) \
                or entry.is_dir() != (entry.name != catalog.FILE):
            findings.unknown(entry, f"segments/, results/ and {catalog.FILE}")
    recorded = _catalog(root, findings)  # before listing: a LIVE record's file existed when it was read
    jobs_in_segments = _segments(root / SEGMENTS_DIR, findings, deep)
    jobs_with_logs = _results(root / RESULTS_DIR, findings, deep)
    for job in sorted(jobs_in_segments - jobs_with_logs):
        findings.add(root / RESULTS_DIR / job_dir(job), Severity.REPAIRABLE, "missing_log",
                     "a completion log for every job with items", "none; recovery starts an empty one")
    if recorded is not None:
        _compare(root, recorded, findings)


def _catalog(root: Path, findings: Findings) -> dict[catalog.Entry, Marker] | None:
    """The catalog's entries (None if it is missing or unusable: reported)."""
    path = root / catalog.FILE
    if not path.exists():
        if any(root.glob("segments/*.wqsg")) or any(root.glob("results/*/*.wqcl")):
            findings.add(path, Severity.REPAIRABLE, "missing", "the catalog of the queue's files",
                         "no such file: recovery rebuilds it from the files present (a queue file lost "
                         "with it would go unnoticed)")
        return None
    check = findings.journal(path, catalog.KIND, deep=True)  # small: always walked and checksummed
    try:
        if check.journal is None or any(p.severity == Severity.CORRUPT for p in check.problems):
            return None  # a damaged record may name a file that never existed: compare nothing
        entries = catalog.read(check.journal)
    finally:
        check.close()
    bad = [e for e in entries if e.kind not in (catalog.SEGMENT, catalog.RESULTS)]
    if bad:
        findings.add(path, Severity.CORRUPT, "catalog_record", "records of kind 1 (segment) or 2 (results)",
                     f"{len(bad)} records of kinds {sorted({e.kind for e in bad})}", entries[bad[0]][0])
        return None
    return {e: marker for e, (_, marker) in entries.items()}


def _compare(root: Path, recorded: dict[catalog.Entry, Marker], findings: Findings) -> None:
    """The files present against the catalog."""
    present = {e for e in map(lambda p: catalog.Entry.of(root, p),
                              [*root.glob("segments/*.wqsg"), *root.glob("results/*/*.wqcl")]) if e is not None}
    absent = [e for e, marker in recorded.items() if marker == Marker.LIVE and e not in present]
    if absent:  # read again: a live collector may have retired and deleted one since the first read
        again = _catalog(root, Findings()) or {}
        absent = [e for e in absent if again.get(e) == Marker.LIVE and not e.path(root).exists()]
    for entry in sorted(absent):
        findings.add(entry.path(root), Severity.CORRUPT, "missing", "the file the catalog records",
                     f"no such file: its {'items' if entry.kind == catalog.SEGMENT else 'results'} are lost")
    for entry in sorted(e for e, marker in recorded.items() if marker == Marker.BURIED and e not in present):
        findings.add(entry.path(root), Severity.NOTE, "lost", "the file the catalog records",
                     "lost or quarantined, acknowledged by verify --repair")
    for entry in sorted(present):
        marker = recorded.get(entry)
        if marker == Marker.RETIRED:
            findings.add(entry.path(root), Severity.REPAIRABLE, "collected", "no file the catalog says is collected",
                         "still here (a crash before the unlink); recovery deletes it")
        elif marker != Marker.LIVE:
            findings.add(entry.path(root), Severity.REPAIRABLE, "uncatalogued", "a catalog record for every file",
                         "none (created just before a crash); recovery records it")


def _segments(directory: Path, findings: Findings, deep: bool) -> set[int]:
    jobs: set[int] = set()
    if not directory.is_dir():
        return jobs
    paths = sorted(directory.iterdir())
    named = [p for p in paths if p.suffix == SEGMENT_SUFFIX and p.stem.isdigit() and p.is_file()]
    for path in paths:
        if path not in named:
            findings.unknown(path, f"<id>{SEGMENT_SUFFIX} files")
    newest = max((int(p.stem) for p in named), default=0)
    for path in named:
        with findings.guard(path):
            check = findings.journal(path, SEGMENT_KIND, deep)
            try:
                if check.journal is not None:
                    jobs |= _segment(path, check, findings, deep, newest)
            finally:
                check.close()
    return jobs


def _segment(path: Path, check: JournalCheck, findings: Findings, deep: bool, newest: int) -> set[int]:
    journal = check.journal
    assert journal is not None
    try:
        segment_id, _ = Segment.describe(journal)
    except (ValueError, KeyError, TypeError) as exc:
        findings.add(path, Severity.CORRUPT, "metadata", "{segment, model, shape, lane}", f"{exc}", 64)
        return set()
    if segment_id != int(path.stem):
        findings.add(path, Severity.CORRUPT, "name", f"segment {int(path.stem)} (the file name)",
                     f"metadata of segment {segment_id} (a renamed or swapped file)", 64)
    if (journal.sealed and journal.count and journal.count_of(Marker.RETIRED) == journal.count
            and segment_id != newest):
        findings.add(path, Severity.REPAIRABLE, "collectable", "no finished segment left behind",
                     "every item retired; the broker's collector deletes it")
    if not deep or any(p.severity == Severity.CORRUPT for p in check.problems):
        return set()  # (a damaged record's job id may be a phantom)
    return {int(job) for chunk in journal.scan(window=16 << 20)
            for job in np.unique(journal.fields(chunk, JOB_AT, "<u8")).tolist()}


def _results(directory: Path, findings: Findings, deep: bool) -> set[int]:
    jobs: set[int] = set()
    if not directory.is_dir():
        return jobs
    for log_dir in sorted(directory.iterdir()):
        if not (log_dir.is_dir() and len(log_dir.name) == 16 and _is_hex(log_dir.name)):
            findings.unknown(log_dir, "<job id as 16 hex digits>/ directories")
            continue
        jobs.add(int(log_dir.name, 16))
        with findings.guard(log_dir):
            _job_log(log_dir, findings, deep)
    return jobs


def _job_log(log_dir: Path, findings: Findings, deep: bool) -> None:
    paths = sorted(log_dir.iterdir())
    named = [p for p in paths if p.suffix == RESULTS_SUFFIX and p.stem.isdigit() and p.is_file()]
    for path in paths:
        if path not in named:
            findings.unknown(path, f"<seq>{RESULTS_SUFFIX} files")
    collected_below = 0
    for path in named:
        check = findings.journal(path, RESULTS_KIND, deep)
        try:
            if check.journal is not None:
                collected_below = max(collected_below, _result_segment(path, check, findings, deep))
        finally:
            check.close()
    for path in named:
        if int(path.stem) < collected_below:
            findings.add(path, Severity.REPAIRABLE, "collected", "no segment a ledger says is collected",
                         f"still here (ledger: segments below {collected_below} are collected); recovery deletes it")


def _result_segment(path: Path, check: JournalCheck, findings: Findings, deep: bool) -> int:
    """Check names and, with ``deep``, the ledger entries; returns the newest ledger's collected_below."""
    journal = check.journal
    assert journal is not None
    try:
        meta = msgpack.unpackb(journal.metadata)
        job_id, seq, name = int(meta["job_id"]), int(meta["seq"]), meta["job"]
        if not isinstance(name, str):
            raise TypeError(f"job name {name!r}")
    except (ValueError, KeyError, TypeError) as exc:
        findings.add(path, Severity.CORRUPT, "metadata", "{job, job_id, seq}", f"{exc}", 64)
        return 0
    if (job_dir(job_id), seq) != (path.parent.name, int(path.stem)):
        findings.add(path, Severity.CORRUPT, "name", f"job {path.parent.name}, seq {int(path.stem)} (the path)",
                     f"metadata of job {job_dir(job_id)}, seq {seq} (a renamed or swapped file)", 64)
    if not deep:
        return 0
    collected_below = 0
    for chunk in journal.scan(window=16 << 20):
        ledgers = np.flatnonzero(journal.fields(chunk, HANDLE_AT, "<u8") == LEDGER)
        if not len(ledgers):
            continue
        for i in ledgers.tolist():
            offset = int(chunk.offsets[i])
            try:
                [body] = journal.bodies(chunk[i:i + 1], skip=HEAD_BYTES)
                collected_below = max(collected_below, Ledger(**msgpack.unpackb(body)).collected_below)
            except CorruptJournal:
                continue  # reported by the journal check
            except (ValueError, TypeError) as exc:
                findings.add(path, Severity.CORRUPT, "ledger", "a ledger entry {collected_below, results, "
                             "max_position}", f"{exc}", offset)
    return collected_below


def _is_hex(text: str) -> bool:
    try:
        int(text, 16)
    except ValueError:
        return False
    return True
