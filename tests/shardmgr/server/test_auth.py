"""Tokens and roles through a real server on loopback (the in-process Server
with the product's components): every command for every role, missing and
wrong tokens, the tokens file and ``shardmgr token create``."""

from __future__ import annotations

import os
import re
import socket
import stat
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from common.wire import framing
from common.wire.client import TOKEN_ENV, RpcClient
from common.wire.errors import Forbidden, ServiceError, Unauthenticated, UnknownCommand
from common.wire.frame_reader import FrameReader
from shardmgr.cli import main
from shardmgr.server.auth import (
    ANY,
    COMMAND_ROLES,
    ROLES,
    Authenticator,
    AuthFileError,
    add_token,
    hash_token,
    load_tokens,
)
from shardmgr.server.config import ServerConfig
from shardmgr.server.server import Server

Tokens = dict[str, str]


@pytest.fixture
def tokens(tmp_path: Path) -> Tokens:
    """One token per role (and one with read+write), in tmp_path/tokens."""
    path = tmp_path / "tokens"
    made = {role: add_token(path, role, [role]) for role in ROLES}
    made["producer"] = add_token(path, "producer", ["write", "read"])
    return made


def serving(tmp_path: Path, metrics: bool) -> Iterator[Server]:
    server = Server(ServerConfig(data_dir=tmp_path / "data", port=0, auth_file=tmp_path / "tokens",
                                 handshake_timeout_s=2.0, metrics_port=0 if metrics else None))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def server(tmp_path: Path, tokens: Tokens) -> Iterator[Server]:
    """A server that requires tokens (no metrics endpoint: stopping one waits up to 0.5 s for its HTTP thread)."""
    yield from serving(tmp_path, metrics=False)


@pytest.fixture
def metered(tmp_path: Path, tokens: Tokens) -> Iterator[Server]:
    """The same with its metrics endpoint."""
    yield from serving(tmp_path, metrics=True)


def client(server: Server, token: str | None) -> RpcClient:
    return RpcClient(server.address, token=token, timeout=10, retry_for=5)


def test_every_hosted_command_has_a_role(tmp_path: Path) -> None:
    server = Server(ServerConfig(data_dir=tmp_path, port=0))
    missing = sorted(set(server.command_names) - set(COMMAND_ROLES))
    assert not missing, f"commands without a role in shardmgr/server/auth.py COMMAND_ROLES: {missing}"
    assert not set(COMMAND_ROLES) - set(server.command_names), "COMMAND_ROLES names commands nobody serves"
    assert set(COMMAND_ROLES.values()) <= {*ROLES, ANY}


def test_the_table_gives_each_role_what_docs_security_promises() -> None:
    by_role = {role: {cmd for cmd, need in COMMAND_ROLES.items() if need == role} for role in (*ROLES, ANY)}
    assert {"shardmgr.search", "shardmgr.get", "stats", "workq.results", "workq.job_status"} <= by_role["read"]
    assert {"shardmgr.append", "shardmgr.create_collection", "workq.enqueue"} <= by_role["write"]
    assert by_role["worker"] == {"workq.hello", "workq.lease", "workq.complete", "workq.release", "workq.touch"}
    assert by_role["admin"] == {"workq.kick", "snapshot", "shardmgr.compact"}
    assert {"shardmgr.delete", "shardmgr.delete_ids"} <= by_role["write"]
    assert by_role[ANY] == {"info", "ping", "echo"}


@pytest.mark.parametrize("role", ROLES)
def test_every_command_for_every_role(server: Server, tokens: Tokens, role: str) -> None:
    """Each command answers ``forbidden`` exactly when the role does not allow it;
    allowed ones reach their component (which may dislike the empty arguments)."""
    with client(server, tokens[role]) as rpc:
        for cmd in server.command_names:
            allowed = role == "admin" or COMMAND_ROLES[cmd] in (role, ANY)
            try:
                rpc.call(cmd, {})
                outcome = "ok"
            except Forbidden as exc:
                outcome = "forbidden"
                assert cmd in exc.message and role in exc.message
            except ServiceError as exc:
                outcome = exc.code  # reached the component: bad_request, not_found, ...
            assert (outcome != "forbidden") == allowed, f"{role} calling {cmd}: {outcome}"
        assert rpc.call("ping").result == {}  # forbidden requests left the connection open
        assert rpc._sock is not None


