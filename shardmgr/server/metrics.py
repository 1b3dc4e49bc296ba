"""The metrics port: Prometheus metrics, and in cluster mode the cluster's
status page (prometheus-client for the metrics, wsgiref for the server).

Off by default; ``--metrics-port`` (documented choice 7301) turns it on.
Every stats value becomes ``shardmgr_<component>_<name>``: a counter when
the name ends in ``_total``, a gauge otherwise. Values are read from
Server.stats() at scrape time, so they always agree with ``shardmgr stats``.
Every path but the two below answers with the metrics, as
prometheus-client's own app does (``/metrics`` by convention).

In cluster mode two more paths (docs/cluster.md, "Watching the cluster"):
``/cluster``, a self-contained HTML page that refreshes itself
(shardmgr/cluster/operations/page.py), and ``/cluster.json``, the status it shows
(shardmgr/cluster/operations/status.py), or 503 with ``{"error": ...}`` if etcd cannot
be read. The status is read on the HTTP request's own thread, at most once
a second whoever asks (``StatusCache``): it never holds anything the node's
store or its cluster thread use. Outside cluster mode they are 404.

With a tokens file every path needs a token allowed to read (``/metrics``
too unless ``metrics_open``): http_auth.py checks it before any of the above.

The port is bound at the server's start beside the service port, before a
cluster node takes its node id, and opened with it (bind_metrics, then
``serve()``). Each request has a thread of its own (daemon threads) and
HANDLER_TIMEOUT_S for each read and write of its socket; ``shutdown()``
stops the server within ~0.1 s and closes its socket.
"""

from __future__ import annotations

import json
import re
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .http_auth import HttpAuth, StartResponse, WsgiApp, answer

if TYPE_CHECKING:
    from shardmgr.cluster.config import ClusterConfig

    from .auth import Authenticator

#: the page loads nothing from anywhere else, and runs only its own inline script
PAGE_HEADERS = [("Cache-Control", "no-store"), ("X-Content-Type-Options", "nosniff"),
                ("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; "
                                            "style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'")]
POLL_S = 0.1
"""How often the server's loop looks for a shutdown."""
HANDLER_TIMEOUT_S = 30.0
"""Longest one read or write of a request's socket may block: a client that
sends nothing holds its thread no longer than that."""


class Counted(Protocol):
    """What the endpoint reads of the server it serves (Server is one; this module is below it)."""

    def stats(self) -> dict[str, dict[str, float | int]]: ...


class StatsCollector:
    """A prometheus-client collector over Server.stats()."""

    def __init__(self, server: Counted) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        for component, values in self._server.stats().items():
            for key, value in values.items():
                name = re.sub(r"[^a-zA-Z0-9_]", "_", f"shardmgr_{component}_{key}")
                if key.endswith("_total"):
                    yield CounterMetricFamily(name[: -len("_total")], f"{component} {key}", value=value)
                else:
                    yield GaugeMetricFamily(name, f"{component} {key}", value=value)


class ClusterPages:
    """``/cluster`` and ``/cluster.json`` of one cluster (module docstring)."""

    def __init__(self, config: ClusterConfig | None, replicas: int = 1) -> None:
        self._cache: Any = None
        self._page = b""
        if config is not None:
            from shardmgr.cluster.operations.page import PAGE
            from shardmgr.cluster.operations.status_cache import StatusCache

            self._cache = StatusCache(config, replicas=replicas)
            self._page = PAGE.encode()

    def __call__(self, path: str, start_response: StartResponse) -> Iterable[bytes]:
        if self._cache is None:
            return answer(start_response, "404 Not Found", "text/plain; charset=utf-8",
                           b"not in cluster mode: this node was started without --cluster\n")
        if path == "/cluster":
            return answer(start_response, "200 OK", "text/html; charset=utf-8", self._page, PAGE_HEADERS)
        from shardmgr.cluster.errors import ClusterError

        try:
            body, status = json.dumps(self._cache.get().as_dict()), "200 OK"
        except ClusterError as e:
            body, status = json.dumps({"error": str(e)}), "503 Service Unavailable"
        return answer(start_response, status, "application/json", body.encode(), [("Cache-Control", "no-store")])

    def close(self) -> None:
        if self._cache is not None:
            self._cache.close()


class _Quiet(WSGIRequestHandler):
    """No line per request on stderr; socket operations time out (HANDLER_TIMEOUT_S)."""

    timeout = HANDLER_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class MetricsServer(ThreadingMixIn, WSGIServer):
    """The endpoint's HTTP server: a thread per request; bound by bind_metrics, opened by ``serve()``;
    ``shutdown()`` also closes the socket and the pages."""

    daemon_threads = True
    pages: ClusterPages | None = None
    _serving = False

    def serve(self) -> None:
        """Listen on the bound port and answer requests in a background thread."""
        self.server_activate()
        threading.Thread(target=self.serve_forever, args=(POLL_S,), name="metrics-http", daemon=True).start()
        self._serving = True

    def shutdown(self) -> None:
        if self._serving:  # (socketserver's shutdown waits for a serve_forever that would never come)
            super().shutdown()
        self.server_close()
        if self.pages is not None:
            self.pages.close()


def bind_metrics(server: Counted, host: str, port: int, cluster: ClusterConfig | None = None, *,
                 replicas: int = 1, auth: Authenticator | None = None, metrics_open: bool = False,
                 count_error: Callable[[str], None] | None = None) -> MetricsServer:
    """The HTTP endpoint, bound to ``host``:``port`` but not listening yet
    (a connection attempt is refused until ``.serve()``; ``.shutdown()``
    releases it): so that a taken port ends a start before anything else
    opens. An OSError naming the port if it cannot be bound. With the
    cluster pages if ``cluster`` is given (owners shown: ``replicas`` per
    shard, the node's setting). With an ``auth`` that requires tokens, every
    path needs one (``/metrics`` not if ``metrics_open``); ``count_error``
    hears of each refusal ("unauthenticated", "forbidden")."""
    # the address family of host (IPv6 for "::1"), as prometheus-client's start_http_server finds it
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    server_class = type("MetricsServer", (MetricsServer,), {"address_family": family})
    http_server: MetricsServer = server_class((str(sockaddr[0]), port), _Quiet, bind_and_activate=False)
    try:
        http_server.server_bind()
    except OSError as exc:
        http_server.server_close()
        raise OSError(f"cannot bind the metrics port {host}:{port}: {exc.strerror or exc} (is another process "
                      f"using it? give another --metrics-port)") from exc
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(server))
    metrics = make_wsgi_app(registry)
    pages = ClusterPages(cluster, replicas)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/cluster", "/cluster.json"):
            return pages(path, start_response)
        scraped: Iterable[bytes] = metrics(environ, start_response)
        return scraped

    bound_port = http_server.server_address[1]
    gated: WsgiApp = HttpAuth(app, auth, port=bound_port, metrics_open=metrics_open, count_error=count_error) \
        if auth is not None and auth.required else app
    http_server.set_app(gated)
    http_server.pages = pages
    return http_server


def serve_metrics(server: Counted, host: str, port: int, cluster: ClusterConfig | None = None, *,
                  replicas: int = 1, auth: Authenticator | None = None, metrics_open: bool = False,
                  count_error: Callable[[str], None] | None = None) -> MetricsServer:
    """bind_metrics, then serve at once: the endpoint open (call ``.shutdown()`` to stop it)."""
    http_server = bind_metrics(server, host, port, cluster, replicas=replicas, auth=auth,
                               metrics_open=metrics_open, count_error=count_error)
    http_server.serve()
    return http_server
