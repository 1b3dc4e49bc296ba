"""Which modules the package's build compiles, and which this install runs compiled.

``pip install .`` (setup.py) compiles the modules of :data:`COMPILED`
with mypyc: the same typed source as the pure-Python modules, built into
extension modules that Python's import system prefers to the ``.py``
beside them. ``SHARDMGR_BUILD=pure pip install .`` compiles nothing. A
machine without a C compiler gets the pure modules either way (each
extension is optional: the build warns and goes on).

setup.py reads this file with ``runpy`` before the package can be imported:
it imports nothing of the project.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os

BUILD_VARIABLE = "SHARDMGR_BUILD"
"""The environment variable that chooses the build: ``compiled`` (the default) or ``pure``."""
BUILDS = ("compiled", "pure")


def wanted() -> str:
    """The build :data:`BUILD_VARIABLE` asks for; ValueError naming the choices if it is neither."""
    build = os.environ.get(BUILD_VARIABLE, "") or BUILDS[0]
    if build not in BUILDS:
        raise ValueError(f"{BUILD_VARIABLE}={build!r}: expected one of {', '.join(BUILDS)}")
    return build


GROUP = "common.compiled"
"""mypyc's group: the one shared library that holds all the compiled code
(``common/compiled__mypyc.*.so``; each module of :data:`COMPILED` keeps a
small extension of its own name that loads it)."""
LIBRARY = GROUP + "__mypyc"


COMPILED: tuple[str, ...] = (
    # the journal: its reads, appends, marker changes and group commit
    "common.journal.anchors",
    "common.journal.appending",
    "common.journal.flusher",
    "common.journal.header",
    "common.journal.journal",
    "common.journal.leader",
    "common.journal.mapping",
    "common.journal.marker",
    "common.journal.marking",
    "common.journal.reader",
    "common.journal.record",
    "common.journal.syncer",
    "common.journal.writing",
    # frames, the component contract
    "common.wire.budget",
    "common.wire.client",  # RpcClient: both builds refuse the same wrong types (docs/architecture.md)
    "common.wire.component",
    "common.wire.deadlines",
    "common.wire.frame_reader",
    "common.wire.framing",
    "common.wire.part_views",
    "common.wire.pipeline",
    "common.wire.reply_batch",
    # the flag the flusher, the queue loop and the server's dispatch check on every request
    "common.wakeup",
    # the server's connections and dispatch
    "shardmgr.server.auth",
    "shardmgr.server.connection",
    "shardmgr.server.control",
    "shardmgr.server.outbox",
    "shardmgr.server.sending",
    "shardmgr.server.server",
    # the queue: its owner loop, waiting calls, worker side, state machine and files. Not the public
    # API (Broker, QueueClient, Worker): compiled, a typed parameter refuses a wrong type
    # with TypeError where the pure module answers BadRequest, and the two builds must not disagree
    # (the worker side takes a caller's counts and seconds as objects and checks them: calls.py)
    "workq.answer",
    "workq.calls",
    "workq.delivery",
    "workq.enqueues",
    "workq.loop",
    "workq.protocol",
    "workq.service",
    "workq.totals",
    "workq.waiters",
    "workq.worker_side",
    "workq.disk.catalog",
    "workq.disk.completion_log",
    "workq.disk.picks",
    "workq.disk.records",
    "workq.disk.segment",
    "workq.state.collector",
    "workq.state.completion",
    "workq.state.dispatch",
    "workq.state.items",
    "workq.state.lease_table",
    "workq.state.leasing",
    "workq.state.queue",
    "workq.state.stats",
)
"""Modules on the per-request path (docs/architecture.md, "The compiled build")."""


def compiled_modules() -> dict[str, bool]:
    """Each module of :data:`COMPILED`: True if this install loads it from an
    extension module (found, not imported)."""
    found = {}
    for name in COMPILED:
        spec = importlib.util.find_spec(name)
        found[name] = spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)
    return found


def describe() -> str:
    """``compiled (mypyc, N modules)``, ``pure Python``, or ``mixed: K of N compiled``."""
    found = compiled_modules()
    compiled = sum(found.values())
    if compiled == len(found):
        return f"compiled (mypyc, {compiled} modules)"
    if compiled == 0:
        return "pure Python"
    return f"mixed: {compiled} of {len(found)} modules compiled"
