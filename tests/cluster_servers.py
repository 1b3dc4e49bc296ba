"""Real etcd and SeaweedFS servers on loopback for the cluster tests: they
live in shardmgr/cluster/testing/loopback.py, beside the code they serve, so that the
benchmarks (tools/bench_cluster.py) start them the same way without
importing the tests."""

from shardmgr.cluster.testing.loopback import (
    S3_ACCESS_KEY,
    S3_REGION,
    S3_SECRET_KEY,
    EtcdServer,
    EtcdTls,
    Server,
    ServerError,
    WeedServer,
    etcd_binary,
    free_ports,
    weed_binary,
)

__all__ = ["S3_ACCESS_KEY", "S3_REGION", "S3_SECRET_KEY", "EtcdServer", "EtcdTls", "Server", "ServerError",
           "WeedServer", "etcd_binary", "free_ports", "weed_binary"]
