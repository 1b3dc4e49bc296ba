"""The names of a shard directory's files: the store's file vocabulary, defined
here once (docs/format.md, "shardmgr"; each file's layout is beside the code
that reads it, named below).

Layout::

    DATA/shards/<collection>/
        collection              the collection's journal, no records (collection.py)
        <shard id:08d>/         one shard
            vectors             row file of float32 vectors (rows.py)
            ids                 row file of int64 ids (rows.py)
            journal             one record per appended batch (batch_record.py, replay.py)
            deletes             the delete log, from the shard's first delete (deletes.py)
            refs                a rewritten shard's old refs, row by row (lineage.py)
            closed              the close marker of a cleanly closed shard (close_marker.py)
            index.faiss         the approximate index, once built (index.py)
            index.meta          what it was built from (index.py)
        <shard id:08d>.tmp/     a shard being created or rewritten: removed at open
        quarantine/<shard id:08d>-<time>/
                                a shard that failed its checks, moved aside with
                                QUARANTINED, why (quarantine.py)

Every shard has ``ALWAYS``; the rest appear when their event does.
"""

from __future__ import annotations

SHARDS = "shards"
COLLECTION = "collection"
QUARANTINE = "quarantine"
VECTORS = "vectors"
IDS = "ids"
JOURNAL = "journal"
DELETES = "deletes"
REFS = "refs"
CLOSED = "closed"
INDEX = "index.faiss"
INDEX_META = "index.meta"
#: in a quarantined shard's directory: why it was moved
QUARANTINED = "QUARANTINED"
#: a file or directory being built, renamed to its name without the suffix when complete
TMP_SUFFIX = ".tmp"

#: the files every shard has
ALWAYS = (VECTORS, IDS, JOURNAL)
#: the index's two files, present together once the shard's index is built
INDEX_FILES = (INDEX, INDEX_META)

__all__ = ["SHARDS", "COLLECTION", "QUARANTINE", "VECTORS", "IDS", "JOURNAL", "DELETES", "REFS", "CLOSED", "INDEX",
           "INDEX_META", "QUARANTINED", "TMP_SUFFIX", "ALWAYS", "INDEX_FILES"]
