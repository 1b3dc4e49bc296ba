"""Checking the vector store's files offline: its part of ``shardmgr verify``.

Read-only; safe beside a live server. Per collection: the ``collection``
metadata journal; per shard: the batch journal (common/journal/check.py), the shard's
metadata, both row files' headers (checksum, column, dtype, width, and the
shard's uuid, so a file swapped in from another shard is caught), their
sizes against the rows the journal holds, and, with ``deep``, every batch's
crc32c of its vector bytes and its ids (the ids in a version 2 record, or the
crc32c of the id bytes in version 1); the HNSW index files against the
shard's row count, their recorded size and checksum; the delete log
(delete_checks.py). Leftover ``<id>.tmp``
directories (a creation a crash cut short) are REPAIRABLE; quarantined
shards and unknown files are NOTEs.

Severity of row damage follows durability: rows of a batch a flush confirmed
(or of a sealed shard) are CORRUPT when wrong or missing; rows of a batch
past the last checkpoint are REPAIRABLE (recovery drops that batch: it was
never confirmed). A version 2 shard's ids file is derived from its journal
(batch_record.py): ids missing or different there are REPAIRABLE (a
growing shard's replay, the open of a sealed one whose file is short, and
``--repair`` rewrite them from the records).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import crc32c
import msgpack
import numpy as np

from common.journal.check import Findings, JournalCheck, Severity, read_regular
from common.journal.errors import CorruptJournal, FormatError
from shardmgr.store import close_marker, index, layout
from shardmgr.store.batch_record import ID, JOURNAL_KIND, V1, Batch, last_batch, unpack, version_of
from shardmgr.store.collection import META_KIND
from shardmgr.store.quarantine import quarantine_reason
from shardmgr.store.rows import HEADER_SIZE, HEADER_USED, IDS, VECTORS, RowHeader

from . import delete_checks, lineage_checks
from .row_checksums import batch_crcs

SHARD_FILES = ("journal", "vectors", "ids")
OPTIONAL_FILES = (layout.INDEX, layout.INDEX_META, layout.DELETES, layout.CLOSED, layout.REFS)


def check(root: Path, findings: Findings, deep: bool) -> None:
    """Check ``DATA/shards`` (``root``)."""
    for entry in sorted(root.iterdir()):
        if not entry.is_dir():
            findings.unknown(entry, "one directory per collection")
            continue
        names = [p.name for p in entry.iterdir()]
        # checked again after the listing: a live create_collection renames collection.tmp into place meanwhile
        if "collection" in names or (entry / "collection").exists():
            with findings.guard(entry):
                _collection(entry, findings, deep)
        elif any(name != "collection.tmp" for name in names):
            findings.add(entry / "collection", Severity.CORRUPT, "missing", "the collection's metadata file",
                         "none: the collection's shards are not served")
        else:  # the store ignores it; create_collection finishes it
            findings.add(entry, Severity.NOTE, "unfinished_collection", "a collection metadata file",
                         "none yet: a creation in progress or cut short (no data)")


def _collection(directory: Path, findings: Findings, deep: bool) -> None:
    dim = _collection_meta(directory, findings)
    metas: dict[int, bytes] = {}  # shard id -> its journal's metadata, for the check across shards
    for entry in sorted(directory.iterdir()):
        if entry.name == "collection":
            continue
        if entry.name == "quarantine" and entry.is_dir():
            for moved in sorted(entry.iterdir()):
                findings.add(moved, Severity.NOTE, "quarantined", "no quarantined shard",
                             f"quarantined: {quarantine_reason(moved)}")
        elif entry.is_dir() and entry.name.endswith(layout.TMP_SUFFIX) \
                and entry.name[:-len(layout.TMP_SUFFIX)].isdigit():
            findings.add(entry, Severity.REPAIRABLE, "unfinished_shard", "no half-created shard",
                         "a creation a crash cut short (no data); removed at the next start")
        elif entry.is_dir() and entry.name.isdigit():
            with findings.guard(entry):  # checked even if the collection's metadata is not (dim None)
                raw_meta = _shard(entry, int(entry.name), dim, findings, deep)
                if raw_meta is not None:
                    metas[int(entry.name)] = raw_meta
        else:
            findings.unknown(entry, "collection, <id>/ shard directories, quarantine/")
    lineage_checks.overlaps(directory, metas, findings)


def _collection_meta(directory: Path, findings: Findings) -> int | None:
    """The collection's dimension, or None if its metadata is unusable."""
    path = directory / "collection"
    check = findings.journal(path, META_KIND, deep=True)  # a header-only journal: the deep walk is free
    try:
        if check.journal is None:
            return None
        meta = msgpack.unpackb(check.journal.metadata)
        dim, metric, kind = meta["dim"], meta["metric"], meta["index"]
        if meta["name"] != directory.name or not isinstance(dim, int) or metric not in ("l2", "ip"):
            raise ValueError(f"{ {k: meta.get(k) for k in ('name', 'dim', 'metric', 'index')} }")
        index.check_spec(kind, dim, metric)  # BadVectors, a ValueError, names what faiss refused
        return dim
    except (ValueError, KeyError, TypeError) as exc:
        findings.add(path, Severity.CORRUPT, "metadata", f"{{name: {directory.name!r}, dim, metric, index}}",
                     str(exc), 64)
        return None
    finally:
        check.close()


