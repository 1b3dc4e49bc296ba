"""ClusterConfig: the URLs of ``--cluster`` and ``--object-store``, and the checks on timings; the
cluster settings of ``shardmgr serve`` (ServerConfig, the ``[node]`` table, the command line)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from shardmgr.cluster.config import ETCD_PASSWORD_ENV, ClusterConfig
from shardmgr.cluster.errors import BadClusterConfig, ClusterError


def test_urls_give_endpoint_prefixes_and_bucket() -> None:
    c = ClusterConfig.from_urls("etcd://127.0.0.1:2380/prod/eu", "s3://vectors/prod/", s3_endpoint="http://h:8333")
    assert (c.etcd_host, c.etcd_port, c.key_prefix) == ("127.0.0.1", 2380, "/prod/eu")
    assert (c.bucket, c.object_prefix, c.s3_endpoint) == ("vectors", "prod", "http://h:8333")
    assert c.key("members", "n1") == "/prod/eu/members/n1"
    assert c.object_key("docs", "shards", "1") == "prod/docs/shards/1"
    assert ClusterConfig.from_urls("etcd://localhost/p", "s3://b-1").etcd_port == 2379
    assert ClusterConfig.from_urls("etcd://localhost/p", "s3://b-1").object_key("x") == "x"
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


def test_serve_takes_the_cluster_flags_and_the_node_table(tmp_path: Path) -> None:
    from shardmgr.server.config import ServerConfig

    assert ServerConfig().cluster_config() is None  # the default: a single node, as before
    settings = tmp_path / "serve.toml"
    settings.write_text('cluster = "etcd://127.0.0.1:2379/prod"\nobject_store = "s3://vectors/prod"\n'
                        '[node]\nlease_ttl_s = 3\nsweep_grace_s = 60.0\n')
    config = ServerConfig.load(settings, s3_endpoint="http://127.0.0.1:8333", node_id="n1", advertise="h:7300")
    cluster = config.cluster_config()
    assert cluster is not None and (cluster.key_prefix, cluster.bucket, cluster.object_prefix) == ("/prod", "vectors",
                                                                                                    "prod")
    assert (cluster.lease_ttl_s, cluster.s3_endpoint, config.node.sweep_grace_s) == (3, "http://127.0.0.1:8333", 60)
    assert (config.node_id, config.advertise) == ("n1", "h:7300")


CLUSTER = {"cluster": "etcd://127.0.0.1/p", "object_store": "s3://bucket"}


@pytest.mark.parametrize("fields, says", [
    ({"cluster": "etcd://127.0.0.1/p"}, "go together"),
    ({"object_store": "s3://bucket"}, "go together"),
    ({"cluster": "etcd://127.0.0.1", "object_store": "s3://bucket"}, "cluster URL"),
    ({"cluster": "etcd://127.0.0.1/p", "object_store": "s3://bucket", "node_id": "-x"}, "node id"),
    ({"cluster": "etcd://127.0.0.1/p", "object_store": "s3://bucket", "advertise": "nohost"}, "HOST:PORT"),
    ({"cluster": "etcd://127.0.0.1/p", "object_store": "s3://bucket", "node": {"lease_ttl_s": 1}}, "lease_ttl_s"),
    ({"cluster": "etcd://127.0.0.1/p", "object_store": "s3://bucket", "node": {"etcd_timeout_s": 20.0}},
     "below lease_ttl_s"),
    ({"node": {"shard_id_block": 1}}, "shard_id_block"),
    ({"node": {"upload_retry_min_s": 5.0, "upload_retry_max_s": 1.0}}, "upload_retry_max_s"),
    ({**CLUSTER, "etcd_cert": "/c.pem"}, "certificate and key go together"),
    ({**CLUSTER, "etcd_ca": "/no/such/ca.pem"}, "etcd TLS: cannot load the CA file /no/such/ca.pem"),
    ({**CLUSTER, "etcd_password_file": "/p"}, "needs an etcd user"),
    ({**CLUSTER, "etcd_user": "node"}, "needs a password: give a password file"),
    ({**CLUSTER, "etcd_user": "node", "etcd_password_file": "/no/such/file"}, "cannot read etcd's password file"),
    ({**CLUSTER, "etcd_user": "two words", "etcd_password_file": "/p"}, "etcd user name"),
    ({"etcd_ca": "/ca.pem"}, "for cluster mode"),
    ({"cluster": "etcd://192.0.2.1/p", "object_store": "s3://bucket"}, "protected mode: refusing to talk to etcd"),
])
def test_bad_cluster_settings_are_refused_at_start(fields: dict[str, object], says: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from shardmgr.server.config import ServerConfig

    monkeypatch.delenv(ETCD_PASSWORD_ENV, raising=False)

    settings = tmp_path / "serve.toml"
    lines = [f'{k} = "{v}"' for k, v in fields.items() if not isinstance(v, dict)]
    for k, v in fields.items():
        if isinstance(v, dict):
            lines += [f"[{k}]", *(f"{name} = {value}" for name, value in v.items())]
    settings.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=says):
        ServerConfig.load(settings)


def test_the_serve_command_line_has_the_cluster_options() -> None:
    from click.testing import CliRunner

    from shardmgr.cli import main

    usage = CliRunner().invoke(main, ["serve", "--help"]).output
    for option in ("--cluster", "--object-store", "--s3-endpoint", "--node-id", "--advertise"):
        assert option in usage
    refused = CliRunner().invoke(main, ["serve", "--cluster", "etcd://127.0.0.1:1/p"])
    assert refused.exit_code == 2 and "go together" in refused.output
