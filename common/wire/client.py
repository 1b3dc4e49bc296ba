"""The client side of the wire protocol: connect, pipeline, reconnect.

Both ``workq`` and ``shardmgr`` clients are built on :class:`RpcClient`.

Threads: a RpcClient is not thread-safe; use one per thread (they are cheap).

Failures: while the server is down or still recovering (it listens only
once recovery is done) connecting is retried with exponential backoff for
``retry_for`` seconds, then :class:`~common.errors.Unavailable` is raised. A
connection that breaks while requests are in flight raises
:class:`ConnectionLost`: those requests may or may not have been applied,
so the client never resends them by itself; the next call reconnects.
"""

from __future__ import annotations

import dataclasses
import itertools
import socket
import time
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from . import framing
from .errors import BadFrame, ServiceError, Unavailable, UnsupportedVersion


class ConnectionLost(Unavailable):
    """The connection broke with requests in flight; they may have applied."""

    code = "connection_lost"


@dataclasses.dataclass(slots=True)
class Reply:
    """A successful response: its result map and its binary parts."""

    result: dict[str, Any]
    parts: dict[str, np.ndarray]


def parse_address(address: str | tuple[str, int]) -> tuple[str, int]:
    """``"host:port"`` (or a tuple) to a (host, port) pair."""
    if isinstance(address, tuple):
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address must be 'host:port', got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


class RpcClient:
    """One connection to a shardmgr service, reopened on demand."""

    def __init__(self, address: str | tuple[str, int], *, timeout: float | None = 30.0,
                 connect_timeout: float = 5.0, retry_for: float = 30.0,
                 max_frame_bytes: int = framing.DEFAULT_MAX_FRAME_BYTES,
                 on_connect: Callable[[RpcClient], None] | None = None) -> None:
        """``timeout`` bounds each wait for a response (None: forever);
        ``on_connect`` runs after every (re)connect, before any queued call."""
        self.address = parse_address(address)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retry_for = retry_for
        self.max_frame_bytes = max_frame_bytes
        self.on_connect = on_connect
        self._sock: socket.socket | None = None
        self._reader: framing.FrameReader | None = None
        self._ids = itertools.count(1)
        self._waiting: set[int] = set()
        self._early: dict[int, framing.Frame] = {}
        self._connecting = False

    # ------------------------------------------------------------- connection

    def connect(self) -> None:
        """Connect now (retrying while the server is unreachable)."""
        if self._sock is not None:
            return
        deadline = time.monotonic() + self.retry_for
        delay = 0.05
        while True:
            try:
                self._open()
                break
            except (ConnectionRefusedError, ConnectionResetError, TimeoutError, OSError) as exc:
                if time.monotonic() + delay > deadline:
                    raise Unavailable(f"cannot reach {self._where()} after {self.retry_for:g} s: {exc}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        if self.on_connect is not None and not self._connecting:
            self._connecting = True
            try:
                self.on_connect(self)
            finally:
                self._connecting = False

    def _open(self) -> None:
        sock = socket.create_connection(self.address, timeout=self.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(framing.preamble())
            reader = framing.FrameReader(sock, self.max_frame_bytes)
            data = reader.read_exact(framing.PREAMBLE.size)
            if data is None:
                raise ConnectionResetError("server closed the connection during the handshake")
            version = framing.parse_preamble(data)
            if version != framing.PROTOCOL_VERSION:
                raise UnsupportedVersion(f"server speaks protocol {version}, this client {framing.PROTOCOL_VERSION}")
            sock.settimeout(self.timeout)
        except BaseException:
            sock.close()
            raise
        self._sock, self._reader = sock, reader

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = self._reader = None
        self._waiting.clear()
        self._early.clear()

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _where(self) -> str:
        return f"{self.address[0]}:{self.address[1]}"

    # ---------------------------------------------------------------- calls

    def call(self, cmd: str, args: dict[str, Any] | None = None,
             parts: dict[str, np.ndarray] | None = None) -> Reply:
        """Send one request and wait for its reply; raise its error if any."""
        return self.receive(self.send(cmd, args, parts))

    def send(self, cmd: str, args: dict[str, Any] | None = None,
             parts: dict[str, np.ndarray] | None = None) -> int:
        """Send a request without waiting (pipelining); returns its id."""
        self.connect()
        request_id = next(self._ids)
        header: dict[str, Any] = {"id": request_id, "cmd": cmd}
        if args:
            header["args"] = args
        buffers = framing.encode(header, parts)
        try:
            framing.send_buffers(self._sock, buffers)
        except OSError as exc:
            self._lost(exc)
        self._waiting.add(request_id)
        return request_id

    def receive(self, request_id: int) -> Reply:
        """Wait for the reply to ``request_id`` (replies may come in any order)."""
        if request_id not in self._waiting:
            raise ValueError(f"request {request_id} was not sent on this connection or was already received")
        frame = self._early.pop(request_id, None)
        while frame is None:
            got = self._read_frame()
            got_id = got.header.get("id")
            if got_id == request_id:
                frame = got
            elif got_id in self._waiting:
                self._early[got_id] = got
            elif "error" in got.header:  # a connection-level error (id 0): the server is closing us
                error = got.header["error"]
                self._lost(ServiceError.from_wire(str(error.get("code")), str(error.get("message"))))
        self._waiting.discard(request_id)
        if "error" in frame.header:
            error = frame.header["error"]
            raise ServiceError.from_wire(str(error.get("code")), str(error.get("message")))
        return Reply(frame.header.get("ok") or {}, frame.parts)

    def _read_frame(self) -> framing.Frame:
        try:
            got = self._reader.read()  # type: ignore[union-attr]
        except (OSError, BadFrame) as exc:
            self._lost(exc)
        if got is None:
            self._lost(ConnectionResetError("server closed the connection"))
        return got

    def _lost(self, cause: BaseException) -> NoReturn:
        pending = len(self._waiting)
        self.close()
        raise ConnectionLost(f"connection to {self._where()} lost with {pending} request(s) in flight: "
                             f"{cause}") from cause
