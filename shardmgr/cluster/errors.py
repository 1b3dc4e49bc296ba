"""Cluster errors: one root, :class:`ClusterError` (a ShardmgrError, so a
handler of the store's errors catches these too).

Two families: ``CoordinationError`` (etcd: membership, leases, elections,
the shard map) and ``ObjectStoreError`` (the S3 bucket). An error caused by a
library or transport failure keeps it as ``__cause__`` (``raise ... from``);
messages name the endpoint and the key or object concerned. Errors a caller
may retry (the server was unreachable, a request timed out) also inherit
``Unavailable``.
"""

from __future__ import annotations

import re
import socket

from common.wire.errors import BadRequest, Conflict, NotFound, Unavailable
from shardmgr.errors import ShardmgrError

__all__ = ["ClusterError", "BadClusterConfig", "CoordinationError", "CoordinationUnavailable", "CoordinationDenied",
           "LeaseLost",
           "NotWriter", "WriterElsewhere", "WriterUnreachable", "ForwardDenied", "ShardConflict",
           "ObjectStoreError", "ObjectStoreUnavailable", "ObjectStoreDenied", "ObjectExists", "ObjectMissing",
           "ChecksumMismatch", "ShardsUnavailable", "DeletesBacklog", "WatchBehind", "writer_address"]


class ClusterError(ShardmgrError):
    """Root of every cluster-mode error."""

    code = "shardmgr.cluster"


class BadClusterConfig(ClusterError, BadRequest):
    """A cluster setting is malformed (a URL, a TTL, a timeout); the message says which."""

    code = "shardmgr.cluster.bad_config"


class CoordinationError(ClusterError):
    """etcd refused or failed a request."""

    code = "shardmgr.cluster.coordination"


class CoordinationUnavailable(CoordinationError, Unavailable):
    """etcd could not be reached or did not answer in time. Whether a write
    that timed out took effect is unknown: read before retrying it."""

    code = "shardmgr.cluster.coordination_unavailable"


class CoordinationDenied(CoordinationError):
    """etcd refused this client's credentials or its TLS: a wrong password
    or an unknown user, a certificate it does not accept (or none), a
    server certificate the CA does not vouch for, or a user whose roles do
    not cover the keys. Not retryable until the configuration is fixed;
    the message names the cause and never holds the password."""

    code = "shardmgr.cluster.coordination_denied"


class LeaseLost(CoordinationError):
    """This node's etcd lease expired (or may have: its keepalives failed
    for longer than the TTL). Every key under it is gone; the node holds no
    membership and no writer role until it takes a new lease."""

    code = "shardmgr.cluster.lease_lost"


class NotWriter(CoordinationError):
    """A shard-map change was refused: the collection's writer key no longer
    belongs to the fencing token the caller holds (its lease was lost, or it
    resigned, and maybe another node writes now). Nothing was changed."""

    code = "shardmgr.cluster.not_writer"


class WriterElsewhere(CoordinationError):
    """An append or delete reached a node that is not the collection's
    writer (another node holds the role); nothing was written. The message
    ends with ``writer_address=HOST:PORT`` (``unknown`` if the writer is not
    a member just now): the node to send it to. A node forwards such writes
    to the writer (forwarding.py); this reaches a client only for a request
    that was already forwarded once (the role moved meanwhile)."""

    code = "shardmgr.cluster.writer_elsewhere"

    @property
    def address(self) -> str | None:
        """The writer's address from the message, or None if unknown."""
        return writer_address(self.message)


class WriterUnreachable(ClusterError, Unavailable):
    """A node could not forward a write to the collection's writer (refused,
    timed out, the connection broke, or the writer is not a member just
    now). Retry. The message says whether the write may have applied (only
    if the forwarded request was sent and its answer lost: treat that as any
    lost reply) and ends with ``writer_address=HOST:PORT`` (or ``unknown``)."""

    code = "shardmgr.cluster.writer_unreachable"

    @property
    def address(self) -> str | None:
        """The writer's address from the message, or None if unknown."""
        return writer_address(self.message)


