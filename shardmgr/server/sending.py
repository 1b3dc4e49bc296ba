"""The sending side of a server connection (a mixin of :class:`~shardmgr.server.connection.Connection`).

Replies made on the reader thread are held until no complete request is
left in the read buffer, then written together with one sendmsg. Replies
made on any other thread (a component's owner thread) are held until that
thread's batch of work ends (common/wire/reply_batch.py; at once outside
one), then sent by that thread with one non-blocking sendmsg when nothing
else is being written or queued; otherwise, and for what such a send
leaves over, they go into the outbox, which the writer thread sends. So an
owner thread never blocks on a socket. The writer thread is started the
first time a reply goes into the outbox or a clean stop begins: a
connection whose socket always takes its replies at once (most of them)
never has one, which halves the threads of many idle connections. ``on_sent`` callbacks run after
their reply's last byte was written, before the write is released (see
:meth:`Sending._write`). When draining, the writer sends the goaway once
every reply is out.

Threads: the connection's ``_lock``/``_cond`` guard the outbox,
``_pending``, ``_writing`` (some thread is sending: one at a time, whoever
claimed it; ``_quick`` while that is another thread's non-blocking send,
which the reader may wait for), ``_writer_started`` and the draining and
closing flags; ``_held`` is the reader
thread's, ``_batched`` is guarded by the lock.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from common.wire import framing, reply_batch
from common.wire.budget import ByteBudget
from common.wire.component import OnSent
from common.wire.errors import ServiceError

from .config import ServerConfig

log = logging.getLogger(__name__)

GOAWAY: Final = {"id": 0, "error": {"code": "unavailable",
                             "message": "the server is stopping: requests not answered were not applied; retry"}}
"""The last frame of a clean stop (docs/protocol.md)."""
QUICK_WAIT_S: Final = 0.005
"""How long the reader waits for another thread's non-blocking send before it queues its replies instead."""

Entry = tuple[list[bytes | memoryview], int, OnSent | None]
"""A reply ready to send: its buffers, their size, and what to run once they are written."""


