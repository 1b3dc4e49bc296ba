"""The acceptor: the listening socket, and the connections it let in.

Admission: a new connection is turned away (connection.refuse: the
server's preamble and an ``unavailable`` goaway, or, under TLS, a plain
close) once the server is stopping or while ``max_connections`` are open.
Otherwise it is wrapped for TLS (the handshake runs later, on the
connection's own thread, under its timeout), its threads are started, and it
is kept until it closes (:meth:`Acceptor.forget`). A peer gone before its
wrap, or a connection whose threads cannot start (out of threads), is
closed and the acceptor lives on.

The send watchdog closes connections whose send has been blocked past
``send_timeout_s`` (the kernel's send timeout covers plain sockets, not TLS
ones).

Threads: the acceptor thread and the watchdog thread; any thread may call
:meth:`Acceptor.forget` and :meth:`Acceptor.connections`. ``_lock``
guards the set of connections and the counters, and a connection is added
and started under it after the stop flag was read under it: so a stop that
sets the flag, then takes :meth:`Acceptor.connections`, never misses a
connection, nor finds one whose threads are not running.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable

from common.wakeup import Wakeup

from .config import ServerConfig
from .connection import Connection, refuse

log = logging.getLogger(__name__)

WATCHDOG_S = 1.0
"""How often the send watchdog looks for blocked sends."""

BACKLOG = 512
"""Connections the kernel queues before the acceptor takes them."""


class Acceptor:
    """Accepts connections for one server; ``make(sock, peer)`` builds each.

    ``stopping`` is the server's stop flag (set: refuse everyone);
    ``stopped`` ends the watchdog."""

    def __init__(self, config: ServerConfig, tls: ssl.SSLContext | None,
                 make: Callable[[socket.socket, str], Connection], stopping: Wakeup,
                 stopped: threading.Event) -> None:
        self._config = config
        self._tls = tls
        self._make = make
        self._stopping = stopping
        self._stopped = stopped
        self._lock = threading.Lock()
        self._connections: set[Connection] = set()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None
        self._admitted = 0
        self._refused = 0

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); valid after bind()."""
        assert self._listener is not None, "the server is not listening"
        host, port = self._listener.getsockname()[:2]
        return host, port

    def bind(self) -> None:
        """Bind the configured address without listening: the port is taken
        (and known, for ``--port 0``) but a connection attempt is refused. An
        OSError naming the port if it cannot be bound."""
        if self._listener is None:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as socket.create_server does
                listener.bind((self._config.host, self._config.port))
            except OSError as exc:
                listener.close()
                raise OSError(f"cannot bind the service port {self._config.host}:{self._config.port}: "
                              f"{exc.strerror or exc} (is another process using it? give another --port)") from exc
            self._listener = listener

    def listen(self) -> None:
        """Start accepting on the bound address (binding it first if need be), and the watchdog."""
        self.bind()
        assert self._listener is not None
        self._listener.listen(BACKLOG)
        self._accept_thread = threading.Thread(target=self._accept_loop, name="acceptor", daemon=True)
        self._accept_thread.start()
        threading.Thread(target=self._watch_sends, name="send-watchdog", daemon=True).start()

    def stop(self, wait: float) -> None:
        """Close the listening socket (new connections are refused by the
        kernel from now on); wait up to ``wait`` seconds for the acceptor thread."""
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the acceptor (a close alone may not)
            self._listener.close()
        if self._accept_thread is not None:
            self._accept_thread.join(wait)

    def connections(self) -> list[Connection]:
        """The connections open now."""
        with self._lock:
            return list(self._connections)

    def forget(self, conn: Connection) -> None:
        """``conn`` has closed: it no longer counts against ``max_connections``."""
        with self._lock:
            self._connections.discard(conn)

    def stats(self) -> dict[str, int]:
        """Connections let in and turned away since the start, and open now."""
        with self._lock:
            return {"connections_total": self._admitted, "connections_refused_total": self._refused,
                    "connections_open": len(self._connections)}

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stopping.is_set():
            try:
                sock, peer = listener.accept()
            except OSError:
                break  # the listener was closed: stopping
            name = f"{peer[0]}:{peer[1]}"
            if self._tls is not None:  # the TLS handshake runs on the connection's thread, under its timeout
                try:
                    sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except OSError as exc:  # the peer is already gone; the acceptor must live on
                    log.info("closing %s before its TLS handshake: %s", name, exc)
                    sock.close()
                    continue
            self._admit(sock, name)

    def _admit(self, sock: socket.socket, name: str) -> None:
        """Start a connection on ``sock``, or turn it away (module docstring)."""
        conn = self._make(sock, name)
        with self._lock:
            refused = len(self._connections) >= self._config.max_connections or self._stopping.is_set()
            started = False
            if not refused:
                self._connections.add(conn)
                self._admitted += 1
                try:
                    conn.start()  # under the lock: a stop never finds a connection whose threads are not running
                    started = True
                except RuntimeError as exc:  # out of threads: this one is lost, the acceptor lives on
                    log.error("closing %s: cannot start its threads: %s", name, exc)
                    self._connections.discard(conn)
            else:
                self._refused += 1
        if not refused and not started:
            conn.close()
        if refused:
            stopping = self._stopping.is_set()
            limit = self._config.max_connections
            log.warning("refusing %s: %s", name, "stopping" if stopping else f"{limit} connections open")
            refuse(sock, "the server is stopping" if stopping else
                   f"the server has max_connections ({limit}) connections open; retry")

    def _watch_sends(self) -> None:
        """Close connections whose send has been blocked past ``send_timeout_s``."""
        while not self._stopped.wait(WATCHDOG_S):
            now = time.monotonic()
            for conn in self.connections():
                if conn.write_blocked_for(now) > self._config.send_timeout_s + WATCHDOG_S:
                    log.warning("closing %s: a send blocked for over %.0f s", conn.peer, self._config.send_timeout_s)
                    conn.close()
