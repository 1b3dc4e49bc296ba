"""Exceptions of the ``common`` package: one root, :class:`CommonError`.

Two families sit under it: :class:`JournalError` for the journal layer and
:class:`ServiceError` for errors that cross the wire with a stable code.
Errors that describe bad caller input also inherit the matching builtin
(``ValueError``, ``KeyError``) so generic handlers still catch them. Errors
that wrap an operating-system failure keep it as ``__cause__``.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar


class CommonError(Exception):
    """Root of every error raised by the ``common`` package."""


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
    end, and the journal stays usable. ``errno`` is the operating system's.
    """

    def __init__(self, message: str, errno: int | None = None) -> None:
        super().__init__(errno, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ServiceError(CommonError):
    """An error with a stable code that a server sends and a client raises.

    Every subclass names its ``code`` (a short snake_case string, part of the
    protocol; see docs/protocol.md) and is registered by it, so a client
    raises the most specific class it knows for a code and ServiceError for
    codes it does not. Subclasses in other packages (workq, shardmgr) may add
    dotted codes such as ``workq.unknown_handle``.
    """

    code: ClassVar[str] = "error"
    registry: ClassVar[dict[str, type[ServiceError]]] = {}

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "code" in cls.__dict__:
            ServiceError.registry[cls.code] = cls

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code  # type: ignore[misc]  # an unknown code received from a newer server

    def __str__(self) -> str:
        return self.message

    @classmethod
    def from_wire(cls, code: str, message: str) -> ServiceError:
        """The exception a client raises for an error frame."""
        known = ServiceError.registry.get(code)
        return known(message) if known is not None else ServiceError(message, code=code)


class BadRequest(ServiceError, ValueError):
    """The request's arguments are wrong: types, shapes, values."""

    code = "bad_request"


class UnknownCommand(ServiceError, ValueError):
    """No component registered this command."""

    code = "unknown_command"


class NotFound(ServiceError, KeyError):
    """The request names something that does not exist (or no longer)."""

    code = "not_found"

    def __str__(self) -> str:
        return self.message


class Conflict(ServiceError):
    """The request contradicts the current state (e.g. already retired)."""

    code = "conflict"


class Unavailable(ServiceError):
    """The service cannot take the request now (starting, stopping); retry."""

    code = "unavailable"


class Full(ServiceError):
    """A limit was reached (disk space floor, queue limits); nothing was written."""

    code = "full"


class BadFrame(ServiceError):
    """Bytes on the connection do not form a valid frame; the connection closes."""

    code = "bad_frame"


class FrameTooLarge(BadFrame):
    """A frame is larger than the configured maximum; the connection closes."""

    code = "frame_too_large"


class UnsupportedVersion(BadFrame):
    """The peer speaks a protocol version this side does not."""

    code = "unsupported_version"


class DurabilityLost(ServiceError):
    """A write could not be made durable (fsync failed); it is not confirmed."""

    code = "durability_lost"


class Internal(ServiceError):
    """The server hit a bug; the message says where. The request may or may not have applied."""

    code = "internal"
