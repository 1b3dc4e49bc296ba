"""Cluster mode (issue 14, docs/cluster.md): a node shares sealed shards
through S3-compatible object storage and agrees through etcd on who is alive,
which collections exist, who writes each collection and which shards are
published. ``shardmgr serve --cluster`` runs a :class:`node.ClusterNode`.

Rooms, from the bottom up (each subpackage's docstring lists its modules and
what it may import; tests/test_layers.py holds the rules):

- the base, here: configuration (``config``: ``ClusterConfig`` from
  ``etcd://`` and ``s3://`` URLs, ``NodeConfig``), errors (``errors``: one
  root, ``ClusterError``), the background threads' loop (``passes``), retry
  pauses (``backoff``) and pooled connections to other nodes (``peers``);
- ``state``: the shared state in etcd and the bucket (keys, leases,
  membership, the writer election, the catalog, the shard map, extras,
  node reports, objects);
- ``published``: the published shards this node holds (the mirror of the
  routing state, placement, the shard cache, merged and acknowledged
  deletes);
- ``writer``: a writer's duties (roles, upload on seal, extras, the sweep,
  take-over of shards it deletes in) and forwarded writes;
- ``query``: routing, fan-out, lookups and a node's part of a search;
- ``operations``: status, one shared read of it, and its page;
- ``testing``: the loopback etcd and SeaweedFS servers.

On top: a node's life (``node``: joining, the store's write gate, its
thread; it composes the rooms) and the client of a whole cluster,
``shardmgr.connect_cluster`` (``cluster_client``).

Exports (``__all__``, each loaded on first use): ``ClusterConfig``,
``NodeConfig``, ``EtcdSecurity``, ``ClusterError``, ``ClusterNode`` and
``ClusterClient``.

Needs the ``cluster`` extra (boto3, etcd3gw); importing this package, or its
configuration and errors, does not import them; the node and the client do.

May import: ``common``, ``shardmgr.errors`` and ``shardmgr.store``; never
``shardmgr.server``, ``shardmgr.verification``, ``shardmgr.cli`` or ``workq``
(``shardmgr cluster ...`` is shardmgr/cli/cluster.py).
"""

from typing import TYPE_CHECKING

from common import exports

if TYPE_CHECKING:
    from .cluster_client import ClusterClient
    from .config import ClusterConfig, EtcdSecurity, NodeConfig
    from .errors import ClusterError
    from .node import ClusterNode

__all__ = ["ClusterConfig", "NodeConfig", "EtcdSecurity", "ClusterError", "ClusterNode", "ClusterClient"]

__getattr__ = exports.lazy(__name__, {"ClusterConfig": "config", "NodeConfig": "config", "EtcdSecurity": "config",
                                      "ClusterError": "errors", "ClusterNode": "node",
                                      "ClusterClient": "cluster_client"})
