"""Interpreted Python calls the server makes per one-item work item (issue 24).

In the compiled build nothing on a request's way should run as Python
bytecode; what still does (a generated dataclass ``__init__``, the standard
library's ``threading`` classes, an uncompiled module) shows here by name.
A ``shardmgr serve`` runs under this script's own wrapper, which installs a
``sys.setprofile`` counter on every thread; after 1,000 durable enqueues and
50 warm-up work items it counts the Python function calls of N one-item work
items (lease + durable complete, as ``bench_workq.py --callgrind``) and
prints them per item, most first. For a method of ``threading`` it names the
class whose object holds the lock or event (found with ``gc``), so that
``Condition.__enter__`` of the flusher and of a connection show apart.
The counter slows the server several fold: count calls here, time elsewhere.

  PYTHONPATH=. python tools/pycalls.py [--items N] [--top K]
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import runpy
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

WARMUP = 50
ENQUEUED_MORE = 50  # items left over after the counted ones: a lease never waits


def _owner(obj: object) -> str:
    """The classes of the objects that hold ``obj`` as an attribute (native or with a __dict__)."""
    names = set()
    for ref in gc.get_referrers(obj):
        if isinstance(ref, dict):
            names.update(type(holder).__qualname__ for holder in gc.get_referrers(ref)
                         if getattr(holder, "__dict__", None) is ref)
        elif not isinstance(ref, (list, tuple, set, FrameType)) and type(ref).__module__ != "builtins":
            names.add(type(ref).__qualname__)
    return ",".join(sorted(names)) or "?"


def _install(out: str) -> None:
    """Count calls between SIGUSR1 and SIGUSR2; SIGUSR2 writes them to ``out``."""
    counting = [False]
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    held: dict[int, object] = {}  # threading objects seen, kept alive until the dump names their owner

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if not counting[0] or event != "call":
            return
        code = frame.f_code
        where = f"{code.co_filename}:{code.co_firstlineno}:{code.co_name}"
        owner = ""
        if code.co_filename == threading.__file__ and code.co_varnames[:1] == ("self",):
            obj = frame.f_locals.get("self")
            held[id(obj)] = obj
            owner = str(id(obj))
        counts[(where, owner)] += 1

    def start(*_: object) -> None:
        counts.clear()
        counting[0] = True
        Path(out + ".on").touch()  # the driver waits for this before its counted calls

    def dump(*_: object) -> None:
        counting[0] = False
        with open(out, "w") as file:
            for (where, owner), n in counts.most_common():
                obj = held.get(int(owner)) if owner else None
                named = "" if obj is None else f"{type(obj).__name__} of {_owner(obj)}"
                file.write(f"{n}\t{where}\t{named}\n")

    sys.setprofile(profile)
    threading.setprofile(profile)
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, dump)


def wrapped(out: str, argv: list[str]) -> None:
    """Run ``python -m MODULE ARGS`` (``argv``, as Workq.start builds it) under the counter."""
    if argv[1:2] != ["-m"]:
        raise SystemExit(f"pycalls: expected 'python -m MODULE ...', got {argv}")
    _install(out)
    sys.argv = [argv[2], *argv[3:]]
    runpy.run_module(argv[2], run_name="__main__", alter_sys=True)


def _wait_for(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    """Poll until the server's signal handler has done its part (it runs on the main thread's next poll)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"pycalls: the server did not answer its signal within {seconds} s")
        time.sleep(0.05)


def count(items: int) -> list[tuple[float, str, str]]:
    """Per-item interpreted calls of ``items`` one-item work items: (calls, function, owner)."""
    from bench_workq import enqueue_one, lease_complete_one
    from peer_workq import Workq

    base = Path(tempfile.mkdtemp(prefix="pycalls-", dir=os.environ.get("BENCH_DIR")))
    out = base / "calls.tsv"
    driver = Workq()
    try:
        driver.start(base, (sys.executable, __file__, "--wrapped", str(out)))
        enqueue = enqueue_one(driver.address)
        for _ in range(WARMUP + items + ENQUEUED_MORE):
            enqueue()
        cycle = lease_complete_one(driver.address)
        for _ in range(WARMUP):
            cycle()
        os.kill(driver.proc.pid, signal.SIGUSR1)
        _wait_for(lambda: Path(str(out) + ".on").exists())
        for _ in range(items):
            cycle()
        os.kill(driver.proc.pid, signal.SIGUSR2)
        _wait_for(lambda: out.exists() and out.stat().st_size > 0)
        rows = [line.rstrip("\n").split("\t") for line in out.read_text().splitlines()]
    finally:
        driver.proc.terminate()
        driver.proc.wait(60)
        shutil.rmtree(base, ignore_errors=True)
    return [(int(n) / items, where, owner) for n, where, owner in rows]


def show(rows: list[tuple[float, str, str]], top: int) -> None:
    from rich.console import Console
    from rich.table import Table

    import shardmgr.build

    table = Table(title=f"interpreted calls per one-item work item, server, build {shardmgr.build.describe()}; "
                        f"total {sum(r[0] for r in rows):.1f}")
    for column in ("per item", "function", "object of"):
        table.add_column(column, justify="right" if column == "per item" else "left")
    prefix = os.path.dirname(threading.__file__) + os.sep
    for per_item, where, owner in rows[:top]:
        table.add_row(f"{per_item:.2f}", where.replace(prefix, "").replace(os.getcwd() + os.sep, ""), owner)
    Console().print(table)


def main() -> None:
    if sys.argv[1:2] == ["--wrapped"]:
        wrapped(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1000, help="counted work items")
    parser.add_argument("--top", type=int, default=30, help="rows shown")
    args = parser.parse_args()
    if args.items < 1:
        parser.error("--items must be at least 1")
    show(count(args.items), args.top)


if __name__ == "__main__":
    main()
