"""``shardmgr verify``: the offline integrity check of a whole data directory.

Owns the run and its report (``runner``), the checks of the queue's files
(``queue_checks``) and of the vector shards (``shard_checks``) on top of the
journal check (``common.journal.check``), deep checksums of row files
(``row_checksums``), ``--repair`` (``repair``) and the terminal view
(``view``). docs/verify.md describes checks, severities and exit codes.

Named ``verification`` because ``shardmgr.verify`` is the function.

May import: ``common.journal``, ``workq``, ``shardmgr.store``, ``shardmgr.errors``;
never ``shardmgr.server``.
"""
