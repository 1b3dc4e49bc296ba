"""Real etcd and SeaweedFS servers on loopback (``loopback``), for the
cluster's tests, its benchmarks and trying cluster mode on one machine;
``shardmgr serve`` never imports it.

May import: the cluster's base only.
"""
