"""The vector store: collections of append-only shards searched with faiss.

Owns its configuration (``config``), row files (``rows``), shards
(``shard``), collections (``collection``), header metadata decoding
(``metadata``: what does not parse is a FormatError, i.e. damage), the decoding of its journals'
header metadata (``metadata``), input checks (``batch``), search and its
merge (``search``), per-shard indexes (``index``), the store itself
(``store``), its server component (``service``) and its network client
(``client``). It runs embedded, without any server.

May import: ``common.journal``, ``common.wire``, ``shardmgr.errors``; never
``shardmgr.server``, ``shardmgr.verification`` or ``workq``.
"""
