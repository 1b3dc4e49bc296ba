"""The dialer: how a client opens one connection to a server.

A connection is TCP (``TCP_NODELAY``), then TLS if configured (its
handshake runs under the connect timeout, the server's certificate checked
against the CA and the host name), then the protocol preamble both ways and
its version check, then, with a token, one ``auth`` request and its answer.

While the server is unreachable (refused, reset, timed out: down, or still
recovering, since it listens only once recovery is done) :meth:`Dialer.dial`
retries with exponential backoff (50 ms, doubling, at most 1 s between
tries) for ``retry_for`` seconds, then raises
:class:`~common.wire.errors.Unavailable`. A TLS failure other than the peer
going away raises :class:`TlsFailed` at once; a refused token raises the
server's error (:class:`~common.wire.errors.Unauthenticated`) at once; a
server speaking another protocol version raises
:class:`~common.wire.errors.UnsupportedVersion` at once. A failed attempt
leaves no socket open.
"""

from __future__ import annotations

import dataclasses
import socket
import ssl
import time
from collections.abc import Callable

from . import framing
from .errors import BadFrame, ServiceError, Unavailable, UnsupportedVersion
from .frame_reader import FrameReader

TOKEN_ENV = "SHARDMGR_TOKEN"
"""Environment variable a client takes its token from when given none."""

FIRST_RETRY_S = 0.05
"""The first pause between connection attempts; it doubles after each."""

LONGEST_RETRY_S = 1.0
"""The longest pause between connection attempts."""


class TlsFailed(ServiceError):
    """TLS could not be set up (certificate not trusted, wrong host name,
    client certificate missing or refused); retrying would not help."""

    code = "tls_failed"


#: TLS errors that mean the peer went away (retried like a reset), not a refusal.
_TRANSIENT_TLS = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLWantReadError, ssl.SSLWantWriteError)


def parse_address(address: str | tuple[str, int]) -> tuple[str, int]:
    """``"host:port"`` (or a tuple) to a (host, port) pair."""
    if isinstance(address, tuple):
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address must be 'host:port', got {address!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


@dataclasses.dataclass(frozen=True, slots=True)
class Dialer:
    """Where one server is and how to reach it (its repr shows no token)."""

    address: tuple[str, int]
    tls: ssl.SSLContext | None
    token: str | None = dataclasses.field(repr=False)  # a secret: never in a repr (a traceback's locals)
    connect_timeout: float
    retry_for: float
    max_frame_bytes: int

    @property
    def where(self) -> str:
        """The address as ``host:port``, for messages."""
        return f"{self.address[0]}:{self.address[1]}"

    def dial(self, next_id: Callable[[], int], timeout: float | None) -> tuple[socket.socket, FrameReader]:
        """A ready connection and its frame reader, retrying while the server
        is unreachable (module docstring). ``next_id`` gives the ``auth``
        request its id; the socket is left with ``timeout`` for later waits."""
        deadline = time.monotonic() + self.retry_for
        delay = FIRST_RETRY_S
        while True:
            try:
                return self.attempt(next_id, timeout)
            except ssl.SSLError as exc:
                if not isinstance(exc, _TRANSIENT_TLS):
                    raise TlsFailed(f"TLS with {self.where} failed: {exc}") from exc
                if time.monotonic() + delay > deadline:
                    raise Unavailable(f"cannot reach {self.where} after {self.retry_for:g} s: {exc} "
                                      f"(is it a TLS server?)") from exc
            except (ConnectionRefusedError, ConnectionResetError, TimeoutError, OSError) as exc:
                if time.monotonic() + delay > deadline:
                    raise Unavailable(f"cannot reach {self.where} after {self.retry_for:g} s: {exc}") from exc
            time.sleep(delay)
            delay = min(delay * 2, LONGEST_RETRY_S)

    def attempt(self, next_id: Callable[[], int], timeout: float | None) -> tuple[socket.socket, FrameReader]:
        """One try at :meth:`dial`, without retries; raises what failed."""
        sock = socket.create_connection(self.address, timeout=self.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:  # the TLS handshake runs here, under connect_timeout
                sock = self.tls.wrap_socket(sock, server_hostname=self.address[0])
            sock.sendall(framing.preamble())
            reader = FrameReader(sock, self.max_frame_bytes)
            data = reader.read_exact(framing.PREAMBLE.size)
            if data is None:
                hint = "" if self.tls is not None else " (a TLS server does that to plain clients: tls=True?)"
                raise ConnectionResetError(f"server closed the connection during the handshake{hint}")
            version = framing.parse_preamble(data)
            if version != framing.PROTOCOL_VERSION:
                raise UnsupportedVersion(f"server speaks protocol {version}, this client {framing.PROTOCOL_VERSION}")
            if self.token is not None:
                self._authenticate(sock, reader, next_id())
            sock.settimeout(timeout)
        except BaseException:
            sock.close()
            raise
        return sock, reader

    def _authenticate(self, sock: socket.socket, reader: FrameReader, request_id: int) -> None:
        """Send ``auth`` with the token and wait for its answer (still under connect_timeout)."""
        framing.send_buffers(sock, framing.encode({"id": request_id, "cmd": "auth", "args": {"token": self.token}}))
        frame = reader.read()
        if frame is None:
            raise ConnectionResetError("server closed the connection during authentication")
        if "error" in frame.header:
            error = frame.header["error"]
            raise ServiceError.from_wire(str(error.get("code")), str(error.get("message")))
        if frame.header.get("id") != request_id:
            raise BadFrame(f"expected the answer to auth (id {request_id}), got {frame.header!r}")
