from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import workq
from workq import Broker


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
