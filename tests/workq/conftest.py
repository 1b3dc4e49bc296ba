from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import workq
from tests.shardmgr.server.serverproc import ServerProcess
from workq import Broker

#: A server for API tests: leases outlive them, a dropped worker's end soon, no reconnect window.
QUEUE_SERVER_CONFIG = ("[workq]\nlease_s = 30.0\ndisconnect_grace_s = 0.5\nreconnect_window_s = 0.0\n"
                       "disk_floor_bytes = 0\n")


@pytest.fixture
def open_broker(tmp_path: Path) -> Iterator[Callable[..., Broker]]:
    """Open brokers on tmp_path/data (no reconnect window unless asked); closed after the test."""
    opened: list[Broker] = []

    def make(**config: object) -> Broker:
        config.setdefault("reconnect_window_s", 0.0)
        config.setdefault("disk_floor_bytes", 0)
        broker = workq.open(tmp_path / "data", **config)
        opened.append(broker)
        return broker

    yield make
    for broker in opened:
        broker.close()


@pytest.fixture
def broker(open_broker: Callable[..., Broker]) -> Broker:
    return open_broker()


@pytest.fixture
def queue_server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A ``shardmgr serve`` process on tmp_path/data (QUEUE_SERVER_CONFIG); killed after the test."""
    config = tmp_path / "server.toml"
    config.write_text(QUEUE_SERVER_CONFIG)
    proc = ServerProcess(tmp_path / "data", "--config", str(config)).start()
    yield proc
    proc.kill()
