"""The service process: hosts components on one port.

Start-up order, each step logged: take the data directory's LOCK (a second
server on the same directory is refused), remove a stale ready file, start
the flusher, recover every component, start their owner threads, bind the
port and the metrics port (neither listening yet: a taken one ends the
start here), in cluster mode take the node id and check the object store
(shardmgr/cluster/node.py), and only then open the listening socket (and
the metrics port) and write the ready file (readiness.py).
Until then connection attempts are refused, so a client never talks to a
half-recovered server, nor to a node whose id another process holds.

Stop (SIGTERM/SIGINT or :meth:`Server.stop`), all within
``shutdown_timeout_s``: remove the ready file and stop accepting; from now
on every request read is answered ``unavailable`` without being applied.
Components answer their waiting calls (:meth:`Component.quiesce`). Each
connection writes its remaining replies (so results written to a consumer
are marked delivered), then a goaway frame (connection.py); the clients
close. Then the connections are closed, every component stops (the queue
records the delivered marks and flushes), the flusher makes the rest
durable and the LOCK is released. A second SIGTERM/SIGINT during the stop
exits at once with status 1, as a SIGKILL would, after one bounded attempt
to flush what was written (a help against a power cut soon after, not a
promise: only acknowledged durable writes are promised).

Threads: an acceptor thread and a send watchdog (acceptor.py, which keeps
the set of connections); per connection a reader thread, and a writer thread once a reply
has had to wait (connection.py); per component its own owner threads; the flusher. The
server's own counters and the stop flags are guarded by ``_lock``.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final

from common.journal import Flusher
from common.journal.lockfile import LockFile
from common.wakeup import Wakeup
from common.wire import tls
from common.wire.budget import ByteBudget
from common.wire.component import Component, Request
from common.wire.errors import Forbidden, Internal, ServiceError, Unavailable, UnknownCommand
from shardmgr.store.service import StoreService
from workq.service import WorkqService

from . import exposure, readiness
from .acceptor import Acceptor
from .auth import COMMAND_ROLES, OPEN, Authenticator, Principal
from .config import ServerConfig
from .connection import Connection
from .control import Control

log = logging.getLogger(__name__)

SIGNAL_POLL_S: Final = 0.2
"""Longest a SIGTERM or SIGINT waits before the main thread handles it."""

LINGER_S: Final = 1.0
"""At a stop, how long connections that got their goaway have to close
before the server closes them (closing first could reset, and so lose,
a goaway still in flight)."""

EXIT_INTERRUPTED: Final = 1
"""Exit status after a second signal cut a stop short."""


class Server:
    """Build with a config and the components to host; then run() or start()."""

    def __init__(self, config: ServerConfig, components: Iterable[Component] | None = None) -> None:
        """``components`` default to the product's: the work queue and the vector store."""
        self.config = config.validate()
        #: Checks tokens; AuthFileError (a ValueError naming the line) for a bad tokens file.
        self.auth = Authenticator(config.auth_file)
        self._tls: ssl.SSLContext | None = None
        if config.tls_cert is not None and config.tls_key is not None:
            self._tls = tls.server_context(config.tls_cert, config.tls_key, config.tls_client_ca)
        self.flusher = Flusher(config.flusher)
        cluster = config.cluster_config()
        node = _cluster_module() if cluster is not None else None
        if components is None:
            store = config.store if node is None else node.cluster_store_config(config.store)
            components = [WorkqService(config.data_dir, config.workq, self.flusher, config.max_frame_bytes),
                          StoreService(config.data_dir, store, self.flusher)]
        self.components: list[Component] = [Control(self), *components]
        #: cluster mode's node (shardmgr/cluster/node.py), or None: start/join/stop/stats are its only hooks here
        self.cluster: Any = None
        if node is not None:
            services = [c for c in self.components if isinstance(c, StoreService)]
            if not services:
                raise ValueError("cluster mode needs the vector store among the components")
            self.cluster = node.ClusterNode(cluster, config.node, services[0].store,
                                            config.node_id or node.default_node_id(config.data_dir))
            services[0].router = self.cluster.query  # searches and gets go across the cluster
            services[0].forwarder = self.cluster.forwarder  # writes go to their writer
        self._routes: dict[str, Component] = {}
        for component in self.components:
            for cmd in component.commands():
                if cmd in self._routes:
                    raise ValueError(f"command {cmd!r} is served by both {self._routes[cmd].name} and {component.name}")
                self._routes[cmd] = component
        self.budget = ByteBudget(config.inflight_budget_bytes)  # shared by every connection's reader
        self.outbox_budget = ByteBudget(config.outbox_budget_bytes, "outbox")  # ... and by their outboxes
        self._lock = threading.Lock()
        self._lockfile = LockFile(config.data_dir)
        self._stopping = Wakeup()  # is_set() on every dispatch: compiled (common/wakeup.py)
        # what run()'s main thread sleeps on: a threading.Event, Python code, because a signal the
        # kernel gave another thread is handled only when the main thread next runs Python code
        # (a compiled sleep never would); set with _stopping (_request_stop)
        self._main_wake = threading.Event()
        self._stopped = threading.Event()  # a stop has begun
        self._acceptor = Acceptor(config, self._tls, self._connection, self._stopping, self._stopped)
        self._finished = threading.Event()  # ... and ended
        self._metrics: Any = None
        self._wrote_ready_file = False
        self.started_at = time.time()
        self.counters = {"requests_total": 0, "errors_total": 0, "errors_unauthenticated_total": 0,
                         "errors_forbidden_total": 0, "errors_tls_handshake_total": 0}

    # ------------------------------------------------------------------ life

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); valid after start()."""
        return self._acceptor.address

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
            self._acceptor.bind()  # the port is known, connections still refused
            self._bind_metrics()  # ... and the metrics port: a taken one ends the start before the node id is held
            host, port = self.address
            if self.cluster is not None:  # the node id is held before any port opens
                self.cluster.start(self.config.advertise or f"{host}:{port}")
            self._listen()
            if self.cluster is not None:
                self.cluster.join()
            if self.config.ready_file is not None:
                readiness.write(self.config.ready_file, host, port)
                self._wrote_ready_file = True
        except BaseException:
            self._shutdown()
            raise
        exposure.warn(self.config, self.auth.required, self.cluster.config if self.cluster is not None else None)
        log.info("ready: listening on %s:%d (data %s%s%s)", host, port, self.config.data_dir,
                 ", TLS" if self._tls is not None else "", ", tokens required" if self.auth.required else "")

    def _bind_metrics(self) -> None:
        if self.config.metrics_port is not None:
            from .metrics import bind_metrics

            self._metrics = bind_metrics(self, self.config.metrics_host, self.config.metrics_port,
                                         self.cluster.config if self.cluster is not None else None,
                                         replicas=self.config.node.replicas, auth=self.auth,
                                         metrics_open=self.config.metrics_open, count_error=self._count_error)

    def _listen(self) -> None:
        self._acceptor.listen()
        if self._metrics is not None:
            self._metrics.serve()

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT, then stop cleanly and return 0. A
        second signal during the stop flushes and exits at once (status 1)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        self.start()
        # Timed: a signal the kernel gave another thread is only handled when the main
        # thread next runs Python code, and an untimed wait would never return to it.
        while not self._stopping.is_set():
            self._main_wake.wait(SIGNAL_POLL_S)
        log.info("stopping: signal received")
        self._shutdown()
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        if not self._stopping.is_set():
            self._request_stop()
            return
        # Logging and flushing take locks the interrupted main thread may hold:
        # another thread does them, and the exit does not wait for it for long.
        last = threading.Thread(target=self._last_flush, args=(signum,), name="last-flush", daemon=True)
        last.start()
        last.join(3.0)
        os._exit(EXIT_INTERRUPTED)

    def _last_flush(self, signum: int) -> None:
        log.warning("stopping now: second signal %d; flushing what was written", signum)
        try:
            self.flusher.flush_now(timeout=2.0)
        except Exception as exc:  # exiting anyway: the log says what was not flushed
            log.error("the last flush failed: %s", exc)
        logging.shutdown()

    def stop(self) -> None:
        """Stop from another thread (tests, embedding)."""
        self._request_stop()
        self._shutdown()

    def _request_stop(self) -> None:
        self._stopping.set()
        self._main_wake.set()

    def _shutdown(self) -> None:
        """Stop in the order the module docstring gives; a second caller
        returns once the first has finished."""
        with self._lock:
            first = not self._stopped.is_set()
            self._stopped.set()
            self._request_stop()
        if not first:
            while not self._finished.wait(SIGNAL_POLL_S):
                pass
            return
        try:
            self._stop_in_order(time.monotonic() + self.config.shutdown_timeout_s)
        finally:
            self._finished.set()

    def _stop_in_order(self, deadline: float) -> None:
        self._stop_accepting()
        connections = self._acceptor.connections()
        for conn in connections:
            conn.drain()
        for component in self.components:
            self._guarded(component, component.quiesce)
        drained = sum(_polled(conn.wait_drained, deadline) for conn in connections)
        if drained < len(connections):
            log.warning("stop: %d of %d connections still had replies to send after %.1f s; closing them",
                        len(connections) - drained, len(connections), self.config.shutdown_timeout_s)
        linger = min(deadline, time.monotonic() + LINGER_S)
        for conn in connections:
            _polled(conn.wait_closed, linger)
            conn.close()  # returns once a write under way has ended and run its on_sent
        if self.cluster is not None:  # resign, leave, revoke: before the store closes under its thread
            try:
                self.cluster.stop()
            except Exception:
                log.exception("cluster: leaving failed during the stop")
        for component in reversed(self.components):
            self._guarded(component, component.stop)
        self.flusher.stop()
        self._lockfile.release()
        log.info("stopped")

    def _stop_accepting(self) -> None:
        if self._wrote_ready_file and self.config.ready_file is not None:
            try:
                readiness.remove(self.config.ready_file)
            except OSError as exc:  # the stop goes on: the data matters more than the marker
                log.warning("could not remove the ready file %s: %s", self.config.ready_file, exc)
        self._acceptor.stop(SIGNAL_POLL_S)
        if self._metrics is not None:
            self._metrics.shutdown()

    @staticmethod
    def _guarded(component: Component, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception:
            log.exception("%s: %s failed during the stop", component.name, step.__name__)

    # --------------------------------------------------------------- serving

    def _connection(self, sock: socket.socket, peer: str) -> Connection:
        """A connection, not started, for the acceptor to admit."""
        return Connection(sock, peer, self.config, self.dispatch, self._forget, self._count_error, self.auth,
                          budget=self.budget, outbox_budget=self.outbox_budget)

    def _forget(self, conn: Connection) -> None:
        """``conn`` closed: the acceptor and every component forget it."""
        self._acceptor.forget(conn)
        for component in self.components:
            try:
                component.connection_closed(id(conn))
            except Exception:
                log.exception("%s failed to handle the close of %s", component.name, conn.peer)

    @property
    def command_names(self) -> list[str]:
        return sorted(self._routes)

    def dispatch(self, request: Request, principal: Principal = OPEN) -> None:
        """Route a request to its component if ``principal`` may run it
        (called on the connection's thread)."""
        with self._lock:
            self.counters["requests_total"] += 1
        component = self._routes.get(request.cmd)
        try:
            if self._stopping.is_set():
                raise Unavailable("the server is shutting down; retry on the restarted server")
            if component is None:
                raise UnknownCommand(f"unknown command {request.cmd!r}")
            if not principal.may(request.cmd):
                needs = COMMAND_ROLES.get(request.cmd, "admin")
                raise Forbidden(f"{request.cmd} needs role {needs!r}{' (or admin)' if needs != 'admin' else ''}; "
                                f"token {principal.name!r} has {', '.join(sorted(principal.roles))}")
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
            counters = dict(self.counters)
        accepted = self._acceptor.stats()
        open_connections = accepted.pop("connections_open")
        flusher = self.flusher.stats
        result: dict[str, dict[str, float | int]] = {
            "server": {**accepted, **counters, **self.budget.stats(), **self.outbox_budget.stats(),
                       "connections_open": open_connections,
                       "uptime_seconds": round(time.time() - self.started_at, 3)},
            "flusher": {"rounds_total": flusher.rounds, "rounds_here_total": flusher.here,
                        "syncs_total": flusher.syncs,
                        "failures_total": flusher.failures,
                        "last_round_seconds": flusher.last_round_seconds,
                        "max_round_seconds": flusher.max_round_seconds},
        }
        for component in self.components:
            if component.name != "server":
                result[component.name] = component.stats()
        if self.cluster is not None:
            result["cluster"] = self.cluster.stats()
        return result


def _cluster_module() -> Any:
    """shardmgr.cluster.node, imported only in cluster mode (it needs the cluster extra)."""
    try:
        from shardmgr.cluster import node
    except ImportError as exc:
        raise ValueError(f"cluster mode needs the cluster extra (pip install 'shardmgr[cluster]'): {exc}") from exc
    return node


def _polled(wait: Callable[[float], bool], deadline: float) -> bool:
    """Call ``wait(seconds)`` in slices of at most SIGNAL_POLL_S until it is
    true or ``deadline`` has passed (then once more without waiting): the
    main thread stays free to handle a second signal, and the whole stop
    stays within its deadline however many connections there are."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return wait(0.0)
        if wait(min(SIGNAL_POLL_S, left)):
            return True


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
