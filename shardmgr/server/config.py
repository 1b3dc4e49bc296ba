"""The service's configuration: one frozen dataclass, defaults and units here.

The ``shardmgr serve`` options, the ``--config`` TOML file and the library
all read these fields; a TOML key is a field name, and command-line options
override the file, which overrides the defaults.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from common.journal import FlusherConfig
from common.units import GiB, MiB
from common.wire.framing import DEFAULT_MAX_FRAME_BYTES
from shardmgr.cluster.config import ClusterConfig, EtcdSecurity, NodeConfig, check_node_id
from shardmgr.store.config import StoreConfig
from workq.config import WorkqConfig

from . import exposure

ADVERTISE = re.compile(r"[A-Za-z0-9.:\[\]_-]+:[0-9]{1,5}")
"""``advertise``: HOST:PORT (a name, an IPv4 address, or an IPv6 one in brackets)."""

DEFAULT_PORT = 7300
SUGGESTED_METRICS_PORT = 7301


@dataclasses.dataclass(frozen=True, slots=True)
class ServerConfig:
    """Everything ``shardmgr serve`` needs. ``validate()`` checks it."""

    #: Data directory; created if missing. One server per directory (LOCK file).
    data_dir: Path = Path("data")
    #: Address to listen on. Loopback by default: expose it deliberately.
    host: str = "127.0.0.1"
    #: TCP port; 0 picks a free one (the log, the ready file and ``Server.address`` say which).
    port: int = DEFAULT_PORT
    #: If set, written (atomically, JSON ``{host, port, pid}``) once the port
    #: is open and removed on a clean stop; see server/readiness.py.
    ready_file: Path | None = None
    #: Group-commit interval of the shared flusher, in milliseconds.
    flush_interval_ms: float = 5.0
    #: Largest frame accepted or sent, in bytes.
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    #: Responses queued for one connection beyond which it is closed (a
    #: client that does not read), in bytes.
    max_outbox_bytes: int = 1024 * MiB
    #: Seconds a send may block on a full socket before the connection is closed.
    send_timeout_s: float = 60.0
    #: Seconds a new connection has to send its preamble.
    handshake_timeout_s: float = 10.0
    #: Connections beyond this are refused with an ``unavailable`` error.
    max_connections: int = 4096
    #: Seconds a clean stop (SIGTERM) may take: in-flight requests are
    #: answered and replies sent within it; what is left then is cut off.
    shutdown_timeout_s: float = 10.0
    #: Prometheus metrics HTTP port on ``metrics_host``; None (default) is off.
    #: The documented choice is 7301.
    metrics_port: int | None = None
    #: Python logging level name.
    log_level: str = "INFO"
    #: Bytes that frames still arriving may hold at once, over all connections
    #: (docs/architecture.md, "Memory and threads"). A frame that would pass it
    #: waits for its turn within ``frame_timeout_s``. At least 2 x
    #: ``max_frame_bytes``; None (default): min(1 GiB, physical RAM / 4), raised
    #: to 2 x ``max_frame_bytes`` if that is more (see ``inflight_budget_bytes``).
    max_inflight_bytes: int | None = None
    #: Seconds a frame has, from its first byte, to arrive whole (including
    #: any wait for ``max_inflight_bytes``); past it the connection is closed
    #: with a ``frame_timeout`` error. Idle time between frames is not limited.
    frame_timeout_s: float = 60.0
    #: Bytes of replies queued for sending at once, over all connections (a
    #: connection's own cap is ``max_outbox_bytes``). A connection whose reply
    #: would pass it is closed, as one over its own cap is: clients that ask
    #: for large replies and do not read them cannot hold the server's memory.
    #: At least ``max_frame_bytes``; None (default): as ``max_inflight_bytes``.
    max_outbox_total_bytes: int | None = None
    #: The work queue's settings (TOML table ``[workq]``).
    workq: WorkqConfig = WorkqConfig()
    #: The vector store's settings (TOML table ``[store]``).
    store: StoreConfig = StoreConfig()
    #: Tokens file (server/auth.py): when set, every connection must
    #: authenticate and each command needs a role. None: no tokens (loopback only).
    auth_file: Path | None = None
    #: Start on a non-loopback ``host``/``metrics_host`` without ``auth_file``
    #: (protected mode, server/exposure.py); a warning is logged at every start.
    insecure: bool = False
    #: Address of the metrics endpoint; loopback by default, under the same
    #: protected-mode rule as ``host``. With ``auth_file`` its every path needs
    #: a token with the read role (server/http_auth.py).
    metrics_host: str = "127.0.0.1"
    #: With ``auth_file``: serve ``/metrics`` without a token, for scrapers that
    #: cannot send one (the cluster pages still need one).
    metrics_open: bool = False
    #: PEM certificate chain and private key: when set, connections use TLS.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    #: PEM CA file: when set (with ``tls_cert``), clients must present a
    #: certificate signed by it (mutual TLS).
    tls_client_ca: Path | None = None
    #: Cluster mode (docs/cluster.md): ``etcd://HOST:PORT/PREFIX`` of the
    #: cluster to join. None (default): a single node, as without it.
    cluster: str | None = None
    #: ``s3://BUCKET/PREFIX`` where sealed shards go (required with ``cluster``).
    object_store: str | None = None
    #: The S3 endpoint URL (SeaweedFS, MinIO, ...); None: AWS's own. Credentials
    #: come from the environment (AWS_ACCESS_KEY_ID, ...), never from here.
    s3_endpoint: str | None = None
    #: This node's id in the cluster; None: ``<host name>-<hash of the data
    #: directory's path>``, the same at every start on one directory.
    node_id: str | None = None
    #: ``HOST:PORT`` other nodes and clients reach this node at; None: the
    #: address it listens on.
    advertise: str | None = None
    #: A cluster node's timings (TOML table ``[node]``).
    node: NodeConfig = NodeConfig()
    #: How the cluster's etcd is reached (cluster/config.py's EtcdSecurity says what each means):
    #: TLS, its CA, a client certificate and key, an etcd user and the file its password is in (else
    #: ``$SHARDMGR_ETCD_PASSWORD``; never the password itself). ``insecure`` also allows a non-loopback
    #: etcd without TLS.
    etcd_tls: bool = False
    etcd_ca: Path | None = None
    etcd_cert: Path | None = None
    etcd_key: Path | None = None
    etcd_user: str | None = None
    etcd_password_file: Path | None = None

    @property
    def flusher(self) -> FlusherConfig:
        """The shared flusher's configuration (``flush_interval_ms`` in seconds)."""
        return FlusherConfig(interval=self.flush_interval_ms / 1e3)

    @property
    def inflight_budget_bytes(self) -> int:
        """``max_inflight_bytes``, or its default for this machine when None."""
        if self.max_inflight_bytes is not None:
            return self.max_inflight_bytes
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return max(min(GiB, ram // 4), 2 * self.max_frame_bytes)

    @property
    def outbox_budget_bytes(self) -> int:
        """``max_outbox_total_bytes``, or when None the same as ``inflight_budget_bytes``."""
        if self.max_outbox_total_bytes is not None:
            return self.max_outbox_total_bytes
        return self.inflight_budget_bytes

    def validate(self) -> ServerConfig:
        """Return self, or raise ValueError naming the bad setting."""
        for name in ("port",) + (("metrics_port",) if self.metrics_port is not None else ()):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise ValueError(f"{name} must be in 0..65535, got {value}")
        if not 0.1 <= self.flush_interval_ms <= 60_000:
            raise ValueError(f"flush_interval_ms must be in 0.1..60000, got {self.flush_interval_ms}")
        if not 4096 <= self.max_frame_bytes <= 2**32 - 1:
            raise ValueError(f"max_frame_bytes must be in 4096..{2**32 - 1}, got {self.max_frame_bytes}")
        for name in ("send_timeout_s", "handshake_timeout_s", "shutdown_timeout_s", "frame_timeout_s"):
            if not 0 < getattr(self, name) < math.inf:  # also NaN
                raise ValueError(f"{name} must be a positive, finite number of seconds, got {getattr(self, name)}")
        if self.max_connections < 1 or self.max_outbox_bytes < self.max_frame_bytes:
            raise ValueError("max_connections must be >= 1 and max_outbox_bytes >= max_frame_bytes")
        if self.max_inflight_bytes is not None and self.max_inflight_bytes < 2 * self.max_frame_bytes:
            raise ValueError(f"max_inflight_bytes must be at least 2 x max_frame_bytes ({2 * self.max_frame_bytes}) "
                             f"so that a largest frame can always arrive, got {self.max_inflight_bytes}")
        if self.max_outbox_total_bytes is not None and self.max_outbox_total_bytes < self.max_frame_bytes:
            raise ValueError(f"max_outbox_total_bytes must be at least max_frame_bytes ({self.max_frame_bytes}), "
                             f"got {self.max_outbox_total_bytes}")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError(f"log_level must be a logging level name, got {self.log_level!r}")
        self.workq.validate().fitted_to_frame(self.max_frame_bytes)
        self.store.validate()
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("tls_client_ca needs tls_cert and tls_key (client certificates are a TLS feature)")
        self._validate_cluster()
        refusal = exposure.refusal(self.listen_addresses, self.auth_file is not None, self.insecure)
        if refusal is not None:
            raise ValueError(refusal)
        return self

    def cluster_config(self) -> ClusterConfig | None:
        """The cluster to join (``cluster``, ``object_store``, ``s3_endpoint``
        and the ``[node]`` timings), or None without ``cluster``."""
        if self.cluster is None and self.object_store is None:
            return None
        if self.cluster is None or self.object_store is None:
            raise ValueError("cluster and object_store go together: give both (--cluster etcd://HOST:PORT/PREFIX "
                             "--object-store s3://BUCKET/PREFIX) or neither")
        return ClusterConfig.from_urls(self.cluster, self.object_store, s3_endpoint=self.s3_endpoint,
                                       lease_ttl_s=self.node.lease_ttl_s, etcd_timeout_s=self.node.etcd_timeout_s,
                                       etcd_security=self.etcd_security)

    @property
    def etcd_security(self) -> EtcdSecurity:
        """The ``etcd_*`` settings, with ``insecure``."""
        return EtcdSecurity(tls=self.etcd_tls, ca=self.etcd_ca, cert=self.etcd_cert, key=self.etcd_key,
                            user=self.etcd_user, password_file=self.etcd_password_file, insecure=self.insecure)

    def _validate_cluster(self) -> None:
        self.node.validate()
        if self.cluster_config() is None and self.etcd_security != EtcdSecurity(insecure=self.insecure):
            raise ValueError("the etcd_* settings (--etcd-ca, --etcd-user, ...) are for cluster mode: give --cluster")
        if self.node_id is not None:
            check_node_id(self.node_id)
        if self.advertise is not None and not ADVERTISE.fullmatch(self.advertise):
            raise ValueError(f"advertise must be HOST:PORT, got {self.advertise!r}")

    @property
    def listen_addresses(self) -> dict[str, str]:
        """The addresses this configuration listens on, by setting name."""
        return {"host": self.host, **({"metrics_host": self.metrics_host} if self.metrics_port is not None else {})}

    @classmethod
    def load(cls, path: Path | None = None, **overrides: Any) -> ServerConfig:
        """Defaults, then the TOML file (if any), then non-None ``overrides``."""
        values: dict[str, Any] = {}
        if path is not None:
            with open(path, "rb") as f:
                values.update(tomllib.load(f))
        values.update({k: v for k, v in overrides.items() if v is not None})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown configuration keys: {', '.join(unknown)} (known: {', '.join(sorted(names))})")
        for name in ("data_dir", "ready_file", "auth_file", "tls_cert", "tls_key", "tls_client_ca", "etcd_ca",
                     "etcd_cert", "etcd_key", "etcd_password_file"):
            if name in values:
                values[name] = Path(values[name])
        for table, kind in (("workq", WorkqConfig), ("store", StoreConfig), ("node", NodeConfig)):
            if isinstance(values.get(table), dict):
                try:
                    values[table] = kind(**values[table])
                except TypeError as exc:
                    raise ValueError(f"[{table}]: {exc}") from None
        return cls(**values).validate()
