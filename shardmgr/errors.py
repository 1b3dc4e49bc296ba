"""The vector store's exceptions: one root, :class:`ShardmgrError`.

Each carries a stable ``shardmgr.*`` code that crosses the wire (see
docs/shardmgr.md); clients raise the same classes. ``DiskFull`` is the
shared ``disk_full`` of common.wire.errors (the queue answers it too).
"""

from __future__ import annotations

from common.wire.errors import BadRequest, Conflict, DiskFull, NotFound, ServiceError, Unavailable

__all__ = ["ShardmgrError", "UnknownCollection", "CollectionConflict", "BadName", "BadVectors", "UnknownRef",
           "RowDeleted", "NeedsReopen", "NoShardIds", "CannotVerify", "DiskFull"]


class ShardmgrError(ServiceError):
    """Root of every vector-store error."""

    code = "shardmgr.error"


class UnknownCollection(ShardmgrError, NotFound):
    """No collection has this name."""

    code = "shardmgr.unknown_collection"


class CollectionConflict(ShardmgrError, Conflict):
    """The collection exists with a different dimension, metric or index."""

    code = "shardmgr.collection_conflict"


class BadName(ShardmgrError, BadRequest):
    """A collection name is not 1-128 letters, digits, '.', '_' or '-' (not
    first). Nothing was written."""

    code = "shardmgr.bad_name"


class BadVectors(ShardmgrError, BadRequest):
    """Vectors, ids, queries or k are malformed; the message says how. Nothing was written."""

    code = "shardmgr.bad_vectors"


class UnknownRef(ShardmgrError, NotFound):
    """A ref names no stored row (never returned by append, or its shard is quarantined)."""

    code = "shardmgr.unknown_ref"


class RowDeleted(ShardmgrError, NotFound):
    """A ref names a row that was deleted (``delete``/``delete_ids``)."""

    code = "shardmgr.deleted"


class NeedsReopen(ShardmgrError):
    """A collection refuses writes until the store is reopened: a rewrite
    was committed on disk but could not be opened (too many open files, no
    memory); the next open finishes it."""

    code = "shardmgr.needs_reopen"


class NoShardIds(ShardmgrError, Unavailable):
    """Cluster mode: an append needed a new shard, and this node holds no
    shard id of the collection for it (it is not the collection's writer, or
    its reserved ids ran out and more are being reserved). Nothing was
    stored; retry (on the writer)."""

    code = "shardmgr.no_shard_ids"


class CannotVerify(ShardmgrError):
    """``verify`` could not run: no such directory, no permission, or
    (``--repair``) another process holds the directory."""

    code = "shardmgr.cannot_verify"
