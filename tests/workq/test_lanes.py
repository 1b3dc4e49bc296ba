"""A lane keeps its type (int or str), embedded, over the wire and across
restarts; lane filters match its text."""

from __future__ import annotations

import signal
from collections.abc import Callable

import numpy as np
import pytest

import workq
from common.wire.errors import BadRequest
from tests.shardmgr.server.serverproc import ServerProcess
from workq import Broker, QueueClient, Worker


def lanes_of(items: list[workq.Item]) -> dict[bytes, object]:
    return {i.payload: i.key.lane for i in items}


def enqueue_three_lanes(enqueue: Callable[..., object]) -> None:
    enqueue("j", "m", "s", 1, [b"int"], durable=True)
    enqueue("j", "m", "s", "1", [b"text"], durable=True)
    enqueue("j", "m", "s", "a", [b"a"], durable=True)


def test_a_lane_comes_back_as_it_was_given_and_filters_match_its_text(open_broker: Callable[..., Broker]) -> None:
    broker = open_broker()
    enqueue_three_lanes(broker.enqueue)
    broker.enqueue("j", "m", "s", 7, [b"seven"])
    assert [k["lane"] for k in broker.stats()["keys"]] == [1, 7, "1", "a"]  # two keys: 1 and "1"
    assert lanes_of(broker.lease(10, lanes=[7])) == {b"seven": 7}
    got = broker.lease(10, lanes=[1], worker="w")
    assert lanes_of(got) == {b"int": 1, b"text": "1"}
    assert type(lanes_of(got)[b"int"]) is int
    broker.release([i.handle for i in got], worker="w")
    assert lanes_of(broker.lease(10, lanes=["1"], worker="w")) == {b"int": 1, b"text": "1"}
    broker.close()
    broker = open_broker()  # the segments' metadata keeps the type
    assert lanes_of(broker.lease(10, lanes=["a", 1])) == {b"int": 1, b"text": "1", b"a": "a"}
    for bad in (True, 1.5, 2**63, "", None, np.int64(1)):
        with pytest.raises(ValueError, match="lane must be"):
            broker.enqueue("j", "m", "s", bad, [b"x"])  # type: ignore[arg-type]


def test_a_lane_keeps_its_type_over_the_wire_and_across_a_restart(queue_server: ServerProcess) -> None:
    with QueueClient(queue_server.address) as client:
        enqueue_three_lanes(client.enqueue)
        for bad in (True, 1.5, 2**63):
            with pytest.raises(BadRequest, match="lane must be"):
                client.enqueue("j", "m", "s", bad, [b"x"])  # type: ignore[arg-type]
    with Worker(queue_server.address, "w", lanes=[1]) as worker:
        assert lanes_of(worker.lease(10)) == {b"int": 1, b"text": "1"}
    queue_server.signal(signal.SIGKILL)
    queue_server.wait()
    queue_server.start()
    with Worker(queue_server.address, "w", lanes=["1", "a"]) as worker:  # leases are in memory: all pending again
        items = worker.lease(10, wait=10)
        assert lanes_of(items) == {b"int": 1, b"text": "1", b"a": "a"}
        assert [type(i.key.lane) for i in items if i.payload == b"int"] == [int]
