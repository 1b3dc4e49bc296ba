"""Errors that cross the wire: one root, :class:`ServiceError` (under
:class:`common.errors.CommonError`), each with a stable code (docs/protocol.md).
"""

from __future__ import annotations

from typing import ClassVar

from common.errors import CommonError


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


class ConnectionLost(Unavailable):
    """The connection broke with requests in flight; they may have applied
    (raised by the client, common/wire/client.py)."""

    code = "connection_lost"


class TimedOut(ConnectionLost):
    """No byte of a reply came within the call's timeout: the connection was
    closed, and the requests in flight may still run (or have run) on the server."""


class Full(ServiceError):
    """A limit was reached (disk space floor, queue limits); nothing was written."""

    code = "full"


class DiskFull(Full):
    """The data disk is full (or below the queue's free-space floor); nothing
    was written. The message says which file and how many bytes were needed.
    The work queue and the vector store answer the same code."""

    code = "disk_full"


class BadFrame(ServiceError):
    """Bytes on the connection do not form a valid frame; the connection closes."""

    code = "bad_frame"


class FrameTooLarge(BadFrame):
    """A frame is larger than the configured maximum; the connection closes."""

    code = "frame_too_large"


class FrameTimeout(BadFrame):
    """A frame did not arrive whole within the server's ``frame_timeout_s``
    (a stalled or too slow peer, or no memory for it within that time); the
    connection closes."""

    code = "frame_timeout"


class UnsupportedVersion(BadFrame):
    """The peer speaks a protocol version this side does not."""

    code = "unsupported_version"


class DurabilityLost(ServiceError):
    """A write could not be made durable (fsync failed); it is not confirmed."""

    code = "durability_lost"


class Internal(ServiceError):
    """The server hit a bug; the message says where. The request may or may not have applied."""

    code = "internal"


class Unauthenticated(ServiceError):
    """The server requires a token and none, or a wrong one, was given; the connection closes."""

    code = "unauthenticated"


class Forbidden(ServiceError, PermissionError):
    """The connection's token has no role that allows this command; the connection stays open."""

    code = "forbidden"
