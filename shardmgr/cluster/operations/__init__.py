"""What an operator sees: the cluster's status as one typed snapshot of etcd
(``status``), one read of it shared among callers (``status_cache``) and
its live HTML page (``page``); ``shardmgr cluster status`` prints it
(shardmgr/cli/cluster.py).

May import: the cluster's base, ``state`` and ``published``; not ``writer``,
``query``, ``testing`` or ``node``.
"""
