"""Instruction counting: what one request costs a server and its client in
instructions (callgrind's Ir), which other load on the machine does not
change the way it changes seconds.

A process to count is started under :func:`prefix` (``valgrind
--tool=callgrind --instr-atstart=no``): it runs uninstrumented until a
window turns instrumentation on with ``callgrind_control -i on PID``.
:func:`count` runs one window: a client child process (this file run as a
script, itself under callgrind) makes ``warmup`` requests, then both sides
are switched on, the child makes ``requests`` requests, both are switched
off and each dumps its counts (``callgrind_control -d LABEL``: a file
``OUT.K`` for the K-th dump, read at once). Without ``--separate-threads``
callgrind writes one file per process and dump, every thread summed, so a
server's reader, writer, owner and flusher threads all count.

Why these choices:

* The client child never blocks while a switch may be on its way: vgdb
  (behind callgrind_control) reaches a process blocked in a system call
  only through ptrace, which containers often refuse, so the child waits
  for its orders polling stdin every POLL_S; servers have timer threads
  that wake them anyway. A switch costs the child one or two polls
  (a few thousand Ir per window), not the fork and exec that running
  callgrind_control from the child itself would put inside its window.
* Servers keep ticking while counted: those timers run whatever the
  requests, for as long as the window lasts, so each server's idle rate
  (Ir/s, :func:`idle_rate`) is measured before each window and the count
  is also given less that rate over the window's seconds. ``shardmgr serve``
  is counted with a flush interval of FLUSH_INTERVAL_MS: at the default
  5 ms the idle flusher's rounds (~35k Ir each, 200 a second) add 7-10 %
  to a ``ping`` here under valgrind's slowdown, and vary with the load;
  durable calls start their own round (they hurry the flusher), so their
  work is counted either way.

Usage (library): see tools/bench_rpc.py and tools/bench_workq.py,
``--callgrind``.
"""

from __future__ import annotations

import importlib
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.table import Table

from shardmgr.build import describe

CONTROL_TIMEOUT_S = 120.0  # one callgrind_control call: ~0.1 s here
START_TIMEOUT_S = 600.0  # a server or client under valgrind is ready in ~4 s here; a loaded CI machine is slower
STOP_TIMEOUT_S = 120.0  # from SIGTERM (or the child's EOF) to exit
REQUEST_TIMEOUT_S = 0.5  # per request in a window (~1 ms here), plus START_TIMEOUT_S
POLL_S = 0.05  # how often a waiting client child looks at stdin (see the module docstring)
IDLE_S = 2.0  # how long an idle server is counted: several rounds of each of its timers
FLUSH_INTERVAL_MS = "1000"  # for `shardmgr serve --flush-interval-ms` (module docstring)

#: what a client child runs: "module:function", the function taking the server's "host:port" and
#: returning the one-request call (module importable from tools/)
Factory = Callable[[str], Callable[[], object]]


def missing() -> str | None:
    """Why instructions cannot be counted here (a tool not on PATH), or None."""
    absent = [tool for tool in ("valgrind", "callgrind_control") if shutil.which(tool) is None]
    return f"{' and '.join(absent)} not on PATH (Debian: apt-get install valgrind)" if absent else None


def prefix(out: Path) -> list[str]:
    """The command line before a program's own: callgrind, instrumentation off, counts to ``out``
    (``out.1``, ``out.2``, ... per dump), valgrind's messages to ``out.valgrind``, not the program's stderr."""
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
            f"--log-file={out}.valgrind"]


def totals(path: Path) -> int:
    """The instructions a callgrind output file counts (its ``totals:``, else ``summary:`` line)."""
    lines = path.read_text().splitlines()
    for key in ("totals:", "summary:"):
        found = [line.split()[1] for line in lines if line.startswith(key)]
        if found:
            return int(found[-1])
    raise ValueError(f"{path}: no totals: or summary: line")


