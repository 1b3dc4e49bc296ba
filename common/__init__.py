"""The shared journal layer: append-only, checksummed, group-committed files.

``common`` knows nothing of the queue or the vector store; both build on it.
"""

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
from .journal import Appended, Journal
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
