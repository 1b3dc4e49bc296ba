"""The cluster's shared state: what every node reads and writes in etcd and
in the bucket, each kind of key or object with its rules and its codec.

etcd access (``kv``: one client per thread, typed entries, transactions,
error translation; ``etcd_auth``: users, tokens and refusals), prefix
watches that resume after a dropped stream (``watch``), a node's lease kept
alive by its own thread (``lease``), live members (``membership``), one
writer per collection (``election``: where a node becomes a collection's
writer), the collections (``catalog``, and a node's side of it:
``node_catalog``), the published shards (``shard_map``: publishes fenced by
the writer's key), their later deletes and indexes (``extras``), what each
node reports of itself (``report``) and the counts computed from it
(``counts``); the bucket's write-once objects (``objects``) and the
checksumming download target (``checked_file``).

May import: the cluster's base (``config``, ``errors``, ``passes``,
``backoff``) and the store's public face; no other room, and not ``node``.
"""