def test_unknown_commands_stay_unknown_for_any_role(server: Server, tokens: Tokens) -> None:
    with client(server, tokens["read"]) as rpc, pytest.raises(UnknownCommand):
        rpc.call("no.such.command")


def test_missing_token_is_unauthenticated_and_counted(metered: Server, tokens: Tokens) -> None:
    server = metered
    with client(server, None) as rpc:
        with pytest.raises(Unauthenticated, match="requires a token"):
            rpc.call("ping")
        assert rpc._sock is not None and rpc._sock.recv(1) == b""  # the server closed it
    counters = server.stats()["server"]
    assert counters["errors_unauthenticated_total"] == 1
    host, port = server._metrics.server_address[:2]
    scrape = urllib.request.Request(f"http://{host}:{port}/metrics",
                                    headers={"Authorization": f"Bearer {tokens['read']}"})
    body = urllib.request.urlopen(scrape, timeout=10).read().decode()
    assert "shardmgr_server_errors_unauthenticated_total 1.0" in body


def test_wrong_token_is_refused_at_connect_without_retries(server: Server) -> None:
    started = time.monotonic()
    with RpcClient(server.address, token="smt_" + "A" * 43, retry_for=60) as rpc:
        with pytest.raises(Unauthenticated, match="not valid"):
            rpc.call("ping")
    assert time.monotonic() - started < 30  # not retried for retry_for (60 s)
    assert server.stats()["server"]["errors_unauthenticated_total"] == 1


def test_forbidden_is_counted(server: Server, tokens: Tokens) -> None:
    with client(server, tokens["worker"]) as rpc, pytest.raises(Forbidden, match="needs role 'read'"):
        rpc.call("stats")
    assert server.stats()["server"]["errors_forbidden_total"] == 1


def test_token_from_the_environment(server: Server, tokens: Tokens, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, tokens["producer"])
    with RpcClient(server.address) as rpc:
        assert rpc.call("ping").result == {}
        with pytest.raises(Forbidden):
            rpc.call("workq.kick", {"job": "j"})


def test_queue_store_and_worker_clients_take_a_token(server: Server, tokens: Tokens) -> None:
    import shardmgr
    import workq

    store = shardmgr.connect(f"127.0.0.1:{server.address[1]}", token=tokens["producer"])
    queue = workq.connect(f"127.0.0.1:{server.address[1]}", token=tokens["producer"])
    worker = workq.Worker(f"127.0.0.1:{server.address[1]}", "w1", token=tokens["worker"])
    try:
        store.create_collection("c", 4)
        assert store.collections() == ["c"]
        queue.enqueue("j", "m", "s", 0, [b"x"], durable=True)
        items = worker.lease(1, wait=5)
        worker.complete([i.handle for i in items], [b"y"])
        assert [r.payload for r in queue.results("j", wait=5)] == [b"y"]
        with pytest.raises(Forbidden):
            worker.rpc.call("workq.enqueue", {})
    finally:
        store.close()
        queue.close()
        worker.close()


def test_a_silent_connection_is_closed_after_the_handshake_timeout(server: Server) -> None:
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(framing.preamble())
        assert sock.recv(8) == framing.preamble()
        started = time.monotonic()
        assert sock.recv(1) == b""  # no auth frame within handshake_timeout_s (2 s): closed
        assert time.monotonic() - started < 8


def test_token_on_a_server_without_tokens_file(tmp_path: Path) -> None:
    server = Server(ServerConfig(data_dir=tmp_path, port=0))
    server.start()
    try:
        with RpcClient(server.address, token="smt_anything") as rpc:  # old and new clients both work
            assert rpc.call("shardmgr.collections").result == {"names": []}
        with RpcClient(server.address, token=None) as rpc:
            assert rpc.call("ping").result == {}
    finally:
        server.stop()


