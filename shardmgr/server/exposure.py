"""Protected mode: which addresses the server may listen on without tokens.

Like Redis' protected mode: the service port and the metrics port may bind
a non-loopback address only if the server has a tokens file
(``auth_file``), or if the operator says ``insecure`` (then every start
logs a warning). A host name counts as loopback only if every address it
resolves to is a loopback address; ``""``, ``0.0.0.0`` and ``::`` are every
interface. What a start let through is logged as a warning at every start
(:func:`warn`): a service port without tokens or an etcd without TLS off
loopback (``--insecure``), a metrics port off loopback that checks no
tokens or leaves ``/metrics`` open.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from common.wire.hosts import is_loopback

if TYPE_CHECKING:
    from shardmgr.cluster.config import ClusterConfig

__all__ = ["Listening", "exposed", "is_loopback", "refusal", "warn"]

log = logging.getLogger(__name__)


def exposed(addresses: dict[str, str]) -> list[str]:
    """The ``name=host`` entries of ``addresses`` that are not loopback."""
    return [f"{name}={host!r}" for name, host in addresses.items() if not is_loopback(host)]


def refusal(addresses: dict[str, str], has_tokens: bool, insecure: bool) -> str | None:
    """Why the server must not start (None if it may)."""
    found = exposed(addresses)
    if not found or has_tokens or insecure:
        return None
    return (f"protected mode: refusing to listen on {', '.join(found)} (not loopback) without a tokens "
            f"file. Anyone who can reach the port could read, write and delete data. Create a token with "
            f"'shardmgr token create NAME --roles ...' and start with --auth-file FILE, or bind 127.0.0.1, "
            f"or pass --insecure to accept the risk (see docs/security.md)")


class Listening(Protocol):
    """What :func:`warn` reads of a server's configuration (ServerConfig has it; this module is below it)."""

    @property
    def listen_addresses(self) -> dict[str, str]: ...
    @property
    def metrics_host(self) -> str: ...
    @property
    def metrics_port(self) -> int | None: ...
    @property
    def metrics_open(self) -> bool: ...


def warn(config: Listening, has_tokens: bool, etcd: ClusterConfig | None) -> None:
    """Log a warning for each exposure ``config`` starts with (module docstring); ``etcd``: cluster mode's."""
    found = exposed(config.listen_addresses)
    if found and not has_tokens:
        log.warning("INSECURE: listening on %s (not loopback) without a tokens file: anyone who can reach "
                    "the port can read, write and delete data (--insecure; see docs/security.md)", ", ".join(found))
    if etcd is not None and not etcd.etcd_security.uses_tls and not is_loopback(etcd.etcd_host):
        log.warning("INSECURE: etcd at %s:%d (not loopback) without TLS: whoever can read or change that "
                    "traffic decides where writes are forwarded and searches go (--insecure; see "
                    "docs/security.md)", etcd.etcd_host, etcd.etcd_port)
    if config.metrics_port is not None and not is_loopback(config.metrics_host):
        if not has_tokens:
            log.warning("the metrics endpoint on %s:%s checks no tokens (no tokens file): it shows counters "
                        "and the cluster's pages to anyone who reaches it", config.metrics_host, config.metrics_port)
        elif config.metrics_open:
            log.warning("the metrics endpoint on %s:%s serves /metrics without a token (metrics_open): it "
                        "shows counters to anyone who reaches it", config.metrics_host, config.metrics_port)
