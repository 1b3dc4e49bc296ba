"""workq: a durable work queue for inference fleets, on the shared journal layer.

Embedded::

    broker = workq.open("data")              # recovers, then serves from this process
    handles = broker.enqueue("job-1", "llama-7b", "chat", 512, payloads, durable=True)

Over the network (``shardmgr serve`` hosts it)::

    client = workq.connect("127.0.0.1:7300")
    worker = workq.Worker("127.0.0.1:7300", "gpu-3", models=["llama-7b"])

The package: ``protocol`` (what crosses the wire, shared by both sides),
``broker`` (the one API of every queue operation, under its owner lock:
``loop``; calls parked until they can be answered: ``waiters``; results in
flight: ``delivery``), ``state/`` (the in-memory state
machine), ``disk/`` (the files), ``service`` (the server component),
``client`` and ``worker`` (network clients), ``config``, ``errors``,
``testing`` (crash a broker in tests), ``shadowing`` (imported first: is
``common`` the project's?).

May import: ``common``; never ``shardmgr``. The clients import only
``protocol``, ``errors`` and ``common.wire``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from . import shadowing  # noqa: F401 - first: is 'common' the project's?

# isort: split
from common.journal import FlusherConfig

from .broker import Broker
from .client import QueueClient
from .config import WorkqConfig
from .errors import (
    DiskFull,
    NotLeased,
    PayloadTooLarge,
    ResultsNotRecorded,
    UnknownHandle,
    UnknownJob,
    WorkerIdInUse,
    WorkqError,
)
from .protocol import Handle, Item, Key, Result
from .worker import Worker


def open(data_dir: str | Path, config: WorkqConfig | None = None, *,  # noqa: A001 - the public name is fixed
         flusher: FlusherConfig | None = None, **fields: Any) -> Broker:
    """Open (and recover) the work queue in ``data_dir``. ``config`` and
    ``flusher`` are the typed settings ``shardmgr serve`` uses too
    (``ServerConfig.workq`` and ``ServerConfig.flusher``); ``fields``
    override single WorkqConfig fields."""
    base = config or WorkqConfig()
    return Broker(data_dir, dataclasses.replace(base, **fields), flusher=flusher).open()


def connect(address: str, **options: Any) -> QueueClient:
    """A producer/consumer client of a ``shardmgr serve`` process at ``host:port``."""
    return QueueClient(address, **options)


__all__ = [
    "open", "connect", "Broker", "QueueClient", "Worker", "WorkqConfig", "Item", "Result", "Handle", "Key",
    "WorkqError", "UnknownHandle", "NotLeased", "UnknownJob", "PayloadTooLarge", "DiskFull",
    "ResultsNotRecorded", "WorkerIdInUse",
]
