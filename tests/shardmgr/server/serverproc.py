"""Run ``shardmgr serve`` as a real subprocess for tests."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from shardmgr.server import readiness


class ServerProcess:
    """A ``python -m shardmgr serve`` child on a free loopback port.

    Readiness comes from its ``--ready-file`` (a sibling of the data
    directory); its stderr is collected in ``log``. ``program``: what runs
    after the interpreter instead of ``-m shardmgr`` (a test's wrapper of
    the command line, e.g. tests/shardmgr/snapshot_child.py).
    """

    def __init__(self, data_dir: Path, *extra: str, port: int = 0,
                 program: Sequence[str] = ("-m", "shardmgr"), env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.extra = extra
        self.env = dict(env or {})  # added to this process's environment
        self.port = port
        self.program = tuple(program)
        self.ready_file = data_dir.with_name(data_dir.name + ".ready")
        self.proc: subprocess.Popen[str] | None = None
        self.log: list[str] = []
        self._pump_thread: threading.Thread | None = None

    def start(self, timeout: float = 60.0) -> ServerProcess:
        """Start the server and return once it is ready; the port it bound is
        kept for restarts. NotReady (with the log) if it exits or hangs."""
        self.proc = subprocess.Popen(
            [sys.executable, *self.program, "serve", "--data", str(self.data_dir), "--port", str(self.port),
             "--ready-file", str(self.ready_file), *self.extra], stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
        self._pump_thread = threading.Thread(target=self._pump, args=(self.proc,), daemon=True)
        self._pump_thread.start()
        try:
            _, self.port = readiness.wait(self.ready_file, self.proc, timeout, log=self._log_text)
        except readiness.NotReady:
            self.kill()
            raise
        return self

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.log.append(line.rstrip())

    def _log_text(self) -> str:
        """The log so far; once the process has exited, all of it (the pump reads to the end)."""
        if self.proc is not None and self.proc.poll() is not None and self._pump_thread is not None:
            self._pump_thread.join(5)
        return "\n".join(self.log)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def wait_log_count(self, pattern: str, count: int, timeout: float = 10.0) -> list[str]:
        """Wait until ``count`` log lines match ``pattern``; returns them."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in list(self.log) if re.search(pattern, line)]
            if len(found) >= count:
                return found
            time.sleep(0.02)
        raise AssertionError(f"fewer than {count} log lines matching {pattern!r}:\n" + "\n".join(self.log))

    def restart(self) -> ServerProcess:
        self.kill()
        return self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_log(self, pattern: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log:
                if re.search(pattern, line):
                    return line
            time.sleep(0.02)
        raise AssertionError(f"no log line matching {pattern!r}:\n" + "\n".join(self.log))


class RepeatedKills:
    """SIGKILL and restart ``server`` every 0.2-0.7 s (drawn from ``rng``) on a
    thread, from ``with`` until its end; ``count`` says how many kills landed."""

    def __init__(self, server: ServerProcess, rng: random.Random) -> None:
        self.server = server
        self.rng = rng
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        while not self._stop.wait(self.rng.uniform(0.2, 0.7)):
            self.server.signal(signal.SIGKILL)
            self.server.wait()
            self.count += 1
            self.server.start()

    def __enter__(self) -> RepeatedKills:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
