"""One client connection on the server: a reader thread and a writer thread.

The reader thread does the handshake, reads frames and dispatches requests.
Replies produced on the reader thread are held until no complete request is
left in the read buffer, then written together with one sendmsg (pipelined
clients get many replies per syscall, and quick commands need no thread
switch). Replies from any other thread (component owner threads) go into
the outbox and the writer thread sends them, so an owner thread never
blocks on a socket. ``on_sent`` callbacks run after their frame's bytes were
written.

Bad bytes end the connection: the server sends an error frame with id 0
(``bad_frame``, ``frame_too_large``, ``unsupported_version``) and closes. A
client that stops reading is closed once its queued replies pass
``max_outbox_bytes`` or a send blocks for ``send_timeout_s``. A frame must
arrive whole within ``frame_timeout_s`` of its first byte (``frame_timeout``
error, then closed); the memory of frames still arriving is charged to the
server-wide ``budget`` (``max_inflight_bytes``) until the frame is dispatched.

Threads: ``_lock``/``_cond`` guard the outbox, ``_writing`` and ``_closed``.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from common.wire import framing
from common.wire.budget import ByteBudget
from common.wire.component import OnSent, Request
from common.wire.errors import BadFrame, BadRequest, ServiceError, UnsupportedVersion

from .config import ServerConfig

log = logging.getLogger(__name__)

HELD_REPLIES = 256
"""Replies the reader thread may hold back to send in one sendmsg."""

Dispatch = Callable[[Request], None]
CountError = Callable[[str], None]


class Connection:
    """Serves one socket until it closes. Build, then :meth:`start`."""

    def __init__(self, sock: socket.socket, peer: str, config: ServerConfig, dispatch: Dispatch,
                 on_close: Callable[[Connection], None], count_error: CountError,
                 budget: ByteBudget | None = None) -> None:
        self.peer = peer
        self.sock = sock
        self.requests = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self._config = config
        self._dispatch = dispatch
        self._on_close = on_close
        self._count_error = count_error
        self._budget = budget
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._outbox: collections.deque[tuple[list[bytes | memoryview], int, OnSent | None]] = collections.deque()
        self._outbox_bytes = 0
        self._writing = False  # some thread is inside sendmsg for this socket
        self._pending = 0  # requests dispatched and not yet answered
        self._held: list[tuple[list[bytes | memoryview], int, OnSent | None]] = []  # reader thread only
        self._reads_done = False
        self._closed = False
        self._reader = threading.Thread(target=self._read_loop, name=f"conn-read {peer}", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name=f"conn-write {peer}", daemon=True)

    def start(self) -> None:
        seconds = int(self._config.send_timeout_s)
        micros = int((self._config.send_timeout_s - seconds) * 1e6)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, micros))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        self._reader.start()
        self._writer.start()

    # ------------------------------------------------------------------ reading

    def _read_loop(self) -> None:
        reader = framing.FrameReader(self.sock, self._config.max_frame_bytes, budget=self._budget,
                                     frame_timeout_s=self._config.frame_timeout_s)
        try:
            if not self._handshake(reader):
                return
            while True:
                frame = reader.read()
                if frame is None:
                    break
                self.bytes_in += frame.size
                self._serve(frame)
                reader.release()  # dispatched: what it holds is the component's now
                if not reader.frame_buffered() or len(self._held) >= HELD_REPLIES:
                    self._flush_held()
        except BadFrame as exc:
            log.warning("closing %s: %s", self.peer, exc)
            self._count_error(exc.code)
            self._flush_held()
            self._send_now({"id": 0, "error": {"code": exc.code, "message": exc.message}})
            self.close()
        except OSError as exc:  # reset, timeout, or our own close()
            if not self._closed:
                log.info("connection %s ended: %s", self.peer, exc)
        except Exception:  # a bug: lose this connection, never the server
            log.exception("closing %s after an unexpected error", self.peer)
            self.close()
        finally:
            reader.release()
            self._flush_held()
            with self._cond:
                self._reads_done = True
                self._cond.notify_all()

    def _handshake(self, reader: framing.FrameReader) -> bool:
        self.sock.settimeout(self._config.handshake_timeout_s)
        data = reader.read_exact(framing.PREAMBLE.size)
        if data is None:
            return False
        try:
            version = framing.parse_preamble(data)
        except BadFrame as exc:  # not our protocol at all: no frame would be understood
            log.warning("closing %s: %s", self.peer, exc)
            self.close()
            return False
        self.sock.settimeout(None)
        self._send_now(framing.preamble())
        if version != framing.PROTOCOL_VERSION:
            raise UnsupportedVersion(f"client speaks protocol {version}; this server speaks "
                                     f"{framing.PROTOCOL_VERSION}")
        return True

    def _serve(self, frame: framing.Frame) -> None:
        header = frame.header
        request_id, cmd, args = header.get("id"), header.get("cmd"), header.get("args", {})
        if not isinstance(request_id, int) or isinstance(request_id, bool) or not 0 <= request_id < 2**63:
            raise BadFrame(f"request id must be an integer in [0, 2**63), got {request_id!r}")
        request = Request(request_id, cmd if isinstance(cmd, str) else "", args, frame.parts, self)
        self.requests += 1
        with self._cond:
            self._pending += 1
        if not isinstance(cmd, str) or not isinstance(args, dict):
            request.fail(BadRequest(f"request {request_id}: 'cmd' must be a string and 'args' a map"))
            return
        self._dispatch(request)

    # ------------------------------------------------------------------ writing

    def respond(self, header: dict[str, Any], parts: dict[str, np.ndarray] | None, on_sent: OnSent | None) -> None:
        """Queue or write a reply frame (any thread; never blocks non-reader threads)."""
        if "error" in header:
            self._count_error(header["error"]["code"])
        try:
            buffers = framing.encode(header, parts)
        except (TypeError, ValueError) as exc:  # a component built an unsendable reply
            log.exception("cannot encode reply %s to %s", header.get("id"), self.peer)
            error = ServiceError(f"reply could not be encoded: {exc}", code="internal")
            buffers = framing.encode({"id": header.get("id", 0), "error": {"code": error.code,
                                                                           "message": error.message}})
            on_sent = None
        size = sum(len(b) for b in buffers)
        if size - framing.FRAME_HEAD.size > self._config.max_frame_bytes:
            error = ServiceError(f"reply of {size} bytes exceeds max_frame_bytes", code="frame_too_large")
            buffers = framing.encode({"id": header.get("id", 0), "error": {"code": error.code,
                                                                           "message": error.message}})
            size, on_sent = sum(len(b) for b in buffers), None
        entry = (buffers, size, on_sent)
        if threading.current_thread() is self._reader:
            with self._cond:
                self._pending -= 1
            self._held.append(entry)  # sent by _flush_held, batched with its neighbours
            return
        with self._cond:
            self._pending -= 1
            if self._closed:
                return
            overflow = self._outbox_bytes + size > self._config.max_outbox_bytes
            if not overflow:
                self._outbox.append(entry)
                self._outbox_bytes += size
                self._cond.notify_all()
        if overflow:
            log.warning("closing %s: %d bytes of replies queued and not read", self.peer, self._outbox_bytes)
            self.close()

    def _flush_held(self) -> None:
        """Send the replies the reader produced (reader thread only)."""
        held, self._held = self._held, []
        if not held:
            return
        with self._cond:
            if self._closed:
                return
            direct = not self._outbox and not self._writing
            if direct:
                self._writing = True
            else:  # keep reply order simple: behind what is queued
                self._outbox.extend(held)
                self._outbox_bytes += sum(size for _, size, _ in held)
                self._cond.notify_all()
        if direct:
            self._write(held)

    def _send_now(self, data: bytes | dict[str, Any]) -> None:
        """Best-effort immediate write from the reader thread (handshake, errors)."""
        buffers: list[bytes | memoryview] = [data] if isinstance(data, bytes) else framing.encode(data)
        with contextlib.suppress(OSError):
            framing.send_buffers(self.sock, buffers)

    def _write(self, batch: list[tuple[list[bytes | memoryview], int, OnSent | None]]) -> None:
        """Send a batch (caller set ``_writing``); run callbacks; clear ``_writing``."""
        try:
            framing.send_buffers(self.sock, [b for buffers, _, _ in batch for b in buffers])
            self.bytes_out += sum(size for _, size, _ in batch)
            sent = True
        except OSError as exc:
            if not self._closed:
                log.info("closing %s: send failed: %s", self.peer, exc)
            sent = False
        with self._cond:
            self._writing = False
            if self._outbox or self._finished():
                self._cond.notify_all()
        if not sent:
            self.close()
            return
        for _, _, on_sent in batch:
            if on_sent is not None:
                try:
                    on_sent()
                except Exception:  # a callback bug must not kill the connection's writer
                    log.exception("on_sent callback failed for %s", self.peer)

    def _write_loop(self) -> None:
        """Send queued replies; end when closed, or when reads are done and
        every dispatched request has been answered and sent."""
        while True:
            with self._cond:
                while not self._closed and (self._writing or not self._outbox) and not self._finished():
                    self._cond.wait()
                if self._closed or not self._outbox:
                    break
                batch = list(self._outbox)
                self._outbox.clear()
                self._outbox_bytes = 0
                self._writing = True
            self._write(batch)
        self.close()

    def _finished(self) -> bool:
        return self._reads_done and not self._pending and not self._outbox and not self._writing

    # ------------------------------------------------------------------ closing

    def stop_reading(self) -> None:
        """Take no more requests; replies still being produced are sent."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RD)

    def close(self) -> None:
        """Close at once; queued replies are dropped (their on_sent never runs)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._outbox.clear()
            self._outbox_bytes = 0
            self._cond.notify_all()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._on_close(self)

    def join(self, timeout: float | None = None) -> None:
        self._reader.join(timeout)
        self._writer.join(timeout)

    @property
    def closed(self) -> bool:
        return self._closed
