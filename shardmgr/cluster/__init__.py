"""Cluster mode's foundations (issue 14, docs/cluster.md): the pieces a node
uses to share sealed shards through S3-compatible object storage and to agree
through etcd on who is alive, who writes each collection and which shards are
published. The server does not use them yet.

Owns its configuration (``config``: ``ClusterConfig`` from ``etcd://`` and
``s3://`` URLs), its errors (``errors``: one root, ``ClusterError``), etcd
access (``kv``: one client per thread, keys, transactions, error
translation), prefix watches that resume after a dropped stream (``watch``),
a node's etcd lease kept alive by its own thread (``lease``), objects in the
bucket (``objects``: write-once puts, checksummed fetches), live members
(``membership``), one writer per collection (``election``) and the shard map
(``shard_map``: publishes fenced by the writer's key).

Needs the ``cluster`` extra (boto3, etcd3gw); importing this package does not
import them, its modules do.

May import: ``common``, ``shardmgr.errors`` and ``shardmgr.store``; never
``shardmgr.server``, ``shardmgr.verification`` or ``workq``.
"""