def _shard(directory: Path, shard_id: int, dim: int | None, findings: Findings, deep: bool) -> bytes | None:
    """Check one shard; returns its journal's metadata (None if unreadable)."""
    names = {p.name for p in directory.iterdir()}
    for name in sorted(names - set(SHARD_FILES) - set(OPTIONAL_FILES)):
        findings.unknown(directory / name, "journal, vectors, ids and optionally index.faiss, index.meta, deletes, "
                                           "closed, refs")
    for name in SHARD_FILES:
        if name not in names:
            findings.add(directory / name, Severity.CORRUPT, "missing", "journal, vectors and ids in every shard",
                         "no such file: the shard is not served")
    # each file on its own first, so that damage to one is reported whatever the state of the others
    headers: dict[str, RowHeader | None] = {c: _row_header(directory / c, findings) for c in ("vectors", "ids")
                                             if c in names}
    known, raw_meta = None, None
    if "journal" in names:
        check = findings.journal(directory / "journal", JOURNAL_KIND, deep)
        try:
            if check.journal is not None:
                known = _rows(directory, shard_id, dim, check, headers, findings, deep)
                raw_meta = check.journal.metadata
        finally:
            check.close()
    if raw_meta is not None:
        lineage_checks.check(directory, raw_meta, known, findings)
    _index(directory, known, findings, deep)
    delete_checks.check(directory, shard_id, known, findings)
    if layout.CLOSED in names:  # at worst unusable: the shard is then sealed at its next open, losing nothing
        findings.journal(directory / layout.CLOSED, close_marker.KIND, deep=True, cap=Severity.NOTE).close()
    return raw_meta


Found = tuple[Batch, int]
"""A batch record and its offset in the journal."""


def _rows(directory: Path, shard_id: int, dim: int | None, check: JournalCheck, headers: dict[str, RowHeader | None],
          findings: Findings, deep: bool) -> tuple[int, bytes] | None:
    """Check the row files against the journal; returns the shard's row
    count and uuid (None if the journal cannot say)."""
    assert check.journal is not None
    meta = _shard_meta(directory, shard_id, dim, check, findings)
    if meta is None:
        return None
    uid, dim, version = meta
    batches = _batches(check, version, deep, findings)
    if batches is None:
        return None
    rows = batches[-1][0].end if batches else 0
    if len(headers) < 2 or not _headers_match(directory, headers, uid, dim, findings):
        return rows, uid
    sealed = check.journal.sealed
    durable_rows = rows if sealed else _rows_below(check, batches)
    for column, header in headers.items():
        assert header is not None
        derived = column == "ids" and version != V1  # the journal holds its ids: none is missing for good
        _row_sizes(directory / column, header, rows, 0 if derived else durable_rows, derived, sealed, findings)
        if deep and not sealed:
            _zero_tail(directory / column, HEADER_SIZE + rows * header.row_bytes, findings)
    if deep:
        _batch_chain(directory, batches, findings)
        _vector_checksums(directory, headers, batches, check, sealed, findings)
        _ids(directory, headers, batches, check, sealed, findings)
    return rows, uid