class ForwardDenied(ClusterError):
    """The writer refused the forwarding node's own credentials (no token,
    a wrong one, or one without the ``write`` role: see SHARDMGR_NODE_TOKEN
    in docs/cluster.md); nothing was written. Not retryable until the nodes'
    configuration is fixed."""

    code = "shardmgr.cluster.forward_denied"


class ShardConflict(CoordinationError, Conflict):
    """A shard id is already published with different contents; a published
    entry is never replaced."""

    code = "shardmgr.cluster.shard_conflict"


class ObjectStoreError(ClusterError):
    """The object store refused or failed a request."""

    code = "shardmgr.cluster.object_store"


class ObjectStoreUnavailable(ObjectStoreError, Unavailable):
    """The object store could not be reached or did not answer in time."""

    code = "shardmgr.cluster.object_store_unavailable"


class ObjectStoreDenied(ObjectStoreError):
    """The object store rejected the credentials or the request's
    permissions (no credentials found, a wrong key, access denied)."""

    code = "shardmgr.cluster.object_store_denied"


class ObjectExists(ObjectStoreError, Conflict):
    """A write-once put found the key already there; the stored object was
    not changed."""

    code = "shardmgr.cluster.object_exists"


class ObjectMissing(ObjectStoreError, NotFound):
    """No object (or no bucket) by this name."""

    code = "shardmgr.cluster.object_missing"


class ChecksumMismatch(ObjectStoreError):
    """An object's bytes do not match their recorded crc32c or size (damaged,
    replaced, or truncated in transit). Nothing was left at the destination."""

    code = "shardmgr.cluster.checksum_mismatch"


class ShardsUnavailable(ClusterError, Unavailable):
    """Rows were asked of shards no live node can serve now (their owners
    are fetching them, or their holder is down); the message names them.
    Nothing is wrong with the data: retry."""

    code = "shardmgr.cluster.shards_unavailable"



class DeletesBacklog(ClusterError, Unavailable):
    """A delete was refused before anything was written: the node holds
    ``max_held_deletes`` rows of acknowledged deletes that other nodes'
    searches may not skip yet (acked_deletes.py; the collection's writer has
    not published them, or no fresh copy serves them). Retry: they go once
    the writer publishes (about ``scan_interval_s``; longer while S3 fails)."""

    code = "shardmgr.cluster.deletes_backlog"


class WatchBehind(ClusterError, Unavailable):
    """A read that named the cluster state it needs (``after``: a revision
    another node's answer gave, cluster_client.py) reached a node whose
    watch had not reached it in time; nothing was read. Retry, on any node."""

    code = "shardmgr.cluster.watch_behind"

def writer_address(message: str) -> str | None:
    """The ``writer_address=HOST:PORT`` a message ends with, or None (absent or ``unknown``)."""
    found = re.search(r"writer_address=(\S+)$", message)
    return found.group(1) if found and found.group(1) != "unknown" else None


def transport_reason(e: BaseException, timeout_s: float) -> str:
    """Why a connection behind ``e`` failed, in a few words, from the
    innermost OSError among its causes ("connection refused", "no answer
    within 2 s", ...); else the innermost cause's own text."""
    found: BaseException = e
    innermost_os: OSError | None = None
    while True:
        if isinstance(found, OSError):
            innermost_os = found
        following = found.__cause__ or found.__context__
        if following is None:
            break
        found = following
    if isinstance(innermost_os, ConnectionRefusedError):
        return "connection refused"
    if isinstance(innermost_os, socket.gaierror):
        return f"cannot resolve the host name ({innermost_os.strerror})"
    if isinstance(innermost_os, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    if innermost_os is not None and innermost_os.strerror:
        return innermost_os.strerror.lower()
    return f"{type(found).__name__}: {found}" if found is not e else str(e)
