"""A waiting results call lingers after new results, so results that complete one at a time share a response."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from workq import Broker


@pytest.mark.parametrize("linger", [1.0, 0.0])
def test_a_waiting_results_call_takes_the_results_that_follow_within_the_linger(
        open_broker: Callable[..., Broker], linger: float) -> None:
    broker = open_broker(results_linger_s=linger)
    broker.enqueue("j", "m", "s", 1, [b"a", b"b"])
    first, second = broker.lease(2)
    answered = threading.Event()
    got: list[bytes] = []

    def consume() -> None:
        got.extend(r.payload for r in broker.results("j", max_items=10, wait=30))
        answered.set()

    consumer = threading.Thread(target=consume)
    consumer.start()
    broker.complete([first.handle], [b"ra"])
    if linger:  # the second result appears well within the linger: one response carries both
        broker.complete([second.handle], [b"rb"])
        consumer.join(30)
        assert got == [b"ra", b"rb"]
    else:  # answered with the first result alone, before the second exists
        assert answered.wait(30)
        assert got == [b"ra"]
        broker.complete([second.handle], [b"rb"])
        consumer.join(30)
        assert [r.payload for r in broker.results("j")] == [b"rb"]


def test_a_results_call_that_finds_results_answers_at_once(open_broker: Callable[..., Broker]) -> None:
    broker = open_broker(results_linger_s=1.0)
    broker.enqueue("j", "m", "s", 1, [b"a"])
    [item] = broker.lease(1)
    broker.complete([item.handle], [b"ra"])
    future = broker.results_async("j", max_items=10, wait=30)
    assert [r.payload for r in future.result(0.9).results()] == [b"ra"]  # well before the linger would end


def test_the_linger_is_checked(open_broker: Callable[..., Broker]) -> None:
    for bad in (-1.0, 2.0, float("nan")):
        with pytest.raises(ValueError, match="results_linger_s"):
            open_broker(results_linger_s=bad)
