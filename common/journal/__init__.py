"""The journal layer: append-only files of checksummed records whose only
in-place write is a record's 4-byte state marker.

Owns the file format (``header``, ``record``, ``marker``), writing and
reading (``journal``, with its sides ``appending``, ``reader`` and
``marking``; ``mapping``, ``filesystem``), group
commit (``flusher``, ``syncer``, and ``leader``: rounds run by the
thread that answers), recovery (``scan``, ``anchors``,
``recovery``), the offline check (``check``), the directory ``lockfile``,
and the power-cut simulator (``testing``). docs/format.md and
docs/durability.md describe the format and the contract.

May import: ``common.errors``, ``common.units``; never ``common.wire``,
``workq`` or ``shardmgr``.
"""

from .appending import Appended
from .config import FlusherConfig, JournalConfig
from .errors import (
    CorruptJournal,
    FlushFailed,
    FormatError,
    JournalClosed,
    JournalError,
    JournalFull,
    JournalSealed,
    MarkerConflict,
    RecordNotFound,
    RecordTooLarge,
    WriteFailed,
)
from .flusher import Flusher, Ticket
from .journal import Journal
from .marker import Marker
from .reader import Record
from .recovery import RecoveryReport
from .scan import RecordChunk

__all__ = [
    # Journals
    "Journal", "Appended", "Record", "RecordChunk", "RecoveryReport", "Marker",
    # Durability
    "Flusher", "Ticket",
    # Configuration
    "JournalConfig", "FlusherConfig",
    # Errors
    "JournalError", "FormatError", "CorruptJournal", "JournalClosed", "JournalSealed", "JournalFull",
    "RecordTooLarge", "RecordNotFound", "MarkerConflict", "FlushFailed", "WriteFailed",
]
