"""The client side of the wire protocol: connect, pipeline, reconnect.

Both ``workq`` and ``shardmgr`` clients are built on :class:`RpcClient`.

Pipelining: :meth:`RpcClient.send` returns at once and :meth:`RpcClient.receive`
takes replies in any order; ``send_many`` writes several requests at once
and ``poll`` reads replies already there without waiting.
:mod:`common.wire.pipeline` builds answers as objects, with a bound, on them.

Threads: a RpcClient is not thread-safe; use one per thread (they are cheap).

Connecting (TCP, TLS, the preamble, the token) is the dialer's
(:mod:`common.wire.dialer`).

Failures: while the server is down or still recovering (it listens only
once recovery is done) connecting is retried with exponential backoff for
``retry_for`` seconds, then :class:`~common.wire.errors.Unavailable` is
raised. When the server ends the connection with a goaway frame (id 0,
``unavailable``: a clean stop, or too many connections), every request
without an answer raises Unavailable: the server promises it applied none
of them. A connection that breaks otherwise raises :class:`ConnectionLost`
for each request in flight: those may or may not have been applied, so the
client never resends them by itself. Answers that arrived before the end
can still be received. The next call reconnects.

Security (docs/security.md): with a token (``token=``, or the
``SHARDMGR_TOKEN`` environment variable) every connection starts with an
``auth`` request; a refused token raises :class:`~common.wire.errors.Unauthenticated` at once
(no retry). With ``tls=True`` (implied by ``ca=`` or ``client_cert=``) the
connection is TLS, the server's certificate checked against ``ca`` (or the
system's CAs) and the host name; a TLS failure other than the peer going
away raises :class:`TlsFailed` at once.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import select
import socket
import ssl
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import EllipsisType
from typing import Any, Final

import numpy as np
from mypy_extensions import mypyc_attr

from . import framing
from .dialer import TOKEN_ENV, Dialer, TlsFailed, parse_address
from .errors import BadFrame, ConnectionLost, ServiceError, TimedOut, Unavailable
from .frame_reader import FrameReader
from .tls import client_context

__all__ = ["IDLE_CHECK_S", "MAX_CLIENT_SECONDS", "TOKEN_ENV", "ConnectionLost", "Reply", "RpcClient", "TimedOut",
           "TlsFailed", "parse_address"]

IDLE_CHECK_S: Final = 0.5
"""A connection idle this long is checked (one select) before a request is
sent on it, in case the server ended it meanwhile (a goaway, a restart);
busier ones skip the syscall and learn of an end from their next read."""

MAX_CLIENT_SECONDS: Final = 86400.0
"""Longest timeout, connect timeout or retry period a client takes, in seconds."""


@dataclasses.dataclass(slots=True)
class Reply:
    """A successful response: its result map and its binary parts."""

    result: dict[str, Any]
    parts: Mapping[str, np.ndarray]  # a received frame's: framing.PartViews

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, result: dict[str, Any], parts: Mapping[str, np.ndarray]) -> None:
        self.result = result
        self.parts = parts


@mypyc_attr(allow_interpreted_subclasses=True)  # tests observe its reads and connects through a subclass
class RpcClient:
    """One connection to a shardmgr service, reopened on demand."""

    def __init__(self, address: str | tuple[str, int], *, timeout: float | None = 30.0,
                 connect_timeout: float = 5.0, retry_for: float = 30.0,
                 max_frame_bytes: int = framing.DEFAULT_MAX_FRAME_BYTES,
                 on_connect: Callable[[RpcClient], None] | None = None, token: str | None = None,
                 tls: bool | ssl.SSLContext = False, ca: str | Path | None = None,
                 client_cert: str | Path | None = None, client_key: str | Path | None = None) -> None:
        """``timeout`` bounds each wait for a response (None: forever);
        ``on_connect`` runs after every (re)connect, before any queued call.
        ``token`` defaults to ``$SHARDMGR_TOKEN``; ``""`` (or an empty or unset variable) is none.
        ``tls``: True, or a ready SSLContext; ``ca`` (PEM CA file, default
        the system's) and ``client_cert``/``client_key`` imply TLS."""
        for name, seconds in (("timeout", timeout), ("connect_timeout", connect_timeout), ("retry_for", retry_for)):
            _check_seconds(name, seconds)
        self.address = parse_address(address)
        self.token = (token if token is not None else os.environ.get(TOKEN_ENV)) or None
        self.tls: ssl.SSLContext | None = None
        if isinstance(tls, ssl.SSLContext):
            self.tls = tls
        elif tls or ca is not None or client_cert is not None:
            self.tls = client_context(ca, client_cert, client_key)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retry_for = retry_for
        self.max_frame_bytes = max_frame_bytes
        self.on_connect = on_connect
        self._sock: socket.socket | None = None
        self._reader: FrameReader | None = None
        self._ids = itertools.count(1)
        self._waiting: set[int] = set()
        self._early: dict[int, framing.Frame] = {}  # answers read before their receive()
        self._ended: dict[int, ServiceError] = {}  # requests the end of a connection left unanswered
        self._last_reply = 0.0  # monotonic time of the last reply received
        self._connecting = False
        self._call_timeout: tuple[float | None] | None = None  # a call's own timeout, while it runs

    # ------------------------------------------------------------- connection

    def connect(self) -> None:
        """Connect now (retrying while the server is unreachable: dialer.py)."""
        if self._sock is not None:
            return
        dialer = Dialer(self.address, self.tls, self.token, self.connect_timeout, self.retry_for,
                        self.max_frame_bytes)
        # a reconnect inside a call keeps that call's timeout
        self._sock, self._reader = dialer.dial(lambda: next(self._ids), self._timeout_now())
        if self.on_connect is not None and not self._connecting:
            self._connecting = True
            try:
                self.on_connect(self)
            finally:
                self._connecting = False

    def close(self) -> None:
        """Close the connection; requests in flight are forgotten."""
        self._drop_socket()
        self._waiting.clear()
        self._early.clear()
        self._ended.clear()

    def _drop_socket(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._reader = None

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    # ---------------------------------------------------------------- calls

    def call(self, cmd: str, args: dict[str, Any] | None = None,
             parts: Mapping[str, np.ndarray] | None = None, *, wait: float = 0.0,
             timeout: float | None | EllipsisType = ...) -> Reply:
        """Send one request and wait for its reply; raise its error if any.
        ``wait``: seconds the server may hold the request on purpose (a long
        poll), added to the timeout for this reply. ``timeout``: this call's
        bound on each wait for the server (sending, and the reply), instead
        of the client's; None waits for ever. When it runs out, TimedOut."""
        if timeout is ...:
            return self.receive(self.send(cmd, args, parts), wait=wait)
        _check_seconds("timeout", timeout)
        outer = self._call_timeout
        self._call_timeout = (timeout,)
        try:
            if self._sock is not None:
                self._sock.settimeout(timeout)
            return self.receive(self.send(cmd, args, parts), wait=wait)
        finally:
            self._call_timeout = outer
            if self._sock is not None:
                self._sock.settimeout(self._timeout_now())

    def _timeout_now(self) -> float | None:
        """The bound on each socket wait: the running call's own timeout, else the client's."""
        return self.timeout if self._call_timeout is None else self._call_timeout[0]

    def send(self, cmd: str, args: dict[str, Any] | None = None,
             parts: Mapping[str, np.ndarray] | None = None) -> int:
        """Send a request without waiting (pipelining); returns its id."""
        if not isinstance(cmd, str):  # as the compiled build's typed parameter refuses it
            raise TypeError(f"cmd must be a str, got {type(cmd).__name__}")
        self._ready_to_send()
        request_id = next(self._ids)
        header: dict[str, Any] = {"id": request_id, "cmd": cmd}
        if args:
            header["args"] = args
        buffers = framing.encode(header, parts)
        self._waiting.add(request_id)
        try:
            framing.send_buffers(self._sock, buffers)
        except OSError as exc:
            self._end(self._salvage(exc))
            raise self._ended.pop(request_id) from exc
        return request_id

    def send_many(self, requests: Sequence[tuple[str, dict[str, Any] | None, dict[str, np.ndarray] | None]]
                  ) -> list[int]:
        """Send several requests (cmd, args, parts) in one write, without
        waiting; returns their ids, in order. Unlike :meth:`send`, a failed
        write raises nothing here: :meth:`receive` raises each request's
        error, as for any request in flight when a connection ends. Raises
        only what connecting raises (then nothing was sent)."""
        self._ready_to_send()
        ids: list[int] = []
        buffers: list[bytes | memoryview] = []
        for cmd, args, parts in requests:
            header: dict[str, Any] = {"id": next(self._ids), "cmd": cmd}
            if args:
                header["args"] = args
            buffers.extend(framing.encode(header, parts))
            ids.append(header["id"])
        self._waiting.update(ids)
        try:
            framing.send_buffers(self._sock, buffers)
        except OSError as exc:
            self._end(self._salvage(exc))
        return ids

    def poll(self) -> None:
        """Read the replies that have already arrived, without waiting for
        more; :meth:`receive` then returns them at once. A caller keeping
        many requests in flight calls this now and then, so unread replies
        do not fill the socket buffers (a server stops reading a connection
        it cannot write to, and a client blocked sending would then wait
        for ever). A broken connection ends here as in :meth:`receive`."""
        while (self._sock is not None and len(self._early) < len(self._waiting)
               and (self._reader.frame_buffered() or _ended_by_peer(self._sock))):  # type: ignore[union-attr]
            got = self._read_frame()
            if got is None:
                return
            self._last_reply = time.monotonic()
            got_id = got.header.get("id")
            if got_id in self._waiting:
                self._early[got_id] = got
            elif "error" in got.header:  # a connection-level error (id 0): the server is closing us
                self._end(_connection_error(got.header["error"], self._where()))

    def receive(self, request_id: int, *, wait: float = 0.0) -> Reply:
        """Wait for the reply to ``request_id`` (replies may come in any
        order), up to ``timeout`` + ``wait`` seconds (see :meth:`call`)."""
        bound = self._timeout_now()
        if wait > 0 and bound is not None and self._sock is not None:
            self._sock.settimeout(bound + min(wait, MAX_CLIENT_SECONDS))
            try:
                return self.receive(request_id)
            finally:
                if self._sock is not None:
                    self._sock.settimeout(bound)
        frame = self._early.pop(request_id, None)
        if frame is None and request_id in self._ended:
            raise self._ended.pop(request_id)
        if frame is None and request_id not in self._waiting:
            raise ValueError(f"request {request_id} was not sent on this connection or was already received")
        while frame is None:
            got = self._read_frame()
            if got is None:
                raise self._ended.pop(request_id)
            got_id = got.header.get("id")
            if got_id == request_id:
                frame = got
            elif got_id in self._waiting:
                self._early[got_id] = got
            elif "error" in got.header:  # a connection-level error (id 0): the server is closing us
                self._end(_connection_error(got.header["error"], self._where()))
                raise self._ended.pop(request_id)
        self._waiting.discard(request_id)
        self._last_reply = time.monotonic()
        if "error" in frame.header:
            error = frame.header["error"]
            raise ServiceError.from_wire(str(error.get("code")), str(error.get("message")))
        return Reply(frame.header.get("ok") or {}, frame.parts)

    def _ready_to_send(self) -> None:
        if (self._sock is not None and not self._waiting and time.monotonic() - self._last_reply > IDLE_CHECK_S
                and _ended_by_peer(self._sock)):
            self._drop_socket()  # an idle connection the server closed (a goaway, a restart): nothing was lost
        self.connect()

    def _read_frame(self) -> framing.Frame | None:
        """The next frame; None once a broken connection was ended
        (ConnectionLost for every request it left unanswered)."""
        try:
            got = self._reader.read()  # type: ignore[union-attr]
            if got is None:
                raise ConnectionResetError("server closed the connection")
        except (OSError, BadFrame) as exc:
            self._end(self._lost(exc))
            return None
        return got

    def _salvage(self, cause: OSError) -> ServiceError:
        """A send failed: read what the server sent before it closed (answers,
        and perhaps its goaway) and return the error for the rest."""
        try:
            self._sock.settimeout(0.5)  # type: ignore[union-attr]
            while True:
                got = self._reader.read()  # type: ignore[union-attr]
                if got is None:
                    break
                got_id = got.header.get("id")
                if got_id in self._waiting:
                    self._early[got_id] = got
                    self._waiting.discard(got_id)
                elif "error" in got.header:
                    return _connection_error(got.header["error"], self._where())
        except (OSError, BadFrame):
            pass
        return self._lost(cause)

    def _lost(self, cause: BaseException) -> ConnectionLost:
        if isinstance(cause, TimeoutError):  # socket.timeout: the server said nothing for a whole timeout
            error: ConnectionLost = TimedOut(
                f"no reply from {self._where()} within {self._timeout_now()} s; the connection was closed with "
                f"{len(self._waiting)} request(s) in flight, which may still run on the server (a slow call "
                f"needs a longer timeout: the client's, or the call's own)")
        else:
            error = ConnectionLost(f"connection to {self._where()} lost with {len(self._waiting)} request(s) in "
                                   f"flight: {cause}")
        error.__cause__ = cause
        return error

    def _end(self, error: ServiceError) -> None:
        """The connection is over: every request without an answer gets ``error``."""
        self._drop_socket()
        for request_id in self._waiting:
            if request_id not in self._early:
                self._ended[request_id] = _copy(error)
        self._waiting.clear()


def _check_seconds(name: str, seconds: float | None) -> None:
    """ValueError unless ``seconds`` is None or in 0..MAX_CLIENT_SECONDS."""
    if seconds is not None and not 0 <= seconds <= MAX_CLIENT_SECONDS:  # also NaN
        raise ValueError(f"{name} must be a number of seconds in 0..{MAX_CLIENT_SECONDS:g}, got {seconds!r}")


def _ended_by_peer(sock: socket.socket) -> bool:
    """True if the socket has bytes to read (or is closed). While no request
    is in flight that can only be a goaway, an error frame or the end of the
    stream; :meth:`RpcClient.poll` uses it to read replies without blocking."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):  # closed under us
        return True
    return bool(readable)


def _connection_error(error: dict[str, Any], where: str) -> ServiceError:
    """What an id-0 error frame means for the requests it leaves unanswered:
    ``unavailable`` (a goaway) promises they were not applied; any other code
    (the server rejected the stream) leaves that unknown."""
    code, message = str(error.get("code")), str(error.get("message"))
    if code == Unavailable.code:
        return Unavailable(f"{where}: {message}")
    return ConnectionLost(f"connection to {where} closed by the server: {code}: {message}")


def _copy(error: ServiceError) -> ServiceError:
    """A fresh exception per request (one raised twice would grow its traceback)."""
    copy = type(error)(error.message)
    copy.__cause__ = error.__cause__
    return copy
