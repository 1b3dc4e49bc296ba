"""What an operator sees and runs: the cluster's status as one typed
snapshot of etcd (``status``), one read of it shared among callers
(``status_cache``), its live HTML page (``page``), and ``shardmgr cluster
...`` (``commands``).

May import: the cluster's base, ``state`` and ``published``, and (the
commands) ``shardmgr.tables``; not ``writer``, ``query``, ``testing`` or
``node``.
"""
