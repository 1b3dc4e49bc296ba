"""One client connection on the server: a reader thread, and a writer
thread once one is needed.

The reader thread does the handshake, reads frames and dispatches requests.
How replies are sent (held and batched, by whom, the outbox, the writer
thread, the goaway) is the connection's :class:`~.sending.Sender`
(sending.py), which it makes and owns: the reader and the owner threads write their replies themselves while the
socket takes them, so the writer thread starts only the first time a reply
has to wait in the outbox or a clean stop begins.

With a tokens file (auth.py), the first frame after the preambles must be
``auth`` with a valid token, within ``handshake_timeout_s`` and at most
``MAX_AUTH_FRAME_BYTES`` (a larger one gets ``frame_too_large``); any other
frame, or a wrong token, gets ``unauthenticated`` (with the request's id)
and the connection closes. ``auth`` may be sent again later to change the
connection's roles. On a TLS socket the TLS handshake comes first, under
the same timeout.

Bad bytes end the connection: the server sends an error frame with id 0
(``bad_frame``, ``frame_too_large``, ``unsupported_version``) and closes. A
client that stops reading is closed once its queued replies pass
``max_outbox_bytes`` or a send blocks for ``send_timeout_s``. The end of
the client's stream (it closed) closes the connection at once: replies not
yet sent are dropped, and whatever its requests wait for ends with it. A
frame must arrive whole within ``frame_timeout_s`` of its first byte
(``frame_timeout`` error, then closed); the memory of frames still arriving
is charged to the server-wide ``budget`` (``max_inflight_bytes``) until the
frame is dispatched.

A clean stop (:meth:`Connection.drain`) keeps reading, but the server
answers every request read from then on with ``unavailable`` without
applying it. Once every request read before has been answered and its
reply written (``on_sent`` run), the connection sends a *goaway* frame (id
0, ``unavailable``) and shuts its sending side: the client then knows that
no request it has no answer to was applied.

Threads: the reader thread owns what is read (the frame reader, the
principal, the counts of requests and bytes in); everything about sending
is the sender's, under its lock (sending.py); :meth:`Connection.close` may
run on any thread, and every caller returns once the close is complete.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from typing import Any, Final

from common.journal import leader
from common.wire import framing
from common.wire.budget import ByteBudget
from common.wire.component import OnSent, Request
from common.wire.errors import BadFrame, BadRequest, Unauthenticated, UnsupportedVersion
from common.wire.frame_reader import FrameReader

from .auth import MAX_AUTH_FRAME_BYTES, OPEN, Authenticator, Principal
from .config import ServerConfig
from .sending import Sender

log = logging.getLogger(__name__)

HELD_REPLIES: Final = 256
"""Replies the reader thread may hold back to send in one sendmsg."""

KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 60, 10, 6
"""TCP keepalive: an idle connection is probed after 60 s, every 10 s, and
closed after 6 unanswered probes, so a worker whose machine vanished (no
FIN, no RST) is noticed within about 2 minutes: its leases then end after
the grace period, and its worker id is free again."""

CLOSE_WAIT_S: Final = 10.0
"""Longest close() waits for a write under way (a shut-down socket ends it at once)."""

Dispatch = Callable[[Request, Principal], None]
CountError = Callable[[str], None]


class Connection:
    """Serves one socket until it closes. Build, then :meth:`start`."""

    def __init__(self, sock: socket.socket, peer: str, config: ServerConfig, dispatch: Dispatch,
                 on_close: Callable[[Connection], None], count_error: CountError,
                 auth: Authenticator | None = None, budget: ByteBudget | None = None,
                 outbox_budget: ByteBudget | None = None) -> None:
        self.peer = peer
        self.sock = sock
        self.requests = 0
        self.bytes_in = 0
        self._config = config
        self._dispatch = dispatch
        self._on_close = on_close
        self._count_error = count_error
        self._budget = budget
        self._auth = auth if auth is not None else Authenticator(None)
        # Who the peer is (reader thread only); None until an ``auth`` succeeds, if tokens are required.
        self._principal: Principal | None = None if self._auth.required else OPEN
        self._frames: FrameReader | None = None  # the reader thread's, while its frame limit is lowered
        self._close_done = threading.Event()
        self._reader = threading.Thread(target=self._read_loop, name=f"conn-read {peer}", daemon=True)
        #: how replies are sent (sending.py): Connection.respond hands them to it
        self.sending = Sender(sock, peer, config, self.close, count_error, outbox_budget)

    def start(self) -> None:
        seconds = int(self._config.send_timeout_s)
        micros = int((self._config.send_timeout_s - seconds) * 1e6)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, micros))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):  # Linux: find a vanished peer in minutes, not the default 2 hours
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_INTERVAL_S)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, KEEPALIVE_PROBES)
        self._reader.start()

    # ------------------------------------------------------------------ reading

    def respond(self, header: dict[str, Any], parts: framing.Body | None, on_sent: OnSent | None) -> None:
        """A request's reply (Request.reply: any thread): the sender sends it."""
        self.sending.respond(header, parts, on_sent)

    @property
    def bytes_out(self) -> int:
        return self.sending.bytes_out

    def _read_loop(self) -> None:
        sending = self.sending
        sending.reading_here()
        reader = FrameReader(self.sock, self._config.max_frame_bytes, budget=self._budget,
                                     frame_timeout_s=self._config.frame_timeout_s)
        try:
            if not self._handshake(reader):
                return
            while True:
                frame = reader.read()
                if frame is None:
                    break  # the client closed: nobody is left to answer
                self.bytes_in += frame.size
                leader.begin()  # a lone durable request is synced and answered on this thread (below)
                if not self._serve(frame):
                    sending.flush_held()  # the refusal, before the close
                    break
                reader.release()  # dispatched: what it holds is the component's now
                if reader.frame_buffered():
                    leader.hand_off()  # the flusher thread syncs what it waits for; read on
                    if sending.held >= HELD_REPLIES:
                        sending.flush_held()
                else:
                    sending.flush_held()  # what is answered goes first, then the sync, if one is waited for
                    if leader.lead():
                        sending.flush_held()
        except BadFrame as exc:
            log.warning("closing %s: %s", self.peer, exc)
            self._count_error(exc.code)
            sending.flush_held()
            sending.send_now({"id": 0, "error": {"code": exc.code, "message": exc.message}})
        except OSError as exc:  # reset, a stream cut inside a frame, or our own close()
            if not sending.closed:
                log.info("connection %s ended: %s", self.peer, exc)
        except Exception:  # a bug: lose this connection, never the server
            log.exception("closing %s after an unexpected error", self.peer)
        finally:
            leader.hand_off()  # a request that ended the loop: what its window kept is not left behind
            reader.release()
            self.close()

    def _handshake(self, reader: FrameReader) -> bool:
        self.sock.settimeout(self._config.handshake_timeout_s)
        if isinstance(self.sock, ssl.SSLSocket):
            try:
                self.sock.do_handshake()
            except (OSError, ValueError) as exc:  # a plain-TCP client, a bad certificate, a timeout
                log.info("closing %s: TLS handshake failed: %s", self.peer, exc)
                self._count_error("tls_handshake")
                self.close()
                return False
        data = reader.read_exact(framing.PREAMBLE.size)
        if data is None:
            return False
        try:
            version = framing.parse_preamble(data)
        except BadFrame as exc:  # not our protocol at all: no frame would be understood
            hint = " (a TLS handshake: this server has no --tls-cert)" if data[:2] == b"\x16\x03" else ""
            log.warning("closing %s: %s%s", self.peer, exc, hint)
            self.close()
            return False
        if self._principal is not None:
            self.sock.settimeout(None)
        else:  # the auth frame stays under the handshake timeout, and small
            self._frames = reader
            reader.max_frame_bytes = MAX_AUTH_FRAME_BYTES
        if not self.sending.send_preamble():  # the server began to stop first: no request will be read
            return False
        if version != framing.PROTOCOL_VERSION:
            raise UnsupportedVersion(f"client speaks protocol {version}; this server speaks "
                                     f"{framing.PROTOCOL_VERSION}")
        return True

    def _serve(self, frame: framing.Frame) -> bool:
        """Dispatch one request frame; False if the connection must stop reading."""
        header = frame.header
        request_id, cmd, args = header.get("id"), header.get("cmd"), header.get("args", {})
        if not isinstance(request_id, int) or isinstance(request_id, bool) or not 0 <= request_id < 2**63:
            raise BadFrame(f"request id must be an integer in [0, 2**63), got {request_id!r}")
        # (typed, compiled: a Request holds a str and a dict, so the refusal is built with empty ones)
        request = Request(request_id, cmd if isinstance(cmd, str) else "", args if isinstance(args, dict) else {},
                          frame.parts, self)
        self.requests += 1
        self.sending.expect_reply()
        if not isinstance(cmd, str) or not isinstance(args, dict):
            request.fail(BadRequest(f"request {request_id}: 'cmd' must be a string and 'args' a map"))
            return True
        if cmd == "auth" or self._principal is None:
            return self._authenticate(request)
        self._dispatch(request, self._principal)
        return True

    def _authenticate(self, request: Request) -> bool:
        """Serve ``auth`` (or refuse a request sent before it); False if the connection must close."""
        if request.cmd != "auth":
            request.fail(Unauthenticated(f"{request.cmd}: this server requires a token; send 'auth' first "
                                         f"(clients: token= or SHARDMGR_TOKEN)"))
            return False
        principal = self._auth.authenticate(request.args.get("token"))
        if principal is None:
            log.warning("closing %s: authentication failed", self.peer)
            request.fail(Unauthenticated("auth: the token is not valid on this server"))
            return False
        if self._principal is None:
            self.sock.settimeout(None)
            if self._frames is not None:
                self._frames.max_frame_bytes = self._config.max_frame_bytes
            log.debug("%s authenticated as %s", self.peer, principal.name)
        self._principal = principal
        request.reply({"name": principal.name, "roles": sorted(principal.roles), "required": self._auth.required})
        return True

    # ------------------------------------------------------------------ closing

    def drain(self) -> None:
        """Begin a clean stop (any thread): the goaway follows the last reply
        to what was read so far. The server refuses what is read later."""
        if not self.sending.drain():
            self.close()

    def wait_drained(self, timeout: float) -> bool:
        """Wait until the goaway was written (or the connection closed); False on timeout."""
        return self.sending.wait_drained(timeout)

    def wait_closed(self, timeout: float) -> bool:
        """Wait until the connection closed (the client closed its end); False on timeout."""
        return self.sending.wait_closed(timeout)

    def write_blocked_for(self, now: float) -> float:
        """Seconds the send under way has been blocked (0 if none). The
        server's watchdog closes connections past ``send_timeout_s``: a TLS
        socket ignores the kernel's send timeout."""
        return self.sending.write_blocked_for(now)

    def close(self) -> None:
        """Close at once; queued replies are dropped (their on_sent never
        runs). Every caller returns only once the close is complete: a write
        under way has ended (the shutdown cuts a blocked send short), so a
        reply that was sent has had its on_sent run, and the server was told
        (``on_close``)."""
        first = self.sending.shut()
        if first:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(self.sock, socket.SHUT_RDWR)  # not SSLSocket's (see sending.py)
        if not first:  # another thread is closing it: return once that close is complete
            self._close_done.wait(CLOSE_WAIT_S)
            return
        if not self.sending.await_write_end(CLOSE_WAIT_S):
            log.error("closing %s: a write did not end within %.0f s", self.peer, CLOSE_WAIT_S)
        try:
            self.sock.close()
            self._on_close(self)
        finally:
            self._close_done.set()

    def join(self, timeout: float | None = None) -> None:
        self._reader.join(timeout)
        self.sending.join_writer(timeout)

    @property
    def closed(self) -> bool:
        return self.sending.closed


def refuse(sock: socket.socket, message: str) -> None:
    """Turn a new connection away with the documented answer: the server's
    preamble, then an ``unavailable`` error frame with id 0, then close.
    Never blocks for long: the socket is new, so its send buffer is empty.
    A TLS connection is only closed: its handshake would have to run here,
    on the acceptor, for a peer that may never finish it."""
    try:
        if isinstance(sock, ssl.SSLSocket):
            return
        sock.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            sock.recv(framing.PREAMBLE.size)  # read what came, so the close sends no reset
        sock.settimeout(0.5)
        frame = framing.encode({"id": 0, "error": {"code": "unavailable", "message": message}})
        framing.send_buffers(sock, [framing.preamble(), *frame])
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    finally:
        sock.close()

