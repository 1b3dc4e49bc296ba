"""A Callback (workq/answer.py) answers once, like a Future, and reports what its functions raise."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import InvalidStateError

import pytest

from common.journal import Flusher
from common.wire.errors import Unavailable
from workq.answer import Callback
from workq.loop import OwnerLoop, settle


def test_a_callback_answers_once() -> None:
    got: list[object] = []
    answer: Callback[int] = Callback(got.append, got.append)
    assert answer.set_running_or_notify_cancel() and not answer.answered
    answer.set_result(7)
    assert got == [7] and answer.answered
    with pytest.raises(InvalidStateError):
        answer.set_result(8)
    with pytest.raises(InvalidStateError):
        answer.set_exception(ValueError("late"))
    settle(answer, 9)  # settle ignores a second answer, as it does a Future's
    settle(answer, error=ValueError("late"))
    assert got == [7]


def test_an_error_in_then_goes_to_fail_and_an_error_in_fail_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    failures: list[BaseException] = []

    def then(value: int) -> None:
        raise KeyError(value)

    answer: Callback[int] = Callback(then, failures.append)
    answer.set_result(1)
    assert len(failures) == 1 and isinstance(failures[0], KeyError)

    def fail(error: BaseException) -> None:
        raise RuntimeError("fail failed")

    broken: Callback[int] = Callback(then, fail)
    with caplog.at_level(logging.ERROR):
        broken.set_exception(ValueError("the call failed"))  # does not raise
    assert "answering a failed call failed" in caplog.text


@pytest.fixture
def loop() -> Iterator[OwnerLoop]:
    flusher = Flusher()
    flusher.start()
    owner = OwnerLoop(flusher, lambda now: None, lambda: (0, 0), lambda: None)
    owner.start()
    yield owner
    owner.stop()
    flusher.stop()


def test_a_closed_loop_answers_a_call_with_unavailable(loop: OwnerLoop) -> None:
    ran: list[object] = []
    answer: Callback[int] = Callback(ran.append, ran.append)
    loop.call(lambda a: settle(a, 5), answer)
    loop.stop()
    assert ran == [5]
    refused: Callback[int] = Callback(ran.append, ran.append)
    loop.call(lambda a: settle(a, 6), refused)
    assert isinstance(ran[-1], Unavailable)


def test_what_a_call_raises_answers_it(loop: OwnerLoop) -> None:
    got: list[object] = []

    def boom(answer: Callback[int]) -> None:
        raise ValueError("bad argument")

    answer: Callback[int] = Callback(got.append, got.append)
    loop.call(boom, answer)
    loop.stop()
    assert len(got) == 1 and isinstance(got[0], ValueError)
