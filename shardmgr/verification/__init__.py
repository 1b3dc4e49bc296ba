"""``shardmgr verify``: the offline integrity check of a whole data directory.

Owns the run (``runner``; its command and what it prints are
shardmgr/cli/verify.py and findings.py) and what it found (``report``: :class:`Report`, the exit
codes; exported here), the checks of the queue's files
(``queue_checks``) and of the vector shards (``shard_checks``) on top of the
journal check (``common.journal.check``), deep checksums of row files
(``row_checksums``) and ``--repair`` (``repair``); ``--cluster``: a cluster's shard map and catalog
(``cluster_checks``) against the objects in its bucket (``object_checks``).
docs/verify.md describes checks, severities and exit codes.

Named ``verification`` because ``shardmgr.verify`` is the function.

May import: ``common``, ``workq``, ``shardmgr.store``, ``shardmgr.errors``, and
``shardmgr.cluster`` from ``cluster_checks`` and ``object_checks`` only, which
``runner`` imports when ``--cluster`` is asked for (the cluster extra is
optional); never ``shardmgr.server`` or ``shardmgr.cli``.
"""

from .report import Report

__all__ = ["Report"]
