"""TLS (common/wire/tls.py) through a real server on loopback: round trips,
client certificates required and missing, untrusted servers, plain and TLS
peers mixed up, and replies written while the server stops."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

from common.wire.client import RpcClient, TlsFailed
from common.wire.component import Component, Request
from common.wire.errors import Unauthenticated, Unavailable
from shardmgr.server.auth import add_token
from shardmgr.server.config import ServerConfig
from shardmgr.server.server import Server

from .certs import Pki, make_pki
from .serverproc import ServerProcess


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_config(tmp_path: Path, pki: Pki, **fields: object) -> ServerConfig:
    return ServerConfig(data_dir=tmp_path / "data", port=0, tls_cert=pki.server_cert, tls_key=pki.server_key,
                        **fields)  # type: ignore[arg-type]


@pytest.fixture
def server(tmp_path: Path, pki: Pki) -> Iterator[Server]:
    add_token(tmp_path / "tokens", "rw", ["read", "write"])
    server = Server(tls_config(tmp_path, pki, auth_file=tmp_path / "tokens"))
    server.start()
    yield server
    server.stop()


def test_round_trip_small_and_4_mib_with_a_token(server: Server, pki: Pki, tmp_path: Path) -> None:
    token = add_token(tmp_path / "tokens", "t", ["read"])
    with RpcClient(server.address, tls=True, ca=pki.ca, token=token) as rpc:
        assert rpc.call("ping").result == {}
        body = np.frombuffer(os.urandom(4 << 20), dtype=np.uint8)
        small = np.arange(10, dtype=np.int64)
        reply = rpc.call("echo", {"a": 1}, {"small": small, "body": body})
        assert reply.result == {"a": 1} and np.array_equal(reply.parts["body"], body)
        assert np.array_equal(reply.parts["small"], small)
        ids = [rpc.send("ping") for _ in range(500)]  # pipelined: many small frames joined per TLS write
        assert all(rpc.receive(i).result == {} for i in ids)
    with RpcClient(server.address, tls=True, ca=pki.ca, token=None, retry_for=2) as rpc:
        with pytest.raises(Unauthenticated):
            rpc.call("ping")


def test_a_server_certificate_the_client_does_not_trust(server: Server, tmp_path: Path) -> None:
    other = make_pki(tmp_path / "other", prefix="other-")
    started = time.monotonic()
    for options in ({"tls": True}, {"ca": other.ca}):  # the system's CAs; another CA
        with RpcClient(server.address, retry_for=60, **options) as rpc:  # type: ignore[arg-type]
            with pytest.raises(TlsFailed, match="CERTIFICATE_VERIFY_FAILED"):
                rpc.call("ping")
    assert time.monotonic() - started < 30  # refused at once, not retried for retry_for (60 s)


def test_client_certificates_required_and_missing(tmp_path: Path, pki: Pki) -> None:
    server = Server(tls_config(tmp_path, pki, tls_client_ca=pki.ca))
    server.start()
    try:
        with RpcClient(server.address, ca=pki.ca, client_cert=pki.client_cert, client_key=pki.client_key) as rpc:
            assert rpc.call("ping").result == {}
        started = time.monotonic()
        with RpcClient(server.address, ca=pki.ca, retry_for=60) as rpc:
            with pytest.raises(TlsFailed, match="CERTIFICATE_REQUIRED"):
                rpc.call("ping")
        assert time.monotonic() - started < 30  # not retried for retry_for (60 s)
        other = make_pki(tmp_path / "other", prefix="other-")  # a client certificate from another CA
        with RpcClient(server.address, ca=pki.ca, client_cert=other.client_cert, client_key=other.client_key,
                       retry_for=10) as rpc:
            with pytest.raises(TlsFailed):
                rpc.call("ping")
        # The server counts after sending its alert, maybe after the client saw it; and a client that
        # got a reset instead of the alert (its preamble was unread when the server closed) tried again.
        deadline = time.monotonic() + 10
        while server.stats()["server"]["errors_tls_handshake_total"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.stats()["server"]["errors_tls_handshake_total"] >= 2
    finally:
        server.stop()


def test_plain_client_to_a_tls_server_and_back(server: Server, pki: Pki, tmp_path: Path) -> None:
    with RpcClient(server.address, retry_for=1) as rpc, pytest.raises(Unavailable, match="tls=True?"):
        rpc.call("ping")
    plain = Server(ServerConfig(data_dir=tmp_path / "plain", port=0))
    plain.start()
    try:
        with RpcClient(plain.address, ca=pki.ca, retry_for=1) as rpc:
            with pytest.raises(Unavailable, match="is it a TLS server"):
                rpc.call("ping")
    finally:
        plain.stop()


class Hold(Component):
    """Holds every 'hold' request until the server stops (quiesce), then answers it."""

    name = "hold"

    def __init__(self) -> None:
        self.held: list[Request] = []
        self.arrived = threading.Event()

    def commands(self) -> Iterable[str]:
        return ("hold",)

    def handle(self, request: Request) -> None:
        self.held.append(request)
        self.arrived.set()

    def quiesce(self) -> None:
        for request in self.held:
            request.reply({"answered": "at stop"}, {"x": np.arange(1000, dtype=np.float64)})


def test_replies_written_while_stopping_stay_encrypted(tmp_path: Path, pki: Pki) -> None:
    """Stopping shuts the sending side of each socket after the goaway; on a
    TLS socket that must not drop the TLS state (SSLSocket.shutdown does), or
    what is written or read afterwards would be clear text or garbage."""
    component = Hold()
    server = Server(tls_config(tmp_path, pki), [component])
    server.start()
    try:
        with RpcClient(server.address, ca=pki.ca) as rpc:
            request_id = rpc.send("hold")
            assert component.arrived.wait(10)
            stopper = threading.Thread(target=server.stop)
            stopper.start()
            reply = rpc.receive(request_id)
            assert reply.result == {"answered": "at stop"} and reply.parts["x"].sum() == 499500
            stopper.join(30)
    finally:
        server.stop()


def test_serve_and_cli_options(tmp_path: Path, pki: Pki) -> None:
    token = add_token(tmp_path / "tokens", "reader", ["read"])
    server = ServerProcess(tmp_path / "data", "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                           "--tls-client-ca", str(pki.ca), "--auth-file", str(tmp_path / "tokens")).start()
    try:
        server.wait_log(r"ready: listening on .*TLS, tokens required")
        base = [sys.executable, "-m", "shardmgr", "stats", "--port", str(server.port), "--json", "--timeout", "3"]
        ok = subprocess.run([*base, "--ca", str(pki.ca), "--client-cert", str(pki.client_cert), "--client-key",
                             str(pki.client_key)], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "SHARDMGR_TOKEN": token})
        assert ok.returncode == 0, ok.stderr
        assert '"errors_forbidden_total"' in ok.stdout
        missing = subprocess.run([*base, "--ca", str(pki.ca), "--token", token], capture_output=True, text=True,
                                 timeout=60)
        assert missing.returncode == 1 and "TLS with" in missing.stderr and "CERTIFICATE_REQUIRED" in missing.stderr
    finally:
        server.kill()


def test_tls_settings_are_checked(tmp_path: Path, pki: Pki) -> None:
    with pytest.raises(ValueError, match="tls_cert and tls_key go together"):
        ServerConfig(tls_cert=pki.server_cert).validate()
    with pytest.raises(ValueError, match="tls_client_ca needs tls_cert"):
        ServerConfig(tls_client_ca=pki.ca).validate()
    with pytest.raises(ValueError, match="cannot load the TLS certificate"):
        Server(ServerConfig(data_dir=tmp_path, tls_cert=pki.ca, tls_key=pki.client_key))
    with pytest.raises(ValueError, match="cannot load the CA file"):
        RpcClient(("127.0.0.1", 1), ca=tmp_path / "missing.pem")


def test_a_peer_gone_before_its_tls_wrap_does_not_stop_the_acceptor(tmp_path: Path, pki: Pki,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    server = Server(tls_config(tmp_path, pki))
    context = server._tls
    assert context is not None
    real_wrap = context.wrap_socket
    calls: list[int] = []

    def wrap_once_failing(sock: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionResetError("peer reset before the wrap")
        return real_wrap(sock, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(context, "wrap_socket", wrap_once_failing)
    server.start()
    try:
        with RpcClient(server.address, ca=pki.ca, retry_for=10) as rpc:  # the first try is dropped, the retry served
            assert rpc.call("ping").result == {}
        assert len(calls) >= 2
    finally:
        server.stop()
