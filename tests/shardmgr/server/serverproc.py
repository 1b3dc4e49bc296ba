"""Run ``shardmgr serve`` as a real subprocess for tests."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

READY = re.compile(r"ready: listening on ([\d.]+):(\d+)")


class ServerProcess:
    """A ``python -m shardmgr serve`` child on a free loopback port."""

    def __init__(self, data_dir: Path, *extra: str, port: int = 0) -> None:
        self.data_dir = data_dir
        self.extra = extra
        self.port = port
        self.proc: subprocess.Popen[str] | None = None
        self.log: list[str] = []
        self._ready = threading.Event()

    def start(self, timeout: float = 60.0) -> ServerProcess:
        self._ready.clear()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shardmgr", "serve", "--data", str(self.data_dir), "--port", str(self.port),
             *self.extra], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()
        deadline = time.monotonic() + timeout
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:  # exited, or stuck
                self.kill()
                time.sleep(0.1)  # let the pump read the last lines
                raise RuntimeError("server did not become ready:\n" + "\n".join(self.log))
        return self

    def _pump(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            self.log.append(line.rstrip())
            match = READY.search(line)
            if match:
                self.port = int(match.group(2))  # keep the port across restarts
                self._ready.set()

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
