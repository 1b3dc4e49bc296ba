"""A collection writer's duties, and the writes a node may not make.

The collections this node writes, with their tenures' fencing tokens
(``roles``) and holder keys (``holdings``), upload on seal: sealed shards
to the bucket, checked, then published (``uploader``), deletes and indexes
after publish (``extras_uploader``), the orphan sweep (``sweep``),
published shards a writer deletes in taken into its own data directory
(``taker``), and appends and deletes forwarded to the writer by a node that
is not it (``forwarding``).

May import: the cluster's base, ``state`` and ``published``; not ``query``,
``operations``, ``testing`` or ``node``.
"""
