"""The sending side of a server connection: :class:`Sender`, which a
:class:`~shardmgr.server.connection.Connection` makes and owns.

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
:meth:`Sender._write`). When draining, the writer sends the goaway once
every reply is out.

The sender owns every piece of state about sending; the connection tells
it when a request is read (:meth:`Sender.expect_reply`), asks it to flush
what the reader holds, to send the preamble or an error frame, to drain,
and to shut (:meth:`Sender.shut`, then :meth:`Sender.await_write_end`)
when it closes; the sender asks the connection to close (``close``) when a
send fails or an outbox passes its caps.

Threads: the sender's ``_lock``/``_cond`` guard the outbox, ``_pending``,
``_writing`` (some thread is sending: one at a time, whoever claimed it;
``_quick`` while that is another thread's non-blocking send, which the
reader may wait for), ``_writer_started``, the handshake, draining and
closing flags; ``_held`` is the reader thread's, ``_batched`` is guarded by
the lock.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from common.wire import framing, reply_batch
from common.wire.budget import ByteBudget
from common.wire.component import OnSent
from common.wire.errors import ServiceError

from .config import ServerConfig
from .outbox import Entry, Outbox

log = logging.getLogger(__name__)

GOAWAY: Final = {"id": 0, "error": {"code": "unavailable",
                             "message": "the server is stopping: requests not answered were not applied; retry"}}
"""The last frame of a clean stop (docs/protocol.md)."""
QUICK_WAIT_S: Final = 0.005
"""How long the reader waits for another thread's non-blocking send before it queues its replies instead."""



