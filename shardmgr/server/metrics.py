"""Prometheus metrics: the ``stats`` counters over HTTP (prometheus-client).

Off by default; ``--metrics-port`` (documented choice 7301) turns it on.
Every stats value becomes ``shardmgr_<component>_<name>``: a counter when
the name ends in ``_total``, a gauge otherwise. Values are read from
Server.stats() at scrape time, so they always agree with ``shardmgr stats``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from .server import Server


class StatsCollector:
    """A prometheus-client collector over Server.stats()."""

    def __init__(self, server: Server) -> None:
        self._server = server

    def collect(self) -> Iterator[Metric]:
        for component, values in self._server.stats().items():
            for key, value in values.items():
                name = re.sub(r"[^a-zA-Z0-9_]", "_", f"shardmgr_{component}_{key}")
                if key.endswith("_total"):
                    yield CounterMetricFamily(name[: -len("_total")], f"{component} {key}", value=value)
                else:
                    yield GaugeMetricFamily(name, f"{component} {key}", value=value)


def serve_metrics(server: Server, host: str, port: int) -> Any:
    """Start the HTTP endpoint in a background thread; returns the HTTP server
    (call ``.shutdown()`` to stop it)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatsCollector(server))
    http_server, _thread = start_http_server(port, addr=host, registry=registry)
    return http_server
