"""The vector store: collections of append-only shards searched with faiss.

Owns its configuration (``config``), row files (``rows``), shards
(``shard``), collections (``collection``), header metadata decoding
(``metadata``: what does not parse is a FormatError, i.e. damage), the decoding of its journals'
header metadata (``metadata``), input checks (``inputs``), exact k-NN
search of rows, results and their merge (``knn``), a collection's search
over its shards (``searcher``), per-shard indexes (``index``), the store itself
(``store``), its server component (``service``) and its network client
(``client``). It runs embedded, without any server.

This module is the store's public face for the rest of the package: cluster
mode imports the store through it alone (``from shardmgr.store import
Store, layout``; tests/test_layers.py fails on ``shardmgr.store.<module>``
inside cluster/). Its names load on first use, so importing one (a client's
constants, say) does not import the store and faiss.

May import: ``common.journal``, ``common.wire``, ``shardmgr.errors``; never
``shardmgr.server``, ``shardmgr.verification`` or ``workq``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from common import exports

from . import layout

if TYPE_CHECKING:
    from . import inputs
    from .client import APPEND_BYTES_PER_SECOND, GET_SECONDS_PER_ROW, SEARCH_SECONDS_PER_VALUE, StoreClient, Timeout
    from .config import StoreConfig
    from .deletes import selector
    from .index import check_params
    from .knn import Hits, SearchResult, merge
    from .names import check_name
    from .refs import MAX_SHARD, ROW_BITS, ROW_MASK, split_refs
    from .sealed import SealedShard
    from .searcher import Searcher
    from .shard_files import ShardDamaged
    from .store import Store
    from .view import View, gather

#: each public name, and the module of this package that defines it
_HOMES = {
    "Store": "store", "StoreConfig": "config",
    "StoreClient": "client", "Timeout": "client", "APPEND_BYTES_PER_SECOND": "client",
    "GET_SECONDS_PER_ROW": "client", "SEARCH_SECONDS_PER_VALUE": "client",
    "SealedShard": "sealed", "ShardDamaged": "shard_files", "View": "view", "gather": "view",
    "Searcher": "searcher", "Hits": "knn", "SearchResult": "knn", "merge": "knn",
    "selector": "deletes", "check_params": "index", "check_name": "names",
    "split_refs": "refs", "ROW_BITS": "refs", "ROW_MASK": "refs", "MAX_SHARD": "refs",
}

__all__ = [
    "inputs", "layout",
    "Store", "StoreConfig", "StoreClient", "Timeout", "APPEND_BYTES_PER_SECOND", "GET_SECONDS_PER_ROW",
    "SEARCH_SECONDS_PER_VALUE", "SealedShard", "ShardDamaged", "View", "gather", "Searcher", "Hits", "SearchResult",
    "merge", "selector", "check_params", "check_name", "split_refs", "ROW_BITS", "ROW_MASK", "MAX_SHARD",
]

__getattr__ = exports.lazy(__name__, {"inputs": "inputs", **_HOMES})
