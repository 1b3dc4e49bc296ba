"""Cluster mode (issue 14, docs/cluster.md): a node shares sealed shards
through S3-compatible object storage and agrees through etcd on who is alive,
which collections exist, who writes each collection and which shards are
published. ``shardmgr serve --cluster`` runs a :class:`node.ClusterNode`.

Owns its configuration (``config``: ``ClusterConfig`` from ``etcd://`` and
``s3://`` URLs), its errors (``errors``: one root, ``ClusterError``), etcd
access (``kv``: one client per thread, keys, transactions, error
translation), prefix watches that resume after a dropped stream (``watch``),
a node's etcd lease kept alive by its own thread (``lease``), objects in the
bucket (``objects``: write-once puts, checksummed fetches), live members
(``membership``), one writer per collection (``election``), the shard map
(``shard_map``: publishes fenced by the writer's key, shard-id blocks per
tenure), the deletes and indexes of published shards (``extras``), the
collections (``catalog``), and a node's life: its writer roles (``roles``),
upload on seal (``uploader``), upload of later deletes and built indexes
(``extras_uploader``), retry pauses (``backoff``), the orphan sweep
(``sweep``), and joining, the store's write gate and its thread (``node``);
the deletes a node acknowledged, held until seen elsewhere (``acked_deletes``);
the writes a node may not make, forwarded to the writer (``forwarding``);
the client of a whole cluster, ``shardmgr.connect_cluster``
(``cluster_client``); what an operator sees: one snapshot of it all
(``status``), its live HTML page (``page``) and ``shardmgr cluster status``
(``commands``). ``loopback`` starts real etcd and SeaweedFS servers on
127.0.0.1 for tests and benchmarks.

Needs the ``cluster`` extra (boto3, etcd3gw); importing this package does not
import them, its modules do.

May import: ``common``, ``shardmgr.errors``, ``shardmgr.store`` and (the
commands) ``shardmgr.tables``; never
``shardmgr.server``, ``shardmgr.verification`` or ``workq``.
"""
