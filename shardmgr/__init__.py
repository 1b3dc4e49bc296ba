"""shardmgr: append-only vector shards and the service that hosts them with workq."""

__version__ = "0.1.0"
