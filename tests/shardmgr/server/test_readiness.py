"""``shardmgr serve --ready-file``: written once the port is open, never
stale, gone after a clean stop; and readiness.wait, its reader."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from common.journal.lockfile import LockFile
from common.wire.client import RpcClient
from common.wire.component import Component, Request
from shardmgr.server import readiness
from shardmgr.server.config import ServerConfig
from shardmgr.server.server import Server


def serve(data: Path, ready: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "shardmgr", "serve", "--data", str(data), "--port", "0",
                             "--ready-file", str(ready)], stderr=subprocess.PIPE, text=True)


def test_port_0_is_usable_through_the_ready_file_which_sigterm_removes(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    proc = serve(tmp_path / "data", ready)
    try:
        host, port = readiness.wait(ready, proc, timeout=60)
        assert port != 0 and json.loads(ready.read_text()) == {"host": host, "port": port, "pid": proc.pid}
        with RpcClient((host, port), timeout=10) as client:
            assert client.call("ping").result == {}
        assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []  # renamed, not copied
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert not ready.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


class Blocked(Component):
    """Recovers only when released, so a test can look at the ready file meanwhile."""

    name = "blocked"

    def __init__(self) -> None:
        self.recovering = threading.Event()
        self.release = threading.Event()

    def commands(self) -> Iterable[str]:
        return ()

    def recover(self) -> None:
        self.recovering.set()
        assert self.release.wait(30)

    def handle(self, request: Request) -> None:
        raise AssertionError("no commands")


def test_a_stale_ready_file_is_removed_before_recovery(tmp_path: Path) -> None:
    ready = tmp_path / "ready.json"
    ready.write_text(json.dumps({"host": "127.0.0.1", "port": 1, "pid": os.getpid()}))  # as a SIGKILLed server left it
    config = ServerConfig.load(data_dir=tmp_path / "data", port=0, ready_file=str(ready))
    assert config.ready_file == ready
    blocked = Blocked()
    server = Server(config, [blocked])
    starting = threading.Thread(target=server.start)
    starting.start()
    try:
        assert blocked.recovering.wait(30)
        assert not ready.exists()  # recovering: not ready, and no leftover says otherwise
        blocked.release.set()
        starting.join(30)
        assert readiness.read(ready) == {"host": "127.0.0.1", "port": server.address[1], "pid": os.getpid()}
    finally:
        blocked.release.set()
        starting.join(30)
        server.stop()
    assert not ready.exists()


def test_wait_fails_fast_with_the_log_and_ignores_another_process_file(tmp_path: Path) -> None:
    data, ready = tmp_path / "data", tmp_path / "ready.json"
    data.mkdir()
    ready.write_text(json.dumps({"host": "127.0.0.1", "port": 1, "pid": os.getpid()}))  # the lock holder's
    lock = LockFile(data)
    lock.acquire()
    try:
        proc = serve(data, ready)
        started = time.monotonic()
        with pytest.raises(readiness.NotReady, match="(?s)exited with status 1.*in use by another process"):
            readiness.wait(ready, proc, timeout=60)
        assert time.monotonic() - started < 30
        assert ready.exists()  # a server refused the lock leaves the holder's file alone
    finally:
        lock.release()


def test_wait_times_out_on_a_process_that_never_gets_ready(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(readiness.NotReady, match="not ready after 0.3 s; its log:\nnothing yet"):
            readiness.wait(tmp_path / "ready.json", proc, timeout=0.3, log=lambda: "nothing yet")
        assert proc.poll() is None  # left running: the caller decides
    finally:
        proc.kill()
        proc.wait(30)