class Counted:
    """A process started under :func:`prefix` (``out``): instrumentation switched and dumped by PID."""

    def __init__(self, proc: subprocess.Popen[bytes], out: Path) -> None:
        self.proc, self.out = proc, out
        self._dumps = 0

    def control(self, *args: str) -> None:
        """Run ``callgrind_control ARGS PID``; RuntimeError if it fails or takes CONTROL_TIMEOUT_S."""
        try:
            done = subprocess.run(["callgrind_control", *args, str(self.proc.pid)], capture_output=True,
                                  text=True, timeout=CONTROL_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"callgrind_control {' '.join(args)} {self.proc.pid}: no answer in "
                               f"{CONTROL_TIMEOUT_S:g} s (every thread blocked and no ptrace for vgdb?)") from None
        if done.returncode != 0 or "OK" not in done.stdout:
            raise RuntimeError(f"callgrind_control {' '.join(args)} {self.proc.pid} failed: "
                               f"{done.stdout.strip()} {done.stderr.strip()}")

    def on(self) -> None:
        self.control("-i", "on")

    def off(self) -> None:
        self.control("-i", "off")

    def dump(self, label: str) -> int:
        """Dump the counts since the last dump as ``label``; the instructions in them."""
        self.control("-d", label)
        self._dumps += 1
        path = Path(f"{self.out}.{self._dumps}")
        if f"Trigger: dump {label}\n" not in path.read_text():  # a dump we did not ask for would shift the names
            raise RuntimeError(f"{path} is not the dump {label!r}")
        return totals(path)

    def stop(self) -> int:
        """SIGTERM by PID and wait for the exit (its status); SIGKILL and RuntimeError after STOP_TIMEOUT_S."""
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.wait()

    def __enter__(self) -> Counted:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wait(self) -> int:
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"pid {self.proc.pid} did not exit within {STOP_TIMEOUT_S:g} s: killed") from None


def idle_rate(server: Counted, label: str, seconds: float = IDLE_S) -> float:
    """The instructions per second ``server`` runs with no requests: its timer threads."""
    server.on()
    started = time.perf_counter()
    time.sleep(seconds)
    server.off()
    elapsed = time.perf_counter() - started
    return server.dump(label) / elapsed


class Client:
    """A client child under callgrind: ``factory``'s call, ``warmup`` times at start, then as told."""

    def __init__(self, factory: str, address: str, warmup: int, out: Path) -> None:
        self.log = Path(f"{out}.stderr")
        with open(self.log, "wb") as stderr:  # the child's messages, shown if it fails
            proc = subprocess.Popen([*prefix(out), sys.executable, __file__, factory, address, str(warmup)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr)
        self.counted = Counted(proc, out)
        self._expect("ready", START_TIMEOUT_S + warmup * REQUEST_TIMEOUT_S)

    def run(self, requests: int) -> None:
        """Make ``requests`` requests; returns once they are answered."""
        assert self.counted.proc.stdin is not None
        self.counted.proc.stdin.write(f"{requests}\n".encode())
        self.counted.proc.stdin.flush()
        self._expect("done", START_TIMEOUT_S + requests * REQUEST_TIMEOUT_S)

    def close(self) -> None:
        """EOF on its stdin: the child exits (bounded wait)."""
        if self.counted.proc.stdin is not None:
            self.counted.proc.stdin.close()
        self.counted.wait()

    def _expect(self, word: str, timeout: float) -> None:
        stdout = self.counted.proc.stdout
        assert stdout is not None
        line = _line(stdout, timeout)
        if line != word:
            self.counted.proc.kill()
            self.counted.proc.wait()
            valgrind = Path(f"{self.counted.out}.valgrind")
            raise RuntimeError(f"client child said {line!r}, not {word!r}:\n{self.log.read_text()[-3000:]}\n"
                               f"{valgrind.read_text()[-1000:] if valgrind.exists() else ''}")


def _line(stream: IO[bytes], timeout: float) -> str:
    """One line from a pipe within ``timeout`` seconds ('' at EOF or timeout); unbuffered, so select sees it all."""
    fd, data, deadline = stream.fileno(), b"", time.monotonic() + timeout
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return ""
        chunk = os.read(fd, 1)
        if not chunk:
            return ""
        data += chunk
    return data.decode().strip()


@dataclass(frozen=True)
class Window:
    """One counted window: ``requests`` requests, each side's instructions in it."""

    label: str
    what: str
    requests: int
    server_ir: int
    client_ir: int
    seconds: float  # the server's counted time (under valgrind)
    server_idle_ir_per_s: float
    calls: int = 1  # client calls per request

    @property
    def server_per_request(self) -> float:
        return self.server_ir / self.requests

    @property
    def client_per_request(self) -> float:
        return self.client_ir / self.requests

    @property
    def client_per_call(self) -> float:
        return self.client_ir / (self.requests * self.calls)

    @property
    def idle_share(self) -> float:
        """How much of the server's count its timers may account for (idle rate x window time)."""
        return self.server_idle_ir_per_s * self.seconds / self.server_ir if self.server_ir else 0.0

    @property
    def server_less_idle_per_request(self) -> float:
        """The server's count less its idle rate over the window: the part that does not grow with
        the window's seconds (a slower disk or a busier machine), an estimate."""
        return self.server_per_request * (1.0 - self.idle_share)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "server_ir_per_request": self.server_per_request,
                "server_ir_per_request_less_idle": self.server_less_idle_per_request,
                "client_ir_per_request": self.client_per_request, "client_ir_per_call": self.client_per_call,
                "idle_share": self.idle_share}