def test_the_tokens_file_is_read_again_when_it_changes(server: Server, tmp_path: Path, tokens: Tokens) -> None:
    late = add_token(tmp_path / "tokens", "late", ["read"])
    with client(server, late) as rpc:
        assert "server" in rpc.call("stats").result
    path = tmp_path / "tokens"
    path.write_text("".join(line + "\n" for line in path.read_text().splitlines() if not line.startswith("late ")))
    with client(server, late) as rpc, pytest.raises(Unauthenticated):
        rpc.call("ping")
    path.write_text(path.read_text() + "broken line\n")  # a bad edit keeps the tokens loaded before
    with client(server, tokens["read"]) as rpc:
        assert rpc.call("ping").result == {}


@pytest.mark.parametrize(("line", "error"), [
    ("alice read", "line 2: expected 'NAME ROLES sha256:HEX', got 2 field"),
    ("alice reed sha256:" + "0" * 64, "line 2: roles must be a comma-separated subset"),
    ("al/ice read sha256:" + "0" * 64, "line 2: token name 'al/ice'"),
    ("alice read sha256:" + "0" * 63, "line 2: hash must be 'sha256:' and 64 lowercase hex digits"),
    ("alice read smt_abc", "never tokens"),
    ("ok read sha256:" + "0" * 64, "line 2: token name 'ok' appears twice"),
])
def test_a_bad_tokens_file_names_the_line(tmp_path: Path, line: str, error: str) -> None:
    path = tmp_path / "tokens"
    path.write_text(f"ok read sha256:{'1' * 64}  # first\n{line}\n")
    with pytest.raises(AuthFileError, match=re.escape(error)):
        Authenticator(path)
    with pytest.raises(AuthFileError, match="cannot read the tokens file"):
        Authenticator(tmp_path / "missing")


def test_token_create_prints_once_and_stores_the_hash(tmp_path: Path) -> None:
    path = tmp_path / "sub.tokens"
    result = CliRunner().invoke(main, ["token", "create", "ingest", "--roles", "write,read", "--auth-file", str(path)])
    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    assert token.startswith("smt_") and len(token) >= 40
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = path.read_text()
    assert token not in text and hash_token(token) in text
    [entry] = load_tokens(path)
    assert entry.name == "ingest" and entry.roles == {"read", "write"}
    again = CliRunner().invoke(main, ["token", "create", "ingest", "--roles", "read", "--auth-file", str(path)])
    assert again.exit_code == 1 and "already has a token named 'ingest'" in again.output
    bad = CliRunner().invoke(main, ["token", "create", "x", "--roles", "root", "--auth-file", str(path)])
    assert bad.exit_code == 1 and "roles must be" in bad.output
    assert path.read_text() == text  # refused commands changed nothing


def test_docs_security_lists_every_command_under_its_role() -> None:
    lines = (Path(__file__).parents[3] / "docs" / "security.md").read_text().splitlines()
    rows = {role: next(line for line in lines if line.startswith(f"| `{role}` |")) for role in ROLES}
    rows[ANY] = next(line for line in lines if line.startswith("| any token |"))
    for cmd, role in COMMAND_ROLES.items():
        assert f"`{cmd}`" in rows[role], f"docs/security.md: {cmd} is not in the row of role {role}"


def test_frames_before_auth_are_small(server: Server, tokens: Tokens) -> None:
    """A peer without a token cannot make the server buffer a large frame."""
    from shardmgr.server.auth import MAX_AUTH_FRAME_BYTES

    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(framing.preamble())
        assert sock.recv(8) == framing.preamble()
        sock.sendall(framing.FRAME_HEAD.pack(MAX_AUTH_FRAME_BYTES + 1, 10))
        reader = FrameReader(sock)
        error = reader.read()
        assert error is not None and error.header["error"]["code"] == "frame_too_large"
        assert reader.read() is None  # closed
    with client(server, tokens["write"]) as rpc:  # after auth, the configured limit applies again
        body = np.zeros(MAX_AUTH_FRAME_BYTES * 4, dtype=np.uint8)
        assert rpc.call("echo", {}, {"b": body}).parts["b"].nbytes == body.nbytes
