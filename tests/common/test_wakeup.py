"""common.wakeup.Wakeup behaves as threading.Event: the same test against both."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

import pytest

from common.wakeup import Wakeup


class Flag(Protocol):
    def is_set(self) -> bool: ...
    def set(self) -> None: ...
    def clear(self) -> None: ...
    def wait(self, timeout: float | None = None) -> bool: ...


KINDS: list[Callable[[], Flag]] = [threading.Event, Wakeup]


@pytest.fixture(params=KINDS, ids=["threading.Event", "Wakeup"])
def flag(request: pytest.FixtureRequest) -> Flag:
    made: Flag = request.param()
    return made


def test_starts_clear_and_a_wait_times_out_false(flag: Flag) -> None:
    assert not flag.is_set()
    started = time.monotonic()
    assert flag.wait(0.05) is False
    assert time.monotonic() - started >= 0.04


def test_set_is_seen_at_once_until_cleared(flag: Flag) -> None:
    flag.set()
    assert flag.is_set()
    assert flag.wait(0) is True
    assert flag.wait() is True  # set already: no sleep
    flag.clear()
    assert not flag.is_set()
    assert flag.wait(0) is False


def test_set_wakes_every_sleeping_thread(flag: Flag) -> None:
    woke: list[bool] = []
    sleepers = [threading.Thread(target=lambda: woke.append(flag.wait(10))) for _ in range(3)]
    for thread in sleepers:
        thread.start()
    time.sleep(0.1)  # let them sleep (the outcome is the same if one has not yet)
    started = time.monotonic()
    flag.set()
    for thread in sleepers:
        thread.join(5)
    assert woke == [True, True, True]
    assert time.monotonic() - started < 5


def test_a_wait_that_timed_out_leaves_set_working(flag: Flag) -> None:
    assert flag.wait(0.01) is False
    woke: list[bool] = []
    sleeper = threading.Thread(target=lambda: woke.append(flag.wait(10)))
    sleeper.start()
    time.sleep(0.05)
    flag.set()
    sleeper.join(5)
    assert woke == [True]


def test_a_sleeper_set_free_returns_true_even_if_cleared_before_it_runs(flag: Flag) -> None:
    woke: list[bool] = []
    sleeper = threading.Thread(target=lambda: woke.append(flag.wait(10)))
    sleeper.start()
    time.sleep(0.05)
    flag.set()
    flag.clear()
    sleeper.join(5)
    assert woke == [True]


def test_many_threads_setting_and_waiting_never_lose_a_set(flag: Flag) -> None:
    """A sleeper that sees its set either way: no wait outlives a set that came after it began."""
    rounds = 200
    seen = []
    for _ in range(rounds):
        flag.clear()
        sleeper = threading.Thread(target=lambda: seen.append(flag.wait(10)))
        sleeper.start()
        flag.set()
        sleeper.join(5)
        assert not sleeper.is_alive()
    assert seen == [True] * rounds
