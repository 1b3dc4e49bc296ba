"""The service process: hosts components on one port.

Start-up order, each step logged: take the data directory's LOCK (a second
server on the same directory is refused), remove a stale ready file, start
the flusher, recover every component, start their owner threads, and only
then open the listening socket and write the ready file (readiness.py).
Until that last step connection attempts are refused, so a client never
talks to a half-recovered server.

Stop (SIGTERM/SIGINT or :meth:`Server.stop`): remove the ready file, close
the listening socket, stop reading new requests, let components finish or
fail what is in flight, send the replies already produced (up to
``shutdown_grace_s``), close the connections, flush and close every
journal, release the LOCK.

Threads: an acceptor thread; per connection a reader and a writer thread
(connection.py); per component its own owner threads; the flusher. The
server's own state (the set of connections, counters) is guarded by
``_lock``.
"""

from __future__ import annotations

import logging
import resource
import signal
import socket
import threading
import time
from collections.abc import Iterable
from typing import Any

from common.journal import Flusher
from common.journal.lockfile import LockFile
from common.wire.budget import ByteBudget
from common.wire.component import Component, Request
from common.wire.errors import Internal, ServiceError, Unavailable, UnknownCommand
from shardmgr.store.service import StoreService
from workq.service import WorkqService

from . import readiness
from .config import ServerConfig
from .connection import Connection
from .control import Control

log = logging.getLogger(__name__)

SIGNAL_POLL_S = 0.2
"""Longest a SIGTERM or SIGINT waits before the main thread handles it."""


