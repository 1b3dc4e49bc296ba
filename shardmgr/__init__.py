"""shardmgr: append-only vector shards searched with faiss, and the service
that hosts them with the work queue.

Embedded::

    store = shardmgr.open("data")
    store.create_collection("docs", dim=768, metric="ip")
    refs = store.append("docs", vectors, ids, durable=True)
    scores, ids, refs = store.search("docs", queries, k=10)

Over the network (``shardmgr serve``)::

    client = shardmgr.connect("127.0.0.1:7300")
    client = shardmgr.connect_cluster("etcd://127.0.0.1:2379/prod")  # any node of a cluster

The package: ``store/`` (the vector store, which runs embedded without any
server), ``server/`` (``shardmgr serve``, the host of the store and the work
queue), ``verification/`` (``shardmgr verify``), ``cluster/`` (cluster
mode: S3 objects, etcd coordination, a node's life; ``serve --cluster``), ``cli/`` (the
command line: every command and what it prints; nothing imports it), ``errors.py`` (one
root, ShardmgrError), ``shadowing.py`` (imported first: is ``common`` the
project's?). docs/architecture.md maps them.

May import: ``common`` and ``workq``; ``store`` imports neither ``server``,
``verification`` nor ``workq``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import shadowing  # noqa: F401 - first: is 'common' the project's?

__version__ = "0.1.0"

__all__ = ["__version__", "open", "verify", "snapshot", "connect", "connect_cluster"]

if TYPE_CHECKING:
    from common.journal import FlusherConfig
    from shardmgr.cluster.cluster_client import ClusterClient
    from shardmgr.store.client import StoreClient
    from shardmgr.store.config import StoreConfig
    from shardmgr.store.store import Store
    from shardmgr.verification.report import Report


def open(data_dir: str | Path, config: StoreConfig | None = None, *,  # noqa: A001 - the public name is fixed
         flusher: FlusherConfig | None = None, **fields: Any) -> Store:
    """Open (and recover) the vector store in ``data_dir``, with the typed
    configuration ``shardmgr serve`` uses: ``config`` (default StoreConfig())
    with ``fields`` replacing its fields, and the group-commit schedule of
    the store's own flusher (default FlusherConfig()). With a ServerConfig
    ``cfg``: ``shardmgr.open(cfg.data_dir, cfg.store, flusher=cfg.flusher)``."""
    from shardmgr.store.config import StoreConfig
    from shardmgr.store.store import Store

    return Store(data_dir, dataclasses.replace(config or StoreConfig(), **fields), flusher=flusher).open()


def verify(data_dir: str | Path, *, deep: bool = False, repair: bool = False) -> Report:
    """Check every file of a data directory (``shardmgr verify``): see
    shardmgr/verification/ and docs/verify.md. Raises CannotVerify if it cannot run."""
    from shardmgr.verification.runner import verify as run

    return run(data_dir, deep=deep, repair=repair)


def snapshot(data_dir: str | Path, dest: str | Path) -> dict[str, Any]:
    """Copy a data directory no server has open to the new directory
    ``dest``, at one durable point (shardmgr/snapshots.py; against a running
    server: ``shardmgr snapshot DEST``). Returns what it did."""
    from shardmgr.snapshots import snapshot as run

    return run(data_dir, dest)


def connect(address: str, **options: Any) -> StoreClient:
    """A client of a ``shardmgr serve`` process at ``host:port``."""
    from shardmgr.store.client import StoreClient

    return StoreClient(address, **options)


def connect_cluster(url: str, **options: Any) -> ClusterClient:
    """A client of the cluster at ``etcd://HOST:PORT/PREFIX`` (cluster mode,
    docs/cluster.md): StoreClient's methods; it finds the live nodes in etcd,
    moves to another when one fails, and sends writes to each collection's
    writer. ``options``: ``prefer``, ``attempts``, ``etcd_timeout_s``,
    ``etcd_security`` (an EtcdSecurity from shardmgr.cluster.config: etcd's
    TLS and user, docs/security.md), and those of StoreClient (timeout,
    token, tls, ...). Needs the cluster extra."""
    from shardmgr.cluster.cluster_client import ClusterClient

    return ClusterClient(url, **options)