def _shard_meta(directory: Path, shard_id: int, dim: int | None, check: JournalCheck,
                findings: Findings) -> tuple[bytes, int, int] | None:
    """The shard's uuid, dimension and batch record version, from its
    journal's metadata (checked against its path and, when known, the
    collection's dimension)."""
    assert check.journal is not None
    try:
        meta = msgpack.unpackb(check.journal.metadata)
        if meta["shard"] != shard_id or dim not in (None, meta["dim"]) or meta["collection"] != directory.parent.name:
            raise ValueError(f"shard {meta['shard']} of dim {meta['dim']} in {meta['collection']!r}")
        return bytes(meta["uuid"]), int(meta["dim"]), version_of(meta, check.journal.path)
    except (ValueError, KeyError, TypeError) as exc:  # FormatError (a version not known) is a ValueError
        findings.add(directory / "journal", Severity.CORRUPT, "metadata",
                     f"shard {shard_id} of dim {dim} in {directory.parent.name!r}", str(exc), 64)
        return None


def _batches(check: JournalCheck, version: int, deep: bool, findings: Findings) -> list[Found] | None:
    """Each batch record and its offset; only the last one of a sealed
    journal unless ``deep`` (O(1)). None if a batch record is damaged
    (reported: by the journal's deep check, or here)."""
    journal = check.journal
    assert journal is not None
    try:
        if journal.sealed and not deep:
            last = last_batch(journal, version)
            return [] if last is None else [(last, journal.end)]
        return [(unpack(r.body, version, journal.path, r.offset), r.offset) for r in journal.records()]
    except CorruptJournal as exc:
        if not deep:
            findings.add(journal.path, Severity.CORRUPT, "checksum", "the last batch record's crc32c", exc.detail,
                         exc.offset)
        return None
    except FormatError as exc:
        findings.add(journal.path, Severity.CORRUPT, "batch_record", f"version {version} batch records", exc.detail,
                     exc.offset)
        return None


def _rows_below(check: JournalCheck, batches: list[Found]) -> int:
    """Rows of the batches the newest checkpoint declared durable."""
    durable = [batch for batch, offset in batches if offset < check.durable_end]
    return durable[-1].end if durable else 0


def _row_header(path: Path, findings: Findings) -> RowHeader | None:
    try:
        raw = read_regular(path, HEADER_SIZE)
        header = RowHeader.decode(raw, path)
    except FormatError as exc:
        findings.add(path, Severity.CORRUPT, "row_header", "a valid row file header", exc.detail, exc.offset)
        return None
    nonzero = np.flatnonzero(np.frombuffer(raw, dtype=np.uint8)[HEADER_USED:])
    if len(nonzero):
        first = HEADER_USED + int(nonzero[0])
        findings.add(path, Severity.REPAIRABLE, "header_padding", f"zero bytes from {HEADER_USED} to {HEADER_SIZE}",
                     f"{len(nonzero)} non-zero bytes (outside the checksum: no data is affected)", first,
                     HEADER_SIZE - first)
    return header


def _headers_match(directory: Path, headers: dict[str, RowHeader | None], uid: bytes, dim: int,
                   findings: Findings) -> bool:
    ok = True
    for column, want in (("vectors", (VECTORS, "<f4", dim)), ("ids", (IDS, "<i8", 1))):
        header = headers[column]
        if header is None:
            ok = False
        elif (header.column, header.dtype, header.width) != want or header.uuid != uid:
            findings.add(directory / column, Severity.CORRUPT, "foreign_file",
                         f"the {column} of this shard ({want[0]!r}, {want[1]}, width {want[2]}, its uuid)",
                         f"{header.column!r}, {header.dtype}, width {header.width}, uuid "
                         f"{'matching' if header.uuid == uid else 'of another shard'}", 12)
            ok = False
    return ok


