"""The files of one shard, opened and checked against each other.

A shard directory holds a journal (batch_record.py) and row files (rows.py)
that carry the same uuid; the journal's metadata names the shard, its
dimension and its batch record version. Everything that opens a shard's
files (shard.py, replay.py) goes through here, so every open checks the
same things, and a failed check is :class:`ShardDamaged` or one of
:data:`DAMAGE`: the collection quarantines the shard.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from common.errors import CommonError
from common.journal import Journal, JournalConfig
from common.journal.errors import FormatError

from . import layout, metadata
from .batch_record import ALIGNMENT, MAX_RECORD_BYTES, version_of
from .rows import IDS, VECTORS, RowFile

#: What says a shard's files are wrong: a bad format or content
#: (FormatError, CorruptJournal; undecodable metadata and records are
#: turned into FormatError where they are parsed) or a missing file. Errors
#: of the moment (too many open files, no memory, I/O errors) must not
#: quarantine a healthy shard, nor may bugs (TypeError, KeyError, ...):
#: those propagate and the open fails, changing nothing.
DAMAGE = (FormatError, FileNotFoundError)
JOURNAL_CONFIG = JournalConfig(alignment=ALIGNMENT, max_record_bytes=MAX_RECORD_BYTES, extent_bytes=1 << 20,
                               preallocate="zero")
"""How a shard journal is laid out and grown: small next to the vectors
(8 bytes a row), so grown by writing zeros (an fdatasync then has no block
allocation to commit: docs/durability.md)."""


class ShardDamaged(CommonError):
    """A shard failed its checks on open; ``reason`` says which."""

    def __init__(self, directory: Path, reason: str) -> None:
        super().__init__(f"{directory}: {reason}")
        self.directory = directory
        self.reason = reason


@dataclasses.dataclass(frozen=True, slots=True)
class Meta:
    """What a shard journal's metadata says that every open needs."""

    uuid: bytes
    version: int  # of its batch records (batch_record.py)


def check_meta(journal: Journal, directory: Path, shard_id: int, dim: int) -> Meta:
    """The shard's uuid and record version from its journal's metadata,
    checked against the shard's path and dimension."""
    meta = metadata.decode(journal.metadata, journal.path, {"shard": int, "dim": int, "uuid": bytes})
    if meta["shard"] != shard_id or meta["dim"] != dim:
        raise ShardDamaged(directory, f"journal says shard {meta['shard']} of dim {meta['dim']}; "
                           f"expected shard {shard_id} of dim {dim}")
    return Meta(bytes(meta["uuid"]), version_of(meta, journal.path))


def open_rows(directory: Path, uid: bytes, dim: int, writable: bool) -> tuple[RowFile, RowFile]:
    """Both row files, their headers checked against the shard (closed again on failure)."""
    vectors = open_row_file(directory, layout.VECTORS, uid, dim, writable)
    try:
        return vectors, open_row_file(directory, layout.IDS, uid, dim, writable)
    except BaseException:
        vectors.close()
        raise


def open_row_file(directory: Path, name: str, uid: bytes, dim: int, writable: bool) -> RowFile:
    """The row file ``name`` (layout.VECTORS or layout.IDS), its header checked against the shard."""
    want = (VECTORS, "<f4", dim) if name == layout.VECTORS else (IDS, "<i8", 1)
    try:
        column = RowFile.open(directory / name, writable)
    except DAMAGE as exc:
        raise ShardDamaged(directory, f"row file: {exc}") from exc
    header = column.header
    if (header.column, header.dtype, header.width) != want or header.uuid != uid:
        column.close()
        raise ShardDamaged(directory, f"{name}: header {header} does not belong to this shard")
    return column
