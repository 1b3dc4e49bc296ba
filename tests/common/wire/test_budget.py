"""The byte budget connections share (common/wire/budget.py): never more
than its limit handed out, waiters served in arrival order, waits bounded."""

from __future__ import annotations

import threading
import time

import pytest

from common.wire.budget import ByteBudget


def test_takes_and_gives_back_up_to_the_limit() -> None:
    budget = ByteBudget(100)
    assert budget.acquire(60) and budget.acquire(40)
    assert budget.used == 100
    assert not budget.acquire(1, deadline=time.monotonic())  # full: a zero wait times out
    budget.release(60)
    assert budget.acquire(50)
    budget.release(90)
    assert budget.used == 0
    stats = budget.stats()
    assert stats["inflight_peak_bytes"] == 100 and stats["inflight_limit_bytes"] == 100
    assert stats["inflight_waits_total"] == 1 and stats["inflight_wait_timeouts_total"] == 1


@pytest.mark.parametrize("n", [-1, 101])
def test_a_request_that_can_never_be_served_is_refused(n: int) -> None:
    budget = ByteBudget(100)
    with pytest.raises(ValueError, match="cannot take"):
        budget.acquire(n)
    assert budget.used == 0


def test_bad_limits_and_releases_are_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        ByteBudget(0)
    budget = ByteBudget(10)
    budget.acquire(5)
    with pytest.raises(ValueError, match="cannot release 6 bytes: 5 are taken"):
        budget.release(6)
    assert budget.used == 5


def test_a_waiter_gets_its_bytes_when_they_are_released() -> None:
    budget = ByteBudget(100)
    budget.acquire(100)
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(budget.acquire(30, time.monotonic() + 30)))
    waiter.start()
    _wait_for(lambda: budget.stats()["inflight_waits_total"] == 1)
    budget.release(50)
    waiter.join(30)
    assert got == [True] and budget.used == 80


def test_waiters_are_served_in_arrival_order() -> None:
    """A small request arriving after a large one waits behind it, even if it would fit."""
    budget = ByteBudget(100)
    budget.acquire(90)
    order: list[int] = []

    def take(n: int) -> None:
        assert budget.acquire(n, time.monotonic() + 30)
        order.append(n)

    big = threading.Thread(target=take, args=(50,))
    big.start()
    _wait_for(lambda: budget.stats()["inflight_waits_total"] == 1)
    small = threading.Thread(target=take, args=(5,))
    small.start()
    _wait_for(lambda: budget.stats()["inflight_waits_total"] == 2)
    assert order == [] and budget.used == 90  # 5 would fit, but the 50 came first
    budget.release(90)
    big.join(30)
    small.join(30)
    assert order == [50, 5] and budget.used == 55


def test_a_waiter_that_times_out_lets_the_next_one_in() -> None:
    budget = ByteBudget(100)
    budget.acquire(60)
    results: dict[str, bool] = {}
    big = threading.Thread(target=lambda: results.setdefault("big", budget.acquire(80, time.monotonic() + 0.3)))
    big.start()
    _wait_for(lambda: budget.stats()["inflight_waits_total"] == 1)
    small = threading.Thread(target=lambda: results.setdefault("small", budget.acquire(30, time.monotonic() + 30)))
    small.start()
    big.join(30)
    small.join(30)
    assert results == {"big": False, "small": True} and budget.used == 90


def _wait_for(condition: object) -> None:
    for _ in range(1000):
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached")
