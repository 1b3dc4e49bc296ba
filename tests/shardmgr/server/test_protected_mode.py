"""Protected mode (server/exposure.py): real ``shardmgr serve`` processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from common.wire.client import RpcClient
from common.wire.errors import Unauthenticated
from shardmgr.server.auth import add_token
from shardmgr.server.config import ServerConfig
from shardmgr.server.exposure import is_loopback

from .serverproc import ServerProcess


def serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shardmgr", "serve", "--data", str(tmp_path / "data"), "--port", "0",
                           *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})


@pytest.mark.parametrize("args", [("--host", "0.0.0.0"), ("--host", "::"), ("--host", ""),
                                  ("--metrics-port", "0", "--metrics-host", "0.0.0.0")])
def test_a_non_loopback_address_without_tokens_refuses_to_start(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = serve(tmp_path, *args)
    assert result.returncode == 2
    assert "protected mode: refusing to listen on" in result.stderr and "--auth-file" in result.stderr
    assert "--insecure" in result.stderr
    assert not (tmp_path / "data").exists()  # refused before touching anything


def test_insecure_starts_on_every_interface_and_warns(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", "--host", "0.0.0.0", "--insecure").start()
    try:
        server.wait_log(r"WARNING .*INSECURE: listening on host='0.0.0.0' \(not loopback\) without a tokens file")
        with RpcClient(server.address, token=None) as rpc:
            assert rpc.call("ping").result == {}
        server.signal(signal.SIGTERM)
        assert server.wait() == 0
        server.start()  # the warning again, at every start (read by the log pump: wait for it, bounded)
        assert len(server.wait_log_count("INSECURE", 2)) == 2
    finally:
        server.kill()


def test_a_tokens_file_allows_every_interface(tmp_path: Path) -> None:
    token = add_token(tmp_path / "tokens", "ops", ["admin"])
    server = ServerProcess(tmp_path / "data", "--host", "0.0.0.0", "--auth-file", str(tmp_path / "tokens")).start()
    try:
        with RpcClient(server.address, token=token) as rpc:
            assert rpc.call("ping").result == {}
        with RpcClient(server.address, token=None) as rpc, pytest.raises(Unauthenticated):
            rpc.call("ping")
        assert not any("INSECURE" in line for line in server.log)
    finally:
        server.kill()


def test_the_metrics_endpoint_binds_loopback_by_default(tmp_path: Path) -> None:
    config = ServerConfig(data_dir=tmp_path, metrics_port=7301)
    assert config.metrics_host == "127.0.0.1"
    with pytest.raises(ValueError, match="metrics_host='0.0.0.0'"):
        ServerConfig(metrics_host="0.0.0.0", metrics_port=7301).validate()
    ServerConfig(metrics_host="0.0.0.0", metrics_port=None).validate()  # off: nothing listens there
    ServerConfig(metrics_host="0.0.0.0", metrics_port=7301, insecure=True).validate()


def test_a_bad_tokens_file_is_a_clear_startup_error(tmp_path: Path) -> None:
    (tmp_path / "tokens").write_text("alice read,write sha256:abc\n")
    result = serve(tmp_path, "--auth-file", str(tmp_path / "tokens"))
    assert result.returncode == 1
    assert "tokens, line 1: hash must be 'sha256:' and 64 lowercase hex digits" in result.stderr
    assert "Traceback" not in result.stderr


def test_loopback_names() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("")
    assert not is_loopback("no-such-host.invalid")
