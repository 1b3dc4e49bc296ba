"""The query side: searches and gets of a whole collection across the nodes.

Where a search of one collection goes, planned from the mirror with no
etcd request (``routing``), the coordinating node's fan-out and merge
(``fanout``: where a search is fanned out), rows by ref from any node
(``lookup``), the part of a search one node answers (``shard_search``), and
the service's searches and gets in cluster mode, put together (``query``).

May import: the cluster's base, ``state`` and ``published``; not
``writer``, ``operations``, ``testing`` or ``node``.
"""
