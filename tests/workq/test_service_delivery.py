"""The service marks results delivered only after the response carrying
them was written to the consumer's socket, through the component contract
(common/wire/component.py) with a responder that plays the socket."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.journal import Flusher
from common.wire.component import OnSent, Request
from workq.config import WorkqConfig
from workq.service import WorkqService


class Socket:
    """A connection's responder: keeps each response and its on_sent
    callback; ``write()`` plays the writer thread putting it on the socket."""

    def __init__(self) -> None:
        self.closed = False
        self.responses: list[tuple[dict[str, Any], dict[str, np.ndarray] | None, OnSent | None]] = []
        self._answered = threading.Event()

    def respond(self, header: dict[str, Any], parts: dict[str, np.ndarray] | None, on_sent: OnSent | None) -> None:
        self.responses.append((header, parts, on_sent))
        self._answered.set()

    def answer(self, timeout: float = 10.0) -> tuple[dict[str, Any], dict[str, np.ndarray] | None]:
        assert self._answered.wait(timeout), "no response"
        header, parts, _ = self.responses[-1]
        assert "error" not in header, header
        return header["ok"], parts

    def write(self) -> None:
        for _, _, on_sent in self.responses:
            if on_sent is not None:
                on_sent()


@pytest.fixture
def service(tmp_path: Path, flusher: Flusher) -> Iterator[WorkqService]:
    component = WorkqService(tmp_path, WorkqConfig(reconnect_window_s=0.0, disk_floor_bytes=0), flusher)
    component.recover()
    component.start()
    yield component
    component.stop()


def results(service: WorkqService, socket: Socket) -> list[bytes]:
    service.handle(Request(1, "workq.results", {"job": "j", "max_items": 10}, {}, socket))
    result, parts = socket.answer()
    assert parts is not None
    data = parts["data"].tobytes()
    ends = np.cumsum(parts["lengths"]).tolist()
    return [data[a:b] for a, b in zip([0, *ends[:-1]], ends)][: result["count"]]


def one_result(service: WorkqService) -> None:
    """Job "j" has one durable, undelivered result: b"result"."""
    broker = service.broker
    broker.enqueue("j", "m", "s", 1, [b"task"], durable=True)
    [item] = broker.lease(1)
    broker.complete([item.handle], [b"result"])


def delivered(service: WorkqService) -> int:
    return service.broker.job_status("j")["delivered"]


def test_results_not_written_before_the_close_are_handed_out_again(service: WorkqService) -> None:
    one_result(service)
    first = Socket()
    assert results(service, first) == [b"result"]  # the response exists, but was never written
    assert delivered(service) == 0
    first.closed = True
    service.connection_closed(id(first))
    second = Socket()
    assert results(service, second) == [b"result"]  # not lost with the first connection
    second.write()
    deadline = time.monotonic() + 10
    while delivered(service) != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert delivered(service) == 1
    assert results(service, Socket()) == []  # delivered once written: never again


def test_a_write_after_the_close_does_not_deliver_twice(service: WorkqService) -> None:
    one_result(service)
    first = Socket()
    assert results(service, first) == [b"result"]
    first.closed = True
    service.connection_closed(id(first))  # dropped first ...
    first.write()  # ... so a late on_sent changes nothing
    assert results(service, Socket()) == [b"result"]
    assert delivered(service) == 0
