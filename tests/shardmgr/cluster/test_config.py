"""ClusterConfig: the URLs of ``--cluster`` and ``--object-store``, and the checks on timings."""

from __future__ import annotations

import dataclasses

import pytest

from shardmgr.cluster.config import ClusterConfig
from shardmgr.cluster.errors import BadClusterConfig, ClusterError


def test_urls_give_endpoint_prefixes_and_bucket() -> None:
    c = ClusterConfig.from_urls("etcd://127.0.0.1:2380/prod/eu", "s3://vectors/prod/", s3_endpoint="http://h:8333")
    assert (c.etcd_host, c.etcd_port, c.key_prefix) == ("127.0.0.1", 2380, "/prod/eu")
    assert (c.bucket, c.object_prefix, c.s3_endpoint) == ("vectors", "prod", "http://h:8333")
    assert c.key("members", "n1") == "/prod/eu/members/n1"
    assert c.object_key("docs", "shards", "1") == "prod/docs/shards/1"
    assert ClusterConfig.from_urls("etcd://e/p", "s3://b-1").etcd_port == 2379
    assert ClusterConfig.from_urls("etcd://e/p", "s3://b-1").object_key("x") == "x"
    assert ClusterConfig.from_urls(c.etcd_url, c.s3_url) == dataclasses.replace(c, s3_endpoint=None)


@pytest.mark.parametrize("cluster, store", [
    ("http://127.0.0.1:2379/p", "s3://bucket"),          # wrong scheme
    ("etcd://127.0.0.1:2379", "s3://bucket"),            # no prefix: clusters on one etcd would mix
    ("etcd://127.0.0.1:2379/", "s3://bucket"),
    ("etcd://127.0.0.1:99999/p", "s3://bucket"),         # bad port
    ("etcd://127.0.0.1/a b", "s3://bucket"),
    ("etcd://127.0.0.1/p?x=1", "s3://bucket"),
    ("etcd://127.0.0.1/p", "s3://Bucket"),               # S3 bucket names are lowercase
    ("etcd://127.0.0.1/p", "s3://b"),
    ("etcd://127.0.0.1/p", "s3://bucket/a//b"),
    ("etcd://127.0.0.1/p", "file:///tmp/x"),
])
def test_malformed_urls_are_refused_with_the_url_named(cluster: str, store: str) -> None:
    with pytest.raises(BadClusterConfig) as e:
        ClusterConfig.from_urls(cluster, store)
    assert isinstance(e.value, ClusterError) and isinstance(e.value, ValueError)


@pytest.mark.parametrize("fields, named", [
    ({"lease_ttl_s": 1}, "lease_ttl_s"),                 # etcd's minimum is 2 s
    ({"lease_ttl_s": 2.5}, "lease_ttl_s"),               # etcd leases are whole seconds
    ({"etcd_timeout_s": 2.0, "lease_ttl_s": 2}, "etcd_timeout_s"),  # a keepalive must not outlive the lease
    ({"etcd_timeout_s": float("nan")}, "etcd_timeout_s"),
    ({"s3_read_timeout_s": 0}, "s3_read_timeout_s"),
    ({"multipart_chunk_bytes": 1 << 20}, "multipart_chunk_bytes"),
    ({"transfer_concurrency": 0}, "transfer_concurrency"),
    ({"no_such_field": 1}, "no_such_field"),
])
def test_bad_settings_are_refused_naming_the_field(fields: dict[str, object], named: str) -> None:
    with pytest.raises(BadClusterConfig, match=named):
        ClusterConfig.from_urls("etcd://127.0.0.1/p", "s3://bucket", **fields)
