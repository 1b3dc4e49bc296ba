"""The ``shardmgr`` command line, stopping for good at one point of a snapshot, to be SIGKILLed there.

Usage: ``python -m tests.shardmgr.snapshot_child POINT N READY ARGS...``
(from the repository's root, so that this tree's packages are imported).

``POINT`` is ``module:name``, a function a snapshot calls through that
module (``shardmgr.store.copies:link_or_copy``), or ``module:os.name`` for an
``os`` function it calls (``shardmgr.snapshots:os.rename``,
``common.journal.copying:os.copy_file_range``). At the ``N``-th call (from
1), before it runs, the child writes ``READY`` and then sleeps until it is
killed, holding whatever locks the caller holds; every other call runs as
usual. ``ARGS`` are the command's (``snapshot DEST --data DIR``, ``serve
...``). File copies go in 16 KiB pieces (``CHUNK``), so that a stop in
``copy_file_range`` can land inside a file.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any


class _Os:
    """A module's view of ``os`` with one function replaced."""

    def __init__(self, name: str, function: Callable[..., Any]) -> None:
        self._name, self._function = name, function

    def __getattr__(self, attribute: str) -> Any:
        return self._function if attribute == self._name else getattr(os, attribute)


def stop_at(point: str, n: int, ready: Path) -> None:
    """Replace ``point`` so that its ``n``-th call stops the calling thread for good."""
    module_name, name = point.split(":")
    module: ModuleType = importlib.import_module(module_name)
    in_os = name.startswith("os.")
    real = getattr(os, name[3:]) if in_os else getattr(module, name)
    calls = 0
    lock = threading.Lock()

    def stopping(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        with lock:
            calls += 1
            now = calls
        if now == n:
            ready.write_text(f"{point} {n}\n")
            while True:
                time.sleep(60)
        return real(*args, **kwargs)

    if in_os:
        module.os = _Os(name[3:], stopping)  # type: ignore[attr-defined]
    else:
        setattr(module, name, stopping)


def main() -> None:
    point, n, ready = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    import common.journal.copying as copying

    copying.CHUNK = 16 << 10
    stop_at(point, n, ready)
    from shardmgr.cli import main as cli

    cli(args=sys.argv[4:], prog_name="shardmgr")


if __name__ == "__main__":
    main()
