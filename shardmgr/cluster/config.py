"""Cluster configuration: frozen dataclasses, defaults and units here.

:class:`ClusterConfig` (where etcd and the bucket are) is built from the two
URLs of ``shardmgr serve --cluster etcd://HOST:PORT/PREFIX --object-store
s3://BUCKET/PREFIX`` by :meth:`ClusterConfig.from_urls`; :class:`NodeConfig`
(the ``[node]`` table of the server's TOML file) holds a node's timings;
:class:`EtcdSecurity` how etcd is reached (TLS, a user). S3 credentials are
not part of it: boto3's standard chain finds them (``AWS_ACCESS_KEY_ID``/
``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, the shared credentials file,
instance roles), and etcd's password comes from a file or
``SHARDMGR_ETCD_PASSWORD``, so no secret is ever in a config file, a repr
or a command line.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

from common.wire import tls
from common.wire.hosts import is_loopback
from shardmgr.cluster.errors import BadClusterConfig

#: etcd's smallest effective lease TTL: a 1 s lease still lives ~2.3 s (anchor)
MIN_LEASE_TTL_S = 2
#: key prefixes and object prefixes: path segments of these characters
PATH = re.compile(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*")
#: node ids: like collection names
NODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: S3 bucket names (the portable subset: no dots, so path and virtual-host styles both work)
BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
#: the environment variable etcd's password is read from when no password file is given
ETCD_PASSWORD_ENV = "SHARDMGR_ETCD_PASSWORD"


@dataclasses.dataclass(frozen=True, slots=True)
class EtcdSecurity:
    """How etcd is reached: TLS (on when ``tls``, ``ca`` or ``cert`` is set)
    and an etcd user. ``validate(host)`` checks it, protected mode included.

    The password is never a field a file or a command line sets: it is
    read, at each authentication (so a rotated file is picked up), from
    ``password`` (the library's argument, left out of the repr), else
    ``password_file`` (its first line), else ``$SHARDMGR_ETCD_PASSWORD``."""

    #: speak TLS to etcd, checking its certificate against the default CAs (``ca`` or ``cert`` imply it)
    tls: bool = False
    #: PEM CA file etcd's certificate (and its host name) is checked against
    ca: Path | None = None
    #: PEM client certificate and key, for an etcd started with ``--client-cert-auth`` (mutual TLS)
    cert: Path | None = None
    key: Path | None = None
    #: the etcd user to authenticate as (etcd with auth enabled); None: no authentication
    user: str | None = None
    #: a file whose first line is the user's password
    password_file: Path | None = None
    #: the password itself (library use); never shown
    password: str | None = dataclasses.field(default=None, repr=False)
    #: allow a non-loopback etcd over plain HTTP (protected mode; the server logs a warning at each start)
    insecure: bool = False

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.ca is not None or self.cert is not None

    @property
    def scheme(self) -> str:
        return "https" if self.uses_tls else "http"

    def read_password(self) -> str:
        """The user's password now (class docstring); BadClusterConfig if there is none."""
        if self.password is not None:
            return self.password
        if self.password_file is not None:
            try:
                with open(self.password_file, encoding="utf-8") as f:
                    found = f.readline().rstrip("\r\n")
            except (OSError, UnicodeDecodeError) as e:
                raise BadClusterConfig(f"cannot read etcd's password file {self.password_file}: "
                                       f"{getattr(e, 'strerror', None) or type(e).__name__}") from e
            if not found:
                raise BadClusterConfig(f"etcd's password file {self.password_file} is empty")
            return found
        found = os.environ.get(ETCD_PASSWORD_ENV, "")
        if not found:
            raise BadClusterConfig(f"etcd user {self.user!r} needs a password: give a password file "
                                   f"(--etcd-password-file) or set ${ETCD_PASSWORD_ENV}")
        return found

    def validate(self, host: str) -> EtcdSecurity:
        """This config, if its files load and it may talk to etcd at ``host``; else BadClusterConfig."""
        if (self.cert is None) != (self.key is None):
            raise BadClusterConfig("etcd's client certificate and key go together: give both or neither")
        if self.uses_tls:
            try:  # loaded once here so that a bad file is one clear line at start, not a failure later
                tls.client_context(self.ca, self.cert, self.key)
            except ValueError as e:
                raise BadClusterConfig(f"etcd TLS: {e}") from e
        if self.user is not None:
            if not self.user or any(c.isspace() for c in self.user):
                raise BadClusterConfig(f"etcd user name must be non-empty, without spaces, got {self.user!r}")
            self.read_password()
        elif self.password is not None or self.password_file is not None:
            raise BadClusterConfig("an etcd password needs an etcd user (--etcd-user)")
        if not self.uses_tls and not self.insecure and not is_loopback(host):
            raise BadClusterConfig(
                f"protected mode: refusing to talk to etcd at {host!r} (not loopback) without TLS. Whoever can "
                f"read or change that traffic decides where writes are forwarded and searches go, and sees the "
                f"etcd password. Give --etcd-ca (with --etcd-cert/--etcd-key for an etcd that wants client "
                f"certificates), or pass --insecure to accept the risk (see docs/security.md)")
        return self


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Where the cluster's etcd and bucket are, and its timings. ``validate()`` checks them."""

    #: etcd's client endpoint (its HTTP/JSON gateway: the same port as gRPC)
    etcd_host: str
    etcd_port: int
    #: every key of this cluster starts with this ("/prod"); clusters sharing an etcd differ here
    key_prefix: str
    #: the bucket holding sealed shards, and the prefix of every object key ("" for none; no slashes at the ends)
    bucket: str
    object_prefix: str = ""
    #: S3 endpoint URL (SeaweedFS, MinIO, ...); None: AWS's own, from the region
    s3_endpoint: str | None = None
    s3_region: str = "us-east-1"
    #: a node's etcd lease, in whole seconds (etcd's unit); keepalives every third of it
    lease_ttl_s: int = 10
    #: one etcd request's timeout; below the lease TTL so a hung keepalive cannot outlive the lease
    etcd_timeout_s: float = 2.0
    #: S3 timeouts per request, and attempts per request (botocore's "standard" retries)
    s3_connect_timeout_s: float = 5.0
    s3_read_timeout_s: float = 60.0
    s3_max_attempts: int = 3
    #: files at least this large are uploaded in parts of multipart_chunk_bytes, this many at once
    multipart_threshold_bytes: int = 64 << 20
    multipart_chunk_bytes: int = 16 << 20
    transfer_concurrency: int = 4
    #: how etcd is reached: TLS, client certificate, user (EtcdSecurity)
    etcd_security: EtcdSecurity = EtcdSecurity()

    @classmethod
    def from_urls(cls, cluster: str, object_store: str, **fields: object) -> ClusterConfig:
        """``cluster`` = ``etcd://HOST[:PORT]/PREFIX`` (port 2379 by default),
        ``object_store`` = ``s3://BUCKET[/PREFIX]``; ``fields`` set the rest.
        Raises BadClusterConfig naming what is wrong."""
        host, port, key_prefix = parse_etcd_url(cluster)
        bucket, object_prefix = parse_s3_url(object_store)
        try:
            config = cls(etcd_host=host, etcd_port=port, key_prefix=key_prefix, bucket=bucket,
                         object_prefix=object_prefix, **fields)  # type: ignore[arg-type]
        except TypeError as e:  # an unknown field name
            raise BadClusterConfig(f"cluster settings: {e}") from e
        return config.validate()

    @property
    def etcd_url(self) -> str:
        return f"etcd://{self.etcd_host}:{self.etcd_port}{self.key_prefix}"

    @property
    def s3_url(self) -> str:
        return f"s3://{self.bucket}/{self.object_prefix}".rstrip("/")

    def key(self, *parts: str) -> str:
        """The etcd key ``<key_prefix>/<part>/<part>...``."""
        return "/".join((self.key_prefix, *parts))

    def object_key(self, *parts: str) -> str:
        """The object key ``<object_prefix>/<part>/<part>...`` (no leading slash)."""
        return "/".join(p for p in (self.object_prefix, *parts) if p)

    def validate(self) -> ClusterConfig:
        """This config, if every field is sane; else BadClusterConfig naming the field."""
        if not self.etcd_host or not 0 < self.etcd_port < 65536:
            raise BadClusterConfig(f"etcd endpoint must be host:port, got {self.etcd_host!r}:{self.etcd_port}")
        self.etcd_security.validate(self.etcd_host)
        if not self.key_prefix.startswith("/") or not PATH.fullmatch(self.key_prefix[1:]):
            raise BadClusterConfig(f"key_prefix must be '/' and path segments of letters, digits, '.', '_', '-', "
                                   f"got {self.key_prefix!r}")
        if not BUCKET.fullmatch(self.bucket):
            raise BadClusterConfig(f"bucket must be 3-63 lowercase letters, digits or '-', got {self.bucket!r}")
        if self.object_prefix and not PATH.fullmatch(self.object_prefix):
            raise BadClusterConfig(f"object prefix must be path segments of letters, digits, '.', '_', '-', "
                                   f"got {self.object_prefix!r}")
        if not isinstance(self.lease_ttl_s, int) or self.lease_ttl_s < MIN_LEASE_TTL_S:
            raise BadClusterConfig(f"lease_ttl_s must be a whole number of seconds >= {MIN_LEASE_TTL_S} "
                                   f"(etcd's minimum), got {self.lease_ttl_s!r}")
        if not 0 < self.etcd_timeout_s < self.lease_ttl_s:  # also NaN
            raise BadClusterConfig(f"etcd_timeout_s must be > 0 and below lease_ttl_s ({self.lease_ttl_s}), "
                                   f"got {self.etcd_timeout_s}")
        for name in ("s3_connect_timeout_s", "s3_read_timeout_s"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise BadClusterConfig(f"{name} must be a positive, finite number of seconds, got {value}")
        for name in ("s3_max_attempts", "transfer_concurrency"):
            if getattr(self, name) < 1:
                raise BadClusterConfig(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.multipart_chunk_bytes < 5 << 20 or self.multipart_threshold_bytes < self.multipart_chunk_bytes:
            raise BadClusterConfig("multipart_chunk_bytes must be >= 5 MiB (S3's smallest part) and "
                                   f"multipart_threshold_bytes at least that, got {self.multipart_chunk_bytes} "
                                   f"and {self.multipart_threshold_bytes}")
        return self


def check_node_id(node_id: str) -> str:
    """``node_id`` if it is 1-128 letters, digits, '.', '_' or '-' (not first); else BadClusterConfig."""
    if not isinstance(node_id, str) or not NODE_ID.fullmatch(node_id):
        raise BadClusterConfig(f"node id must be 1-128 letters, digits, '.', '_' or '-' (not first), got {node_id!r}")
    return node_id


def parse_etcd_url(url: str) -> tuple[str, int, str]:
    """``etcd://HOST[:PORT]/PREFIX`` -> (host, port, "/PREFIX"). The prefix is required:
    it is what keeps two clusters on one etcd apart."""
    parts = urlsplit(url)
    try:
        port = parts.port or 2379
    except ValueError as e:
        raise BadClusterConfig(f"bad port in cluster URL {url!r}") from e
    prefix = parts.path.rstrip("/")
    if parts.scheme != "etcd" or not parts.hostname or parts.query or parts.fragment or not PATH.fullmatch(prefix[1:]):
        raise BadClusterConfig(f"cluster URL must be etcd://HOST[:PORT]/PREFIX (prefix of letters, digits, '.', "
                               f"'_', '-' and '/'), got {url!r}")
    return parts.hostname, port, prefix


def parse_s3_url(url: str) -> tuple[str, str]:
    """``s3://BUCKET[/PREFIX]`` -> (bucket, "PREFIX") with no slashes at the prefix's ends."""
    parts = urlsplit(url)
    prefix = parts.path.strip("/")
    if (parts.scheme != "s3" or not BUCKET.fullmatch(parts.netloc) or parts.query or parts.fragment
            or (prefix and not PATH.fullmatch(prefix))):
        raise BadClusterConfig(f"object store URL must be s3://BUCKET[/PREFIX] (bucket of 3-63 lowercase letters, "
                               f"digits or '-'), got {url!r}")
    return parts.netloc, prefix


MAX_HELD_DELETES = 16_000_000
"""The largest ``max_held_deletes``: 128 MiB of refs, half of the default frame (docs/protocol.md)."""


@dataclasses.dataclass(frozen=True, slots=True)
class NodeConfig:
    """A cluster node's timings (``shardmgr serve``'s ``[node]`` table). ``validate()`` checks them."""

    #: the node's etcd lease, in whole seconds: a dead node's member and writer keys go this long after it
    lease_ttl_s: int = 10
    #: one etcd request's timeout (below the TTL)
    etcd_timeout_s: float = 2.0
    #: how often the node's thread looks for work besides being woken (a seal wakes it at once)
    scan_interval_s: float = 5.0
    #: a failed upload or publish is retried after this, doubling up to upload_retry_max_s
    upload_retry_min_s: float = 1.0
    upload_retry_max_s: float = 60.0
    #: the orphan sweep: at the start of each writer tenure and every sweep_interval_s; it removes only
    #: objects older than sweep_grace_s (which must exceed clock skew between the nodes and S3)
    sweep_interval_s: float = 600.0
    sweep_grace_s: float = 3600.0
    #: shard ids a writer reserves in etcd at a time (a new block when half is used)
    shard_id_block: int = 64
    #: at start, how long to wait for a previous run's member key (same node id) to expire
    join_timeout_s: float = 30.0
    #: how many live nodes serve each published shard (rendezvous owners; the same on every node)
    replicas: int = 1
    #: a cached shard no longer this node's is dropped this long after (searches routed earlier finish)
    cache_linger_s: float = 30.0
    #: a clean stop of a writer seals and publishes its shards for at most this long before leaving
    hand_off_s: float = 30.0
    #: a write forwarded to the collection's writer waits this long for its answer (plus an allowance for
    #: its bytes, as a client's append does), and this long at most to connect
    forward_timeout_s: float = 30.0
    #: forwards use TLS when set: the PEM CA file the writer's certificate is checked against (its host name too)
    forward_ca: str | None = None
    #: the PEM certificate and key a node presents when forwarding, to writers that require one (mutual TLS)
    forward_cert: str | None = None
    forward_key: str | None = None
    #: how often the node's report (its rows not yet published, its failing uploads: report.py) is
    #: rebuilt, and written if it changed; so its counts lag the node by at most this (plus one etcd write)
    report_interval_s: float = 1.0
    #: the report of a node that has not been a member for this long is removed (until then the status
    #: lists the node as gone, with what it held)
    gone_keep_s: float = 86400.0
    #: rows of acknowledged deletes a node holds, at most, until other nodes' searches skip them
    #: (acked_deletes.py: 8 bytes each, sent with each search to the nodes asked for their shards); a
    #: delete past it is refused (deletes_backlog, retryable). Keep it x 8 bytes well below the
    #: servers' max_frame_bytes (256 MiB: 33 M rows)
    max_held_deletes: int = 4_000_000

    def validate(self) -> NodeConfig:
        """This config, if every field is sane; else BadClusterConfig naming the field."""
        if not isinstance(self.lease_ttl_s, int) or self.lease_ttl_s < MIN_LEASE_TTL_S:
            raise BadClusterConfig(f"lease_ttl_s must be a whole number of seconds >= {MIN_LEASE_TTL_S}, "
                                   f"got {self.lease_ttl_s!r}")
        for name in ("etcd_timeout_s", "scan_interval_s", "upload_retry_min_s", "upload_retry_max_s",
                     "sweep_interval_s", "join_timeout_s", "hand_off_s",
                     "forward_timeout_s", "report_interval_s", "gone_keep_s"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise BadClusterConfig(f"{name} must be a positive, finite number of seconds, got {value}")
        if not 0 <= self.sweep_grace_s < math.inf or self.upload_retry_max_s < self.upload_retry_min_s:
            raise BadClusterConfig("sweep_grace_s must be >= 0 and upload_retry_max_s >= upload_retry_min_s, got "
                                   f"{self.sweep_grace_s} and {self.upload_retry_max_s}")
        if (self.forward_cert is None) != (self.forward_key is None):
            raise BadClusterConfig("forward_cert and forward_key go together: give both or neither")
        if not isinstance(self.shard_id_block, int) or not 2 <= self.shard_id_block <= 1 << 16:
            raise BadClusterConfig(f"shard_id_block must be in 2..65536, got {self.shard_id_block!r}")
        if not isinstance(self.replicas, int) or not 1 <= self.replicas <= 16:
            raise BadClusterConfig(f"replicas must be in 1..16, got {self.replicas!r}")
        if not 0 <= self.cache_linger_s < math.inf:
            raise BadClusterConfig(f"cache_linger_s must be >= 0 seconds, got {self.cache_linger_s}")
        if not isinstance(self.max_held_deletes, int) or not 1 <= self.max_held_deletes <= MAX_HELD_DELETES:
            raise BadClusterConfig(f"max_held_deletes must be a number of rows in 1..{MAX_HELD_DELETES}, "
                                   f"got {self.max_held_deletes!r}")
        return self
