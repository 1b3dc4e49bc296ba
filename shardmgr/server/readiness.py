"""The readiness file of ``shardmgr serve --ready-file PATH``.

The server removes a stale PATH once it holds the data directory's lock
(before recovery, so a leftover file is never taken for readiness), writes
PATH after its listening socket is open, and removes it on a clean stop.
The file is JSON, ``{"host": str, "port": int, "pid": int}``: the address
actually bound (so ``--port 0`` is usable) and the server's process id.

:func:`write` is the server's side; :func:`wait` is the side of whoever
started the server (tests, benchmarks): no log parsing.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common.journal.filesystem import replace_atomically


class NotReady(RuntimeError):
    """The server exited, or did not become ready in time; the message
    carries its log when one is available."""


def write(path: Path, host: str, port: int) -> None:
    """Write ``path`` atomically (a reader sees the whole file or none of it)."""
    replace_atomically(path, json.dumps({"host": host, "port": port, "pid": os.getpid()}).encode())


def remove(path: Path) -> None:
    """Remove ``path`` if it exists."""
    path.unlink(missing_ok=True)


def read(path: Path) -> dict[str, Any] | None:
    """The readiness record in ``path``, or None if there is none (or it is
    not one: a stranger's file is not readiness)."""
    try:
        record = json.loads(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(record, dict) or not {"host", "port", "pid"} <= record.keys():
        return None
    return record


def wait(path: Path, proc: subprocess.Popen[Any], timeout: float = 60.0, *,
         log: Callable[[], str] | None = None, poll: float = 0.02) -> tuple[str, int]:
    """Poll until the server ``proc`` has written ``path``; its (host, port).

    Only a file naming ``proc``'s pid counts, so a file left by an earlier
    server (SIGKILLed, say) is never mistaken for this one's readiness.
    Raises NotReady as soon as ``proc`` exits, or after ``timeout`` seconds
    (``proc`` is left running then). The message ends with ``log()`` if
    given, else with ``proc``'s stderr if it is a pipe and ``proc`` exited.
    """
    deadline = time.monotonic() + timeout
    while True:
        record = read(path)
        if record is not None and record["pid"] == proc.pid:
            return str(record["host"]), int(record["port"])
        status = proc.poll()
        if status is not None:
            raise NotReady(f"the server exited with status {status} before it was ready{_log(proc, log)}")
        if time.monotonic() > deadline:
            raise NotReady(f"the server was not ready after {timeout:g} s{_log(proc, log)}")
        time.sleep(poll)


def _log(proc: subprocess.Popen[Any], log: Callable[[], str] | None) -> str:
    if log is not None:
        text = log()
    elif proc.stderr is not None and proc.poll() is not None:  # the pipe ends with the process: no blocking
        raw = proc.stderr.read()
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    else:
        return ""
    return f"; its log:\n{text.rstrip()}" if text.strip() else "; its log is empty"
