"""Checking a shard's delete log offline (shard_checks.py calls it).

The ``deletes`` journal (shardmgr/store/deletes.py): the journal itself
(common/journal/check.py), its metadata against the shard (id and uuid),
and every record's body: whole int64 rows, ascending, unique, non-negative.
Rows past the shard's rows are a NOTE (a crash kept the delete and lost the
batch that held them; the store ignores them). A damaged delete log is
CORRUPT: the store quarantines the shard rather than serve deleted rows
again. The records are always walked (delete logs are small).
"""

from __future__ import annotations

from pathlib import Path

import msgpack

from common.journal.check import Findings, Severity
from common.journal.errors import CorruptJournal, FormatError
from shardmgr.store import deletes, layout


def check(directory: Path, shard_id: int, known: tuple[int, bytes] | None, findings: Findings) -> None:
    """Check ``directory``'s delete log, if it has one; ``known`` is the
    shard's (rows, uuid) when its journal could say."""
    path = directory / layout.DELETES
    if not path.exists():
        return
    journal_check = findings.journal(path, deletes.KIND, deep=True)
    try:
        journal = journal_check.journal
        if journal is None or not _meta_matches(path, journal.metadata, shard_id, known, findings):
            return
        past = 0
        for record in journal.records():
            rows = deletes.rows_of(record.body, path, record.offset)
            if known is not None:
                past += int((rows >= known[0]).sum())
        if past:
            findings.add(path, Severity.NOTE, "deletes_past_rows", f"rows below the shard's {known and known[0]}",
                         f"{past} deleted rows past them (lost with their batch in a crash; ignored)")
    except (FormatError, CorruptJournal) as exc:
        findings.add(path, Severity.CORRUPT, "delete_record", "ascending, unique int64 rows per record",
                     getattr(exc, "detail", str(exc)), getattr(exc, "offset", None))
    finally:
        journal_check.close()


def _meta_matches(path: Path, raw: bytes, shard_id: int, known: tuple[int, bytes] | None,
                  findings: Findings) -> bool:
    try:
        meta = msgpack.unpackb(raw)
        if meta["shard"] != shard_id or (known is not None and bytes(meta["uuid"]) != known[1]):
            raise ValueError(f"the delete log of shard {meta['shard']} ({bytes(meta['uuid']).hex()})")
        return True
    except (ValueError, KeyError, TypeError) as exc:
        findings.add(path, Severity.CORRUPT, "metadata", f"the delete log of shard {shard_id} (its uuid)",
                     str(exc), 64)
        return False