class Sender:
    """Replies: holding, batching, the outbox, the writer thread, the goaway."""

    def __init__(self, sock: socket.socket, peer: str, config: ServerConfig, close: Callable[[], None],
                 count_error: Callable[[str], None], outbox_budget: ByteBudget | None = None) -> None:
        """``close``: closes the whole connection (a send failed, an outbox
        passed its caps); ``outbox_budget``: the server-wide bytes of queued replies."""
        self.peer = peer
        self.sock = sock
        self.bytes_out = 0
        self._config = config
        self._close = close
        self._count_error = count_error
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._outbox = Outbox(peer, config.max_outbox_bytes, outbox_budget)
        self._writing = False  # some thread is inside sendmsg for this socket
        self._quick = False  # ... and it is a non-blocking send (_flush_batched's), which ends at once
        self._pending = 0  # requests read whose replies are not yet in the outbox or sent
        self._held: list[Entry] = []  # reader thread only
        self._batched: list[Entry] = []  # other threads' replies
        self._handshaken = False  # our preamble is (being) sent
        self._draining = False
        self._goaway_sent = False  # decided: nothing but the goaway is written from now on
        self._goaway_written = False
        self._write_started = 0.0
        self._write_waiters = 0  # threads waiting for the write under way to end
        self._closed = False
        # Non-reader threads may try a non-blocking send themselves (not on TLS: no MSG_DONTWAIT there).
        self._plain = not isinstance(sock, ssl.SSLSocket)
        self._reader_ident = 0  # the reader thread's threading.get_ident() once it runs, else 0
        self._writer = threading.Thread(target=self._write_loop, name=f"conn-write {peer}", daemon=True)
        self._writer_started = False  # started on first need (_need_writer)

    # ------------------------------------------------------------ what the connection asks

    def reading_here(self) -> None:
        """The calling thread is the connection's reader: its replies are held (:meth:`flush_held`)."""
        self._reader_ident = threading.get_ident()

    def expect_reply(self) -> None:
        """A request was read: a reply to it is owed (a clean stop's goaway waits for it)."""
        with self._lock:
            self._pending += 1

    @property
    def held(self) -> int:
        """Replies the reader holds, not yet sent (reader thread only)."""
        return len(self._held)

    @property
    def closed(self) -> bool:
        return self._closed

    def send_preamble(self) -> bool:
        """Send the server's preamble (reader thread, at the handshake);
        False if a clean stop began first (then nothing is sent, and no
        request will be read)."""
        with self._lock:
            if self._goaway_sent:
                return False
            self._handshaken = True  # in one step with the claim: a goaway can only follow the preamble
            self._claim_writing()
        try:
            with contextlib.suppress(OSError):
                framing.send_buffers(self.sock, [framing.preamble()])
        finally:
            self._release_writing()
        return True

    def drain(self) -> bool:
        """Begin a clean stop: the goaway follows the last reply owed. False
        if no writer thread could be started (the caller closes)."""
        with self._lock:
            self._draining = True
            started = self._need_writer()  # it sends the goaway
            self._cond.notify_all()
        return started

    def wait_drained(self, timeout: float) -> bool:
        """Wait until the goaway was written (or the connection closed); False on timeout."""
        with self._lock:
            return self._cond.wait_for(lambda: self._goaway_written or self._closed, timeout)

    def wait_closed(self, timeout: float) -> bool:
        """Wait until the connection closed; False on timeout."""
        with self._lock:
            return self._cond.wait_for(lambda: self._closed, timeout)

    def write_blocked_for(self, now: float) -> float:
        """Seconds the send under way has been blocked (0 if none)."""
        with self._lock:
            return now - self._write_started if self._writing else 0.0

    def shut(self) -> bool:
        """Nothing more is sent: queued replies are dropped (their on_sent
        never runs) and their charge released. True for the first call."""
        with self._lock:
            first = not self._closed
            self._closed = True
            charged = self._outbox.clear()
            self._cond.notify_all()
        self._outbox.release(charged)
        return first

    def await_write_end(self, timeout: float) -> bool:
        """After :meth:`shut`: wait until no write is under way (a sent
        reply has had its on_sent run); False on timeout."""
        with self._lock:
            self._write_waiters += 1
            try:
                return self._cond.wait_for(lambda: not self._writing, timeout)
            finally:
                self._write_waiters -= 1

    def join_writer(self, timeout: float | None) -> None:
        with self._lock:
            started = self._writer_started
        if started:
            self._writer.join(timeout)

    # ------------------------------------------------------------ replies

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
            direct = self._plain and self._outbox.empty() and not self._writing
            if direct:
                self._claim_writing()
                self._quick = True  # a non-blocking send: the reader may wait for it (_flush_held)
            else:
                queued = self._queue(batch, sum(size for _, size, _ in batch))
        if direct:
            self._try_now(batch)
        elif not queued:
            self._close()

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
            self._close()
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
            self._close()

    def _queue(self, entries: list[Entry], size: int) -> bool:
        """Under the lock: add replies to the outbox (outbox.py) and see that
        the writer thread runs; False (the caller closes the connection) if
        the outbox is full or no writer can be started."""
        if not self._outbox.add(entries, size):
            return False
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

    def _queue_first(self, tail: list[Entry], size: int, before: list[Entry]) -> bool:
        """Under the lock: like :meth:`_queue`, ahead of what is queued (Outbox.add_first)."""
        if not self._outbox.add_first(tail, size, before):
            return False
        self._cond.notify_all()
        return self._need_writer()

    def flush_held(self) -> None:
        """Send the replies the reader produced (reader thread only)."""
        held, self._held = self._held, []
        if not held:
            return
        with self._lock:
            self._pending -= len(held)
            if self._closed or self._goaway_sent:
                self._cond.notify_all()
                return
            if self._writing and self._quick and self._outbox.empty():
                # Another thread's non-blocking send ends within microseconds: wait for it rather
                # than hand these replies to the writer thread (and start one): a client that
                # reads each reply before its next request would otherwise race for a writer.
                self._await_writer(QUICK_WAIT_S)
            direct = self._outbox.empty() and not self._writing
            if direct:
                self._claim_writing()
            else:  # keep reply order simple: behind what is queued
                queued = self._queue(held, sum(size for _, size, _ in held))
        if direct:
            self._write(held)
        elif not queued:
            self._close()

    def send_now(self, data: bytes | dict[str, Any]) -> None:
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
            if not self._outbox.empty() or self._draining or self._closed or self._write_waiters:
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
            self._close()

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
                while not self._closed and (self._writing or self._outbox.empty()) and not self._goaway_due():
                    self._cond.wait()
                if self._closed:
                    return
                goaway = self._goaway_due()
                if goaway:
                    self._goaway_sent = True  # under the lock: no preamble or error frame after this
                    if self._handshaken:
                        self._claim_writing()
                else:
                    batch, charged = self._outbox.take()
                    self._claim_writing()
            if goaway:  # (a break inside the with-block would not compile with mypyc)
                break
            self._write(batch)
            self._outbox.release(charged)
        if not self._handshaken:
            self._close()  # it never got a preamble: to its client this is a refused connection
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
        return (self._draining and not self._goaway_sent and not self._pending and self._outbox.empty()
                and not self._writing)

