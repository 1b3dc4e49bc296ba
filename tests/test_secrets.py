"""No secret (a token, a password, a tokens file's hash) in any repr, log
line or error text (docs/security.md, "Secrets in reprs, logs and errors").

- Every dataclass of the packages with a field named like a secret keeps it
  out of its repr (config dataclasses included, whoever adds such a field).
- Every object a user or the server holds that carries a token, built with
  one: its repr, str and rich's pretty repr (what a traceback with locals
  prints) do not show it.
- A real server with a tokens file at DEBUG: wrong tokens, a token without
  the role, over the wire, the CLI and the metrics port; no answer, error
  text or log line shows a token or its hash.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pkgutil
import re
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from rich.pretty import pretty_repr

import common
import shardmgr
import workq
from common.wire import framing
from common.wire.client import RpcClient
from common.wire.dialer import Dialer
from common.wire.errors import Forbidden, Unauthenticated
from shardmgr.server.auth import Authenticator, add_token, hash_token
from shardmgr.server.http_auth import HttpAuth
from shardmgr.store.client import StoreClient
from tests.shardmgr.server.serverproc import ServerProcess
from workq.client import QueueClient
from workq.worker import Worker

ROOT = Path(__file__).resolve().parents[1]
SECRET_NAME = re.compile(r"token|password|passwd|secret|credential|digest", re.IGNORECASE)
TOKEN = "smt_" + "S3cr3tTok3n" * 4  # no real token, but shaped like one


def dataclasses_of_the_packages() -> list[type[Any]]:
    found = []
    for package in (common, workq, shardmgr):
        for module_info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if module_info.name.endswith("__main__"):
                continue
            module = importlib.import_module(module_info.name)  # the test extra brings every package: no skip
            found += [obj for obj in vars(module).values() if isinstance(obj, type) and dataclasses.is_dataclass(obj)
                      and obj.__module__ == module.__name__]
    return found


def test_no_dataclass_shows_a_field_named_like_a_secret() -> None:
    checked, shown = 0, []
    for kind in dataclasses_of_the_packages():
        for field in dataclasses.fields(kind):  # field.type: the annotation's text (postponed annotations)
            # a secret is text or bytes; a cluster writer's fencing "token" (a Writer) is no secret
            if SECRET_NAME.search(field.name) and re.search(r"\b(str|bytes)\b", str(field.type)):
                checked += 1
                if field.repr:
                    shown.append(f"{kind.__module__}.{kind.__qualname__}.{field.name}")
    assert checked >= 3  # Dialer.token, TokenEntry.digest, the metrics port's sessions' digests
    assert not shown, f"secret-looking fields shown in reprs (use dataclasses.field(repr=False)): {shown}"


def holders(tmp_path: Path) -> list[object]:
    """Every object built with TOKEN that a user or the server holds."""
    tokens = tmp_path / "tokens"
    issued = add_token(tokens, "ingest", ["read", "write"])
    auth = Authenticator(tokens)
    rpc = RpcClient(("127.0.0.1", 1), token=TOKEN)
    dialer = Dialer(rpc.address, None, TOKEN, 1.0, 0.0, 1 << 20)
    frame = framing.Frame({"id": 1, "cmd": "auth", "args": {"token": TOKEN}}, {}, 64)
    made: list[object] = [rpc, dialer, frame, StoreClient(("127.0.0.1", 1), token=TOKEN),
                          QueueClient(("127.0.0.1", 1), token=TOKEN), Worker(("127.0.0.1", 1), "w1", token=TOKEN),
                          auth, auth._entries, auth.authenticate(issued), HttpAuth(lambda e, s: [], auth, port=7301)]
    from shardmgr.cluster.cluster_client import ClusterClient  # (the test extra brings the cluster extra)
    from shardmgr.cluster.config import NodeConfig
    from shardmgr.cluster.writer.forwarding import Forwarder

    forwarder = Forwarder(NodeConfig(), "n1", token=TOKEN)
    made += [ClusterClient("etcd://127.0.0.1:1/x", token=TOKEN), forwarder, forwarder._peers]
    return made + [issued]  # the last: the token file's token, whose hash must not show either


def test_objects_that_hold_a_token_do_not_show_it(tmp_path: Path) -> None:
    *objects, issued = holders(tmp_path)
    assert isinstance(issued, str)
    secrets = (TOKEN, issued, hash_token(issued)[len("sha256:"):], hash_token(TOKEN)[len("sha256:"):])
    for obj in objects:
        for shown in (repr(obj), str(obj), pretty_repr(obj)):
            assert not [s for s in secrets if s in shown], (type(obj), shown)
    assert "<hidden>" in repr(objects[2])  # the frame still says what it is


def test_refused_tokens_show_in_no_answer_error_or_log_line(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    reader, worker = add_token(tokens, "dashboard", ["read"]), add_token(tokens, "gpu", ["worker"])
    wrong = "smt_" + "W" * 43
    metrics = _free_port()
    server = ServerProcess(tmp_path / "data", "--auth-file", str(tokens), "--log-level", "DEBUG",
                           "--metrics-port", str(metrics)).start()
    texts: list[str] = []
    try:
        with RpcClient(("127.0.0.1", server.port), token=wrong, retry_for=0) as rpc, \
                pytest.raises(Unauthenticated) as refused:
            rpc.call("ping")
        texts.append(str(refused.value))
        with RpcClient(("127.0.0.1", server.port), token=None, retry_for=0) as rpc, \
                pytest.raises(Unauthenticated) as refused:
            rpc.call("ping")
        texts.append(str(refused.value))
        with RpcClient(("127.0.0.1", server.port), token=worker) as rpc, pytest.raises(Forbidden) as forbidden:
            rpc.call("stats")
        texts.append(str(forbidden.value))
        cli = subprocess.run([sys.executable, "-m", "shardmgr", "stats", "--port", str(server.port), "--timeout",
                              "1"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                             env={**os.environ, "SHARDMGR_TOKEN": wrong})
        assert cli.returncode == 1 and "not valid" in cli.stderr, cli.stderr
        texts += [cli.stdout, cli.stderr]
        for headers in ({"Authorization": f"Bearer {wrong}"}, {"Authorization": f"Bearer {worker}"}):
            texts.append(_http(f"http://127.0.0.1:{metrics}/metrics", headers))
        texts.append(_http(f"http://127.0.0.1:{metrics}/login", {}, f"token={wrong}".encode()))
        with RpcClient(("127.0.0.1", server.port), token=reader) as rpc:
            rpc.call("stats")  # a good one, logged at DEBUG as authenticated
    finally:
        server.kill()
    log = "\n".join(server.log)
    assert "authentication failed" in log and "refused a login" in log and "authenticated as dashboard" in log
    secrets = [wrong, reader, worker] + [hash_token(t)[len("sha256:"):] for t in (wrong, reader, worker)]
    for text in [*texts, log]:
        assert not [s for s in secrets if s in text], text


def _http(url: str, headers: dict[str, str], body: bytes | None = None) -> str:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=10) as answer:
            return str(answer.read().decode())
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.headers} {e.read().decode()}"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
