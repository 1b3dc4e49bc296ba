"""The published shards this node holds and serves, and what it knows of
their deletes.

This node's decoded copy of the state searches are routed by (``mirror``),
which live nodes serve a published shard (``placement``: rendezvous
hashing), the local cache of published shards, fetched, checked and
announced (``cache``), deletes published by other nodes merged into the
copies here (``deletes_merger``), and the deletes this node acknowledged,
held until searches routed without it see them (``acked_deletes``).

May import: the cluster's base and ``state``; not ``writer``, ``query``,
``operations``, ``testing`` or ``node``.
"""
