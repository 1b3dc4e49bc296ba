"""The ``shardmgr`` command line: every command, and what it prints.

The ``shardmgr`` group and the service's commands (``main``: serve, stats,
tokens, snapshots), ``shardmgr cluster ...`` and the etcd options that
``serve`` and ``verify`` share (``cluster``), ``shardmgr verify``
(``verify``) and a verify report shown to a person (``findings``), and the
tables every command prints, plain lines when piped (``tables``).

The face of the package: nothing else in it imports this package
(tests/test_layers.py). Its commands import the cluster extra (boto3,
etcd3gw) only when a command that needs it runs.
"""

from .main import main

__all__ = ["main"]
