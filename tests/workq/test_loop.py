"""The owner loop: submitters run the inbox when the lock is free; nothing submitted is ever stranded."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from unittest import mock

from common.journal import Flusher
from workq import loop as loop_module
from workq.loop import OwnerLoop


def test_every_submission_runs_in_order_when_many_threads_submit(flusher: Flusher) -> None:
    """Submitters race for the owner lock; one that loses leaves its message
    to whoever holds it, or to the owner thread. With the owner thread's own
    timer pushed out of reach, a message left behind would never run and the
    wait below would time out."""
    with mock.patch.object(loop_module, "TICK_S", 3600.0):
        owner = OwnerLoop(flusher, lambda now: None, lambda: (0, 0), lambda: None)
        owner.start()
        ran: list[tuple[int, int]] = []
        last: list[Future[None]] = []

        def submitter(thread: int) -> None:
            for i in range(300):
                owner.submit(lambda i=i: ran.append((thread, i)))  # type: ignore[misc]
            done: Future[None] = Future()
            owner.submit(lambda: done.set_result(None))
            last.append(done)

        threads = [threading.Thread(target=submitter, args=(t,)) for t in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for done in last:
            done.result(10)
        owner.stop()
    assert len(ran) == 6 * 300
    for thread in range(6):  # each thread's submissions ran in the order it made them
        assert [i for t, i in ran if t == thread] == list(range(300))


def test_a_submission_made_under_the_lock_runs_after_the_current_one(flusher: Flusher) -> None:
    owner = OwnerLoop(flusher, lambda now: None, lambda: (0, 0), lambda: None)
    owner.start()
    order: list[str] = []
    done: Future[None] = Future()

    def outer() -> None:
        owner.submit(lambda: (order.append("nested"), done.set_result(None)))
        order.append("outer")

    owner.submit(outer)
    done.result(10)
    owner.stop()
    assert order == ["outer", "nested"]
