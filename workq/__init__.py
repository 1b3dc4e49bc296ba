"""workq: a durable work queue for inference fleets, on the shared journal layer.

Embedded::

    broker = workq.open("data")              # recovers, then serves from this process
    handles = broker.enqueue("job-1", "llama-7b", "chat", 512, payloads, durable=True)

Over the network (``shardmgr serve`` hosts it)::

    client = workq.connect("127.0.0.1:7300")
    worker = workq.Worker("127.0.0.1:7300", "gpu-3", models=["llama-7b"])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .broker import Broker, Item, Result
from .client import QueueClient
from .config import WorkqConfig
from .errors import DiskFull, NotLeased, PayloadTooLarge, ResultsNotRecorded, UnknownHandle, UnknownJob, WorkqError
from .protocol import Handle, Key
from .worker import Worker


def open(data_dir: str | Path, **config: Any) -> Broker:  # noqa: A001 - the public name is fixed
    """Open (and recover) the work queue in ``data_dir``; ``config`` are WorkqConfig fields."""
    return Broker(data_dir, WorkqConfig(**config)).open()


def connect(address: str, **options: Any) -> QueueClient:
    """A producer/consumer client of a ``shardmgr serve`` process at ``host:port``."""
    return QueueClient(address, **options)


__all__ = [
    "open", "connect", "Broker", "QueueClient", "Worker", "WorkqConfig", "Item", "Result", "Handle", "Key",
    "WorkqError", "UnknownHandle", "NotLeased", "UnknownJob", "PayloadTooLarge", "DiskFull",
    "ResultsNotRecorded",
]
