"""The journal layer's exceptions: one root, :class:`JournalError` (under
:class:`common.errors.CommonError`), plus :class:`CannotCheck` for offline
checks stopped by a resource of the moment.
"""

from __future__ import annotations

from pathlib import Path

from common.errors import CommonError


class JournalError(CommonError):
    """Root of every error raised by the journal layer."""


class FormatError(JournalError, ValueError):
    """A file is not a journal of this format, or its header is damaged.

    ``path`` names the file and ``offset`` the byte where the problem is.
    """

    def __init__(self, path: Path | str, offset: int, detail: str) -> None:
        self.path = Path(path)
        self.offset = offset
        self.detail = detail
        super().__init__(f"{path}: at byte {offset}: {detail}")


class CorruptJournal(FormatError):
    """Data that an earlier flush made durable is damaged or missing.

    Recovery raises this instead of truncating, because truncating would drop
    records that were confirmed durable. Operators quarantine or repair the
    file; nothing is changed on disk before this is raised.
    """


class JournalClosed(JournalError):
    """The journal was closed (or abandoned after a fatal error)."""


class JournalSealed(JournalError):
    """An append was attempted on a sealed journal."""


class JournalFull(JournalError):
    """The append would grow the journal past its configured capacity.

    Nothing was written. Callers rotate to a new journal.
    """


class RecordTooLarge(JournalError, ValueError):
    """A record body exceeds the journal's maximum record size."""


class RecordNotFound(JournalError, KeyError):
    """An offset does not name a complete, valid record of this journal."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the sentence
        return str(self.args[0]) if self.args else "record not found"


class MarkerConflict(JournalError, ValueError):
    """A conditional marker change found a different marker than expected.

    ``offsets`` and ``found`` list the records that did not match; nothing
    was changed.
    """

    def __init__(self, message: str, offsets: list[int], found: list[int]) -> None:
        self.offsets = offsets
        self.found = found
        super().__init__(message)


class CannotCheck(CommonError):
    """An offline check could not run for a reason of the moment (no file
    descriptors, no memory): nothing about the data is concluded."""


class FlushFailed(JournalError):
    """fsync/fdatasync failed: the journal's durability is lost.

    This is fatal for the journal. No write made after the last successful
    flush is ever confirmed durable, every waiter receives this error, and
    further writes are refused. The original ``OSError`` is the cause.
    """


class WriteFailed(JournalError, OSError):
    """A write or a file growth failed (a full disk, for example).

    Nothing was appended: the journal rolled its file back to the previous
    end, and the journal stays usable. ``errno`` is the operating system's;
    ``filename`` the file written, ``needed`` the bytes of disk it needed
    (None where not known).
    """

    def __init__(self, message: str, errno: int | None = None, *, filename: str | None = None,
                 needed: int | None = None) -> None:
        super().__init__(errno, message, filename)
        self.message = message
        self.needed = needed

    def __str__(self) -> str:
        return self.message