def _row_sizes(path: Path, header: RowHeader, rows: int, durable_rows: int, derived: bool, sealed: bool,
               findings: Findings) -> None:
    """The file's size against the rows: ``durable_rows`` of them must be
    there; ``derived``: a version 2 ids file, rewritten from the journal."""
    size = os.path.getsize(path)
    need, need_durable = HEADER_SIZE + rows * header.row_bytes, HEADER_SIZE + durable_rows * header.row_bytes
    findings.done(path, HEADER_SIZE)
    if size < need_durable:
        findings.add(path, Severity.CORRUPT, "rows_missing", f"at least {need_durable} bytes ({durable_rows} "
                     f"confirmed rows)", f"{size} bytes", size)
    elif size < need:
        repairs = ("the next open rewrites the ids from the journal" if derived
                   else "recovery drops the unconfirmed batches")
        findings.add(path, Severity.REPAIRABLE, "rows_missing", f"{need} bytes ({rows} rows)",
                     f"{size} bytes; {repairs}", size)
    elif sealed and size > need:
        findings.add(path, Severity.REPAIRABLE, "rows_tail", f"{need} bytes (sealing trims the file)",
                     f"{size - need} more bytes", need)


def _zero_tail(path: Path, end: int, findings: Findings) -> None:
    """Deep, unsealed shards: past the rows the journal holds a row file has
    only preallocated zeros or the rows of a batch a crash cut short."""
    with open(path, "rb") as f:
        f.seek(end)
        at = end
        while block := f.read(16 << 20):
            findings.read(len(block))
            nonzero = np.flatnonzero(np.frombuffer(block, dtype=np.uint8))
            if len(nonzero):
                findings.add(path, Severity.REPAIRABLE, "unconfirmed_tail", f"zeros after the {end} bytes of the rows "
                             "the journal holds", "non-zero bytes (rows of an unfinished batch, or garbage); "
                             "recovery cuts them when it seals the shard", at + int(nonzero[0]))
                return
            at += len(block)


def _batch_chain(directory: Path, batches: list[Found], findings: Findings) -> None:
    """Each batch starts where the one before it ended."""
    expected = 0
    for batch, offset in batches:
        if batch.first != expected:
            findings.add(directory / "journal", Severity.CORRUPT, "batch_chain", f"a batch starting at row "
                         f"{expected}", f"one starting at row {batch.first}", offset)
        expected = batch.end


def _vector_checksums(directory: Path, headers: dict[str, RowHeader | None], batches: list[Found],
                      check: JournalCheck, sealed: bool, findings: Findings) -> None:
    """Each batch's vector bytes (and a version 1 batch's id bytes) against the crc32c in its record."""
    columns: list[tuple[str, Callable[[Batch], int | None]]] = [("vectors", lambda b: b.vectors_crc)]
    if batches and batches[0][0].ids is None:
        columns.append(("ids", lambda b: b.ids_crc))
    for column, stored in columns:
        header = headers[column]
        assert header is not None
        path, width = directory / column, header.row_bytes
        spans = [(HEADER_SIZE + batch.first * width, batch.count * width) for batch, _ in batches]
        crcs = batch_crcs(path, spans, sealed)
        findings.read(sum(n for (_, n), crc in zip(spans, crcs) if crc is not None))
        for (batch, offset), (start, _), crc in zip(batches, spans, crcs):
            if crc is not None and crc != stored(batch):  # a short file is reported by _row_sizes
                severity = Severity.CORRUPT if sealed or offset < check.durable_end else Severity.REPAIRABLE
                findings.add(path, severity, "rows_checksum", f"rows {batch.first}..{batch.end} matching the "
                             "batch's crc32c", "different bytes", start)