class Server:
    """Build with a config and the components to host; then run() or start()."""

    def __init__(self, config: ServerConfig, components: Iterable[Component] | None = None) -> None:
        """``components`` default to the product's: the work queue and the vector store."""
        self.config = config.validate()
        self.flusher = Flusher(config.flusher)
        if components is None:
            components = [WorkqService(config.data_dir, config.workq, self.flusher, config.max_frame_bytes),
                          StoreService(config.data_dir, config.store, self.flusher)]
        self.components: list[Component] = [Control(self), *components]
        self._routes: dict[str, Component] = {}
        for component in self.components:
            for cmd in component.commands():
                if cmd in self._routes:
                    raise ValueError(f"command {cmd!r} is served by both {self._routes[cmd].name} and {component.name}")
                self._routes[cmd] = component
        self.budget = ByteBudget(config.inflight_budget_bytes)  # shared by every connection's reader
        self._lock = threading.Lock()
        self._connections: set[Connection] = set()
        self._listener: socket.socket | None = None
        self._acceptor: threading.Thread | None = None
        self._lockfile = LockFile(config.data_dir)
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._metrics: Any = None
        self._wrote_ready_file = False
        self.started_at = time.time()
        self.counters = {"connections_total": 0, "connections_refused_total": 0, "requests_total": 0,
                         "errors_total": 0}

    # ------------------------------------------------------------------ life

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); valid after start()."""
        assert self._listener is not None, "the server is not listening"
        host, port = self._listener.getsockname()[:2]
        return host, port

    def start(self) -> None:
        """Lock, recover, listen, accept in the background. Returns when ready."""
        self.config.data_dir.mkdir(parents=True, exist_ok=True)
        self._lockfile.acquire()
        _raise_file_limit()
        try:
            if self.config.ready_file is not None:  # only now: while another server held the lock, it was its file
                readiness.remove(self.config.ready_file)
            self.flusher.start()
            for component in self.components:
                started = time.monotonic()
                log.info("recovering %s in %s ...", component.name, self.config.data_dir)
                component.recover()
                log.info("recovered %s in %.3f s", component.name, time.monotonic() - started)
            for component in self.components:
                component.start()
            self._listen()
            host, port = self.address
            if self.config.ready_file is not None:
                readiness.write(self.config.ready_file, host, port)
                self._wrote_ready_file = True
        except BaseException:
            self._shutdown()
            raise
        log.info("ready: listening on %s:%d (data %s)", host, port, self.config.data_dir)

    def _listen(self) -> None:
        listener = socket.create_server((self.config.host, self.config.port), backlog=512, reuse_port=False)
        self._listener = listener
        if self.config.metrics_port is not None:
            from .metrics import serve_metrics

            self._metrics = serve_metrics(self, self.config.host, self.config.metrics_port)
        self._acceptor = threading.Thread(target=self._accept_loop, name="acceptor", daemon=True)
        self._acceptor.start()

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT, then stop cleanly. Returns 0."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stopping.set())
        self.start()
        # Timed: a signal the kernel gave another thread is only handled when the main
        # thread next runs Python code, and an untimed wait would never return to it.
        while not self._stopping.wait(SIGNAL_POLL_S):
            pass
        log.info("stopping: signal received")
        self._shutdown()
        return 0

    def stop(self) -> None:
        """Stop from another thread (tests, embedding)."""
        self._stopping.set()
        self._shutdown()

    def _shutdown(self) -> None:
        with self._lock:
            if self._stopped.is_set():
                return
            self._stopped.set()
            self._stopping.set()
            connections = list(self._connections)
        if self._wrote_ready_file and self.config.ready_file is not None:
            try:
                readiness.remove(self.config.ready_file)
            except OSError as exc:  # the stop goes on: the data matters more than the marker
                log.warning("could not remove the ready file %s: %s", self.config.ready_file, exc)
        if self._listener is not None:
            self._listener.close()
        if self._metrics is not None:
            self._metrics.shutdown()
        for conn in connections:
            conn.stop_reading()
        for component in reversed(self.components):
            try:
                component.stop()
            except Exception:
                log.exception("stopping %s failed", component.name)
        deadline = time.monotonic() + self.config.shutdown_grace_s
        for conn in connections:
            conn.join(max(0.0, deadline - time.monotonic()))
            conn.close()
        self.flusher.stop()
        self._lockfile.release()
        log.info("stopped")

    # --------------------------------------------------------------- serving

    def _accept_loop(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stopping.is_set():
            try:
                sock, peer = listener.accept()
            except OSError:
                break  # the listener was closed: stopping
            name = f"{peer[0]}:{peer[1]}"
            conn = Connection(sock, name, self.config, self.dispatch, self._forget, self._count_error, self.budget)
            with self._lock:
                refused = len(self._connections) >= self.config.max_connections or self._stopping.is_set()
                if not refused:
                    self._connections.add(conn)
                    self.counters["connections_total"] += 1
                    conn.start()  # under the lock: a stop never finds a connection whose threads are not running
                else:
                    self.counters["connections_refused_total"] += 1
            if refused:
                log.warning("refusing %s: %d connections open", name, self.config.max_connections)
                sock.close()

    def _forget(self, conn: Connection) -> None:
        with self._lock:
            self._connections.discard(conn)
        for component in self.components:
            try:
                component.connection_closed(id(conn))
            except Exception:
                log.exception("%s failed to handle the close of %s", component.name, conn.peer)

    @property
    def command_names(self) -> list[str]:
        return sorted(self._routes)

    def dispatch(self, request: Request) -> None:
        """Route a request to its component (called on the connection's thread)."""
        with self._lock:
            self.counters["requests_total"] += 1
        component = self._routes.get(request.cmd)
        try:
            if self._stopping.is_set():
                raise Unavailable("the server is shutting down; retry on the restarted server")
            if component is None:
                raise UnknownCommand(f"unknown command {request.cmd!r}")
            component.handle(request)
        except ServiceError as exc:
            request.fail(exc)
        except Exception as exc:
            log.exception("%s failed on %r", component.name if component else "server", request.cmd)
            request.fail(Internal(f"{request.cmd}: internal error: {type(exc).__name__}: {exc}"))

    def _count_error(self, code: str) -> None:
        key = f"errors_{code.replace('.', '_')}_total"
        with self._lock:
            self.counters["errors_total"] += 1
            self.counters[key] = self.counters.get(key, 0) + 1

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, dict[str, float | int]]:
        """Per-component counters, plus the server's and the flusher's."""
        with self._lock:
            open_connections = len(self._connections)
            counters = dict(self.counters)
        flusher = self.flusher.stats
        result: dict[str, dict[str, float | int]] = {
            "server": {**counters, **self.budget.stats(), "connections_open": open_connections,
                       "uptime_seconds": round(time.time() - self.started_at, 3)},
            "flusher": {"rounds_total": flusher.rounds, "syncs_total": flusher.syncs,
                        "failures_total": flusher.failures,
                        "last_round_seconds": flusher.last_round_seconds,
                        "max_round_seconds": flusher.max_round_seconds},
        }
        for component in self.components:
            if component.name != "server":
                result[component.name] = component.stats()
        return result


def _raise_file_limit() -> None:
    """Raise the soft open-file limit to the hard one: every open segment,
    shard and connection holds descriptors, and the default soft limit
    (often 1024) is far below what a busy server needs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)
        else:
            log.info("open-file limit raised from %d to %d", soft, hard)
