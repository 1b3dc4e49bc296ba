"""Checking a rewritten shard's lineage offline (shard_checks.py calls it).

A shard a rewrite produced (shardmgr/store/lineage.py) has a ``refs`` row
file: its header (column REFS, int64, the shard's uuid), its size against
the shard's rows, and its rows against the crc32c in the journal's metadata,
strictly ascending, each naming a row of a source shard. Any failure is
CORRUPT: the refs are how old refs find their rows. A shard the rewrite
replaced that is still there (a crash came between the commit and its
removal) is a NOTE: the next start removes it.

Across a collection's shards (``overlaps``): two live shards claiming rows
of one original shard (lineage.py) are CORRUPT on each
(``overlapping_sources``): a ref of those rows is ambiguous. ``--repair``
leaves them (repair.py): nothing on disk says which claimant holds the
right rows and deletes, and quarantining the wrong one could bring deleted
rows back or hide live ones; the operator moves the wrong one out.
"""

from __future__ import annotations

from pathlib import Path

import msgpack

from common.journal.check import Findings, Severity
from common.journal.errors import FormatError
from shardmgr.store import layout, lineage
from shardmgr.store.rows import REFS, RowFile


def check(directory: Path, raw_meta: bytes, known: tuple[int, bytes] | None, findings: Findings) -> None:
    """Check ``directory``'s refs file if its journal metadata (``raw_meta``)
    says it was rewritten; ``known``: the shard's (rows, uuid), if known."""
    path = directory / layout.REFS
    try:
        found = lineage.Lineage.decode(msgpack.unpackb(raw_meta), directory / "journal")
    except (FormatError, ValueError, msgpack.UnpackException) as exc:
        findings.add(directory / "journal", Severity.CORRUPT, "lineage", "{sources, inputs, refs_crc}", str(exc), 64)
        return
    if found is None:
        if path.exists():
            findings.unknown(path, "a refs file in rewritten shards only")
        return
    for replaced in (directory.parent / f"{i:08d}" for i in found.inputs):
        if replaced.exists():
            findings.add(replaced, Severity.NOTE, "superseded", "no shard a rewrite replaced",
                         f"replaced by shard {directory.name}; removed at the next start")
    if not path.exists():
        findings.add(path, Severity.CORRUPT, "missing", "the refs of a rewritten shard", "no such file")
        return
    if known is not None:
        _refs(path, known, found, findings)


def _refs(path: Path, known: tuple[int, bytes], found: lineage.Lineage, findings: Findings) -> None:
    rows, uid = known
    try:
        refs = RowFile.open(path, writable=False)
    except (FormatError, OSError) as exc:
        findings.add(path, Severity.CORRUPT, "refs", "a refs row file", str(exc))
        return
    try:
        header = refs.header
        if (header.column, header.dtype, header.width) != (REFS, "<i8", 1) or header.uuid != uid:
            findings.add(path, Severity.CORRUPT, "foreign_file", "the refs file of this shard", str(header), 0)
        elif refs.rows_fitting() < rows:
            findings.add(path, Severity.CORRUPT, "rows_missing", f"{rows} refs", f"{refs.rows_fitting()}")
        else:
            lineage.check_refs(refs.rows(rows), found, path)
            findings.done(path, rows * 8)
    except FormatError as exc:
        findings.add(path, Severity.CORRUPT, "refs", "ascending refs of source rows, matching their crc32c",
                     exc.detail)
    finally:
        refs.close()


OVERLAP = "overlapping_sources"


def overlaps(directory: Path, metas: dict[int, bytes], findings: Findings) -> None:
    """Report each live shard of the collection ``directory`` that claims
    rows of an original shard another live shard claims too (lineage.overlaps);
    ``metas``: shard id -> its journal's metadata (undecodable ones are
    reported by :func:`check` and left out here)."""
    lineages: dict[int, lineage.Lineage | None] = {}
    for shard_id, raw in metas.items():
        try:
            lineages[shard_id] = lineage.Lineage.decode(msgpack.unpackb(raw), directory / f"{shard_id:08d}")
        except (FormatError, ValueError, msgpack.UnpackException):
            continue
    for shard_id, (sources, others) in lineage.overlaps(lineages).items():
        findings.add(directory / f"{shard_id:08d}" / "journal", Severity.CORRUPT, OVERLAP,
                     f"the only live shard holding rows of shard(s) {_ids(sources)}",
                     f"shard(s) {_ids(others)} hold rows of them too: their refs are ambiguous (a ref finds the "
                     f"newest holder; search returns such a row once per holder). --repair cannot tell which "
                     f"holds the right rows and deletes and leaves all of them: move the wrong one(s) out "
                     f"(e.g. a shard restored from an older copy)", 64)


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids)