def _ids(directory: Path, headers: dict[str, RowHeader | None], batches: list[Found], check: JournalCheck,
         sealed: bool, findings: Findings) -> None:
    """A version 2 shard's ids file against the ids in its batch records
    (the records are authoritative: a difference is REPAIRABLE)."""
    if not batches or batches[0][0].ids is None:
        return
    path = directory / "ids"
    repair = "--repair rewrites them from the journal" if sealed else "recovery rewrites them from the journal"
    with open(path, "rb") as f:  # pread, not a mapping: a live server may trim a growing shard's file
        for batch, offset in batches:
            assert batch.ids is not None
            start = HEADER_SIZE + batch.first * ID.itemsize
            stored = os.pread(f.fileno(), batch.count * ID.itemsize, start)
            findings.read(len(stored))
            if len(stored) == batch.count * ID.itemsize and stored != batch.ids.tobytes():  # short: _row_sizes
                findings.add(path, Severity.REPAIRABLE, "ids_mismatch", f"the ids of rows {batch.first}.."
                             f"{batch.end} in the batch record at journal offset {offset}",
                             f"different ids; {repair}", start)


def _index(directory: Path, known: tuple[int, bytes] | None, findings: Findings, deep: bool) -> None:
    """The index files against each other and (``known``: rows and uuid) the shard.
    Everything here is at most REPAIRABLE: a server rebuilds a bad index."""
    faiss_file, meta_file = directory / layout.INDEX, directory / layout.INDEX_META
    if not meta_file.exists():
        if faiss_file.exists():
            findings.add(meta_file, Severity.REPAIRABLE, "missing", "index.meta beside index.faiss",
                         "no such file: the index is rebuilt at the next start")
        return
    built = _index_meta(meta_file, findings)
    if built is None:
        if faiss_file.exists():
            findings.add(faiss_file, Severity.REPAIRABLE, "index", "an index.meta that describes this file",
                         "an unusable index.meta: the index is rebuilt at the next start")
        return
    built_rows, size, crc, shard = built
    rows = known[0] if known is not None else None
    if known is not None and shard != known[1]:
        findings.add(meta_file, Severity.REPAIRABLE, "index", "the index.meta of this shard (its uuid)",
                     "the index.meta of another shard; rebuilt at the next start", 64)
    if not faiss_file.exists() or faiss_file.stat().st_size != size or rows not in (None, built_rows):
        findings.add(faiss_file, Severity.REPAIRABLE, "index", f"an index of {rows} rows, {size} bytes",
                     f"{faiss_file.stat().st_size if faiss_file.exists() else 'no'} bytes built for {built_rows} "
                     f"rows; rebuilt at the next start")
    elif not deep:
        findings.done(faiss_file, 0)
    else:
        try:
            data = read_regular(faiss_file)
        except FormatError as exc:
            findings.add(faiss_file, Severity.REPAIRABLE, "index", "a regular file", exc.detail)
            return
        findings.done(faiss_file, len(data))
        if crc32c.crc32c(data) != crc:
            findings.add(faiss_file, Severity.REPAIRABLE, "index", "the crc32c recorded when it was built",
                         "different bytes; rebuilt at the next start")


def _index_meta(path: Path, findings: Findings) -> tuple[int, int, int, bytes | None] | None:
    """(rows, bytes, crc, shard uuid) the index was built with, or None if unusable (reported)."""
    check = findings.journal(path, index.META_KIND, deep=True, cap=Severity.REPAIRABLE)
    try:
        if check.journal is None:
            return None
        meta = msgpack.unpackb(check.journal.metadata)
        return int(meta["rows"]), int(meta["bytes"]), int(meta["crc"]), meta.get("shard")
    except (ValueError, KeyError, TypeError) as exc:
        findings.add(path, Severity.REPAIRABLE, "index", "{type, rows, bytes, crc, m, ef_construction, shard}",
                     f"{exc}; the index is rebuilt at the next start", 64)
        return None
    finally:
        check.close()