class Sending:
    """Replies: holding, batching, the outbox, the writer thread, the goaway."""

    peer: str
    sock: socket.socket
    bytes_out: int
    _config: ServerConfig
    _lock: threading.Lock
    _cond: threading.Condition
    _outbox: collections.deque[Entry]
    _outbox_bytes: int
    _outbox_budget: ByteBudget | None
    _writing: bool
    _pending: int
    _held: list[Entry]
    _batched: list[Entry]
    _handshaken: bool
    _draining: bool
    _goaway_sent: bool
    _goaway_written: bool
    _write_started: float
    _write_waiters: int
    _closed: bool
    _plain: bool
    _reader_ident: int  # the reader thread's threading.get_ident() once it runs, else 0
    _writer: threading.Thread
    _writer_started: bool
    _quick: bool

    _count_error: Callable[[str], None]

    def close(self) -> None:
        raise NotImplementedError

    def respond(self, header: dict[str, Any], parts: framing.Body | None, on_sent: OnSent | None) -> None:
        """Queue or write a reply frame (any thread; never blocks non-reader threads)."""
        if "error" in header:
            self._count_error(header["error"]["code"])
        try:
            buffers = framing.encode(header, parts)
        except Exception as exc:  # a component built an unsendable reply (answered all the same: see _pending)
            log.exception("cannot encode reply %s to %s", header.get("id"), self.peer)
            error = ServiceError(f"reply could not be encoded: {exc}", code="internal")
            buffers = framing.encode({"id": header.get("id", 0), "error": {"code": error.code,
                                                                           "message": error.message}})
            on_sent = None
        size = sum(map(len, buffers))
        if size - framing.FRAME_HEAD.size > self._config.max_frame_bytes:
            error = ServiceError(f"reply of {size} bytes exceeds max_frame_bytes", code="frame_too_large")
            buffers = framing.encode({"id": header.get("id", 0), "error": {"code": error.code,
                                                                           "message": error.message}})
            size, on_sent = sum(len(b) for b in buffers), None
        entry = (buffers, size, on_sent)
        if threading.get_ident() == self._reader_ident:  # not current_thread(): Python code
            self._held.append(entry)  # sent by _flush_held, batched with its neighbours; pending until then
            return
        with self._lock:
            first = not self._batched
            self._batched.append(entry)
        # The first reply held registers the flush with this thread's batch (or, outside one, sends at
        # once); later ones wait for that flush (whoever registered it sends them all).
        if first and not reply_batch.hold(self, self._flush_batched):
            self._flush_batched()

    def _flush_batched(self) -> None:
        """Send the replies other threads made (see reply_batch): with one
        non-blocking sendmsg when the socket is idle (no switch to the
        writer thread), else through the outbox."""
        with self._lock:
            batch, self._batched = self._batched, []
            if not batch:
                return
            self._pending -= len(batch)
            if self._closed or self._goaway_sent:
                self._cond.notify_all()
                return
            direct = self._plain and not self._outbox and not self._writing
            if direct:
                self._claim_writing()
                self._quick = True  # a non-blocking send: the reader may wait for it (_flush_held)
            else:
                queued = self._queue(batch, sum(size for _, size, _ in batch))
        if direct:
            self._try_now(batch)
        elif not queued:
            self.close()

    def _try_now(self, batch: list[Entry]) -> None:
        """Send replies without blocking (caller claimed ``_writing``): one
        non-blocking sendmsg, which an idle socket takes whole. Each reply's
        ``on_sent`` runs once its last byte is out; what the socket did not
        take goes to the front of the outbox for the writer thread."""
        try:
            left = framing.send_some(self.sock, batch[0][0] if len(batch) == 1 else
                                     [b for buffers, _, _ in batch for b in buffers])
        except OSError as exc:
            log.info("closing %s: send failed: %s", self.peer, exc)
            self._release_writing()
            self.close()
            return
        if not left:  # the usual case: an idle socket took it all
            for _, size, on_sent in batch:
                self.bytes_out += size
                if on_sent is not None:
                    self._run_on_sent(on_sent)
            self._release_writing()
            return
        unsent = sum(v.nbytes for v in left)
        done = len(batch)
        while unsent and done:  # the replies at the end that are not wholly written
            done -= 1
            unsent -= min(unsent, batch[done][1])
        rest = sum(v.nbytes for v in left)
        self.bytes_out += sum(size for _, size, _ in batch) - rest
        for _, _, on_sent in batch[:done]:
            self._run_on_sent(on_sent)
        if not rest:
            self._release_writing()
            return
        # the rest of a reply begun, and the whole replies after it
        tail: Entry = (list[bytes | memoryview](left), rest, batch[-1][2])
        with self._lock:
            queued = self._queue_first([tail], rest, batch[done:-1])
        self._release_writing()
        if not queued:
            self.close()

    def _queue(self, entries: list[Entry], size: int) -> bool:
        """Under the lock: add replies to the outbox, charged to this
        connection's cap and to the server-wide budget; False (nothing
        queued, the caller closes the connection) if either would pass."""
        if self._outbox_bytes + size > self._config.max_outbox_bytes:
            log.warning("closing %s: %d bytes of replies queued and not read", self.peer, self._outbox_bytes)
            return False
        if self._outbox_budget is not None and not self._outbox_budget.try_acquire(size):
            log.warning("closing %s: its %d bytes of queued replies would pass the server's max_outbox_total_bytes",
                        self.peer, self._outbox_bytes + size)
            return False
        self._outbox.extend(entries)
        self._outbox_bytes += size
        self._cond.notify_all()
        return self._need_writer()  # False: the caller closes, which drops the outbox and its charge

    def _need_writer(self) -> bool:
        """Under the lock: start the writer thread unless it runs already
        (it waits for this lock before it looks at anything). False if no
        thread can be started (the process is at its thread limit): the
        caller closes the connection, whose replies could not be sent."""
        if self._writer_started or self._closed:
            return True
        try:
            self._writer.start()
        except RuntimeError as exc:
            log.error("closing %s: cannot start its writer thread: %s", self.peer, exc)
            return False
        self._writer_started = True
        return True

    def _queue_first(self, tail: list[Entry], size: int,
                     before: list[Entry]) -> bool:
        """Under the lock: like :meth:`_queue`, but ahead of what is queued
        (the rest of a batch begun: ``tail`` carries its bytes; the
        ``on_sent`` callbacks of the whole replies inside it, ``before``,
        run once it is written, in order)."""
        if not self._queue(tail, size):
            return False
        self._outbox.rotate(1)
        if before:
            buffers, rest, last = self._outbox[0]
            callbacks = [o for _, _, o in before if o is not None] + ([last] if last is not None else [])
            self._outbox[0] = (buffers, rest, _chained(callbacks) if callbacks else None)
        return True

    def _uncharge(self, size: int) -> None:
        if self._outbox_budget is not None and size:
            self._outbox_budget.release(size)

    def _flush_held(self) -> None:
        """Send the replies the reader produced (reader thread only)."""
        held, self._held = self._held, []
        if not held:
            return
        with self._lock:
            self._pending -= len(held)
            if self._closed or self._goaway_sent:
                self._cond.notify_all()
                return
            if self._writing and self._quick and not self._outbox:
                # Another thread's non-blocking send ends within microseconds: wait for it rather
                # than hand these replies to the writer thread (and start one): a client that
                # reads each reply before its next request would otherwise race for a writer.
                self._await_writer(QUICK_WAIT_S)
            direct = not self._outbox and not self._writing
            if direct:
                self._claim_writing()
            else:  # keep reply order simple: behind what is queued
                queued = self._queue(held, sum(size for _, size, _ in held))
        if direct:
            self._write(held)
        elif not queued:
            self.close()

    def _send_now(self, data: bytes | dict[str, Any]) -> None:
        """Best-effort immediate write of one frame (a connection error),
        never interleaved with another write, never after the goaway."""
        buffers: list[bytes | memoryview] = [data] if isinstance(data, bytes) else framing.encode(data)
        with self._lock:
            self._await_writer(self._config.send_timeout_s)
            if self._closed or self._writing or self._goaway_sent:
                return
            self._claim_writing()
        try:
            with contextlib.suppress(OSError):
                framing.send_buffers(self.sock, buffers)
        finally:
            self._release_writing()

    def _claim_writing(self) -> None:
        """Under the lock: this thread is the one sending (see :meth:`write_blocked_for`)."""
        self._writing = True
        self._write_started = time.monotonic()

    def _release_writing(self) -> None:
        with self._lock:
            self._writing = False
            self._quick = False
            # Wake only who can use it: waking the idle writer after every
            # reply the reader wrote itself costs a thread switch per request.
            if self._outbox or self._draining or self._closed or self._write_waiters:
                self._cond.notify_all()

    def _await_writer(self, timeout: float) -> bool:
        """Under the lock: wait until no write is under way (or closed); False on timeout."""
        self._write_waiters += 1
        try:
            return self._cond.wait_for(lambda: not self._writing or self._closed, timeout)
        finally:
            self._write_waiters -= 1

    def _write(self, batch: list[Entry]) -> None:
        """Send a batch (caller claimed ``_writing``); run callbacks; release ``_writing``.

        The batch goes out in runs, each ending with a reply that has an
        ``on_sent``, which runs as soon as that reply's last byte is written:
        a send that fails later in the batch cannot undo it. The callbacks
        run before ``_writing`` is released, and :meth:`close` waits for
        that: a client may read a reply and close before this thread runs
        its callback, and its close must not undo the reply's ``on_sent``
        (which would hand its results out again)."""
        run: list[bytes | memoryview] = []
        sent = True
        for index, (buffers, size, on_sent) in enumerate(batch):
            run.extend(buffers)
            self.bytes_out += size
            if on_sent is None and index < len(batch) - 1:
                continue
            try:
                framing.send_buffers(self.sock, run)
            except OSError as exc:
                if not self._closed:
                    log.info("closing %s: send failed: %s", self.peer, exc)
                sent = False
                break
            run = []
            self._run_on_sent(on_sent)
        self._release_writing()
        if not sent:
            self.close()

    def _run_on_sent(self, on_sent: OnSent | None) -> None:
        if on_sent is not None:
            try:
                on_sent()
            except Exception:  # a callback bug must not kill the connection's writer
                log.exception("on_sent callback failed for %s", self.peer)

    def _write_loop(self) -> None:
        """Send queued replies until the connection closes; when draining,
        send the goaway once every reply is out."""
        while True:
            with self._lock:
                while not self._closed and (self._writing or not self._outbox) and not self._goaway_due():
                    self._cond.wait()
                if self._closed:
                    return
                goaway = self._goaway_due()
                if goaway:
                    self._goaway_sent = True  # under the lock: no preamble or error frame after this
                    if self._handshaken:
                        self._claim_writing()
                else:
                    batch = list(self._outbox)
                    charged, self._outbox_bytes = self._outbox_bytes, 0
                    self._outbox.clear()
                    self._claim_writing()
            if goaway:  # (a break inside the with-block would not compile with mypyc)
                break
            self._write(batch)
            self._uncharge(charged)
        if not self._handshaken:
            self.close()  # it never got a preamble: to its client this is a refused connection
            return
        try:
            with contextlib.suppress(OSError):
                framing.send_buffers(self.sock, framing.encode(GOAWAY))
                # socket.socket's shutdown, not SSLSocket's: that one also drops the TLS state,
                # and what the client still sends could no longer be read.
                socket.socket.shutdown(self.sock, socket.SHUT_WR)
        finally:
            with self._lock:
                self._goaway_written = True
            self._release_writing()

    def _goaway_due(self) -> bool:
        return (self._draining and not self._goaway_sent and not self._pending and not self._outbox
                and not self._writing)


def _chained(callbacks: list[OnSent]) -> OnSent:
    """One on_sent that runs several in order."""

    def run() -> None:
        for callback in callbacks:
            callback()

    return run