def count(server: Counted, factory: str, address: str, out_dir: Path, *, label: str, what: str,
          warmup: int, requests: int, calls: int = 1, idle_s: float = IDLE_S) -> Window:
    """The server's idle rate (over ``idle_s``); then, in a client child, ``warmup`` of ``factory``'s
    calls, and ``requests`` more counted on both sides. ``calls``: client calls per request, for the tables."""
    idle_ir_per_s = idle_rate(server, f"{label}-idle", idle_s)
    client = Client(factory, address, warmup, out_dir / f"{label}.client")
    try:
        server.on()  # first on, last off: the server is idle while the client is being switched
        started = time.perf_counter()
        client.counted.on()
        client.run(requests)
        client.counted.off()
        seconds = time.perf_counter() - started
        server.off()
        server_ir, client_ir = server.dump(label), client.counted.dump(label)
    finally:
        client.close()
    return Window(label, what, requests, server_ir, client_ir, seconds, idle_ir_per_s, calls)


def report(windows: Sequence[Window]) -> dict[str, Any]:
    """The windows and the build they measured, for emit()."""
    return {"build": describe(), "windows": [w.as_dict() for w in windows]}


def show(results: dict[str, Any], title: str, baseline: str | None = None) -> None:
    """The windows as a table; ``baseline``: the label whose server count the others are divided by."""
    rows = results["windows"]
    base = next((r["server_ir_per_request"] for r in rows if r["label"] == baseline), None)
    per_call = any(r["calls"] > 1 for r in rows)
    table = Table(title=f"{title}: instructions (callgrind Ir) per request, build {results['build']}; warm-up not "
                        "counted; less idle: less the idle server's rate (its timers) over the window's seconds")
    columns = ["what", "requests", "server Ir/request", "server, less idle", *(["server / baseline"] if base else []),
               "client Ir/request", *(["client Ir/call"] if per_call else []), "s counted"]
    for col in columns:
        table.add_column(col, justify="right")
    for r in rows:
        cells = [r["what"], f"{r['requests']:,}", f"{r['server_ir_per_request']:,.0f}",
                 f"{r['server_ir_per_request_less_idle']:,.0f}"]
        cells += [f"{r['server_ir_per_request'] / base:.2f}"] if base else []
        cells += [f"{r['client_ir_per_request']:,.0f}"]
        cells += [f"{r['client_ir_per_call']:,.0f}"] if per_call else []
        table.add_row(*cells, f"{r['seconds']:.1f}")
    Console(width=max(Console().width, 120)).print(table)


def _child(factory: str, address: str, warmup: int) -> None:
    """The client child: ``warmup`` calls, 'ready'; then per line N on stdin, N calls and 'done'; EOF ends it."""
    module, name = factory.split(":")
    make: Factory = getattr(importlib.import_module(module), name)
    call = make(address)
    for _ in range(warmup):
        call()
    _say("ready")
    while True:
        while not select.select([sys.stdin], [], [], POLL_S)[0]:  # polling, not blocking (module docstring)
            pass
        line = sys.stdin.readline()
        if not line:
            return
        for _ in range(int(line)):
            call()
        _say("done")


def _say(word: str) -> None:
    sys.stdout.write(word + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
