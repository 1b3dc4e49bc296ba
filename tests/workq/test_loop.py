"""The owner loop: submitters run the inbox when the lock is free; nothing submitted is ever stranded."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path
from unittest import mock

from common.journal import Flusher, FlusherConfig, Journal
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


def test_continuations_run_once_their_writes_are_durable_however_that_happens(tmp_path: Path) -> None:
    """The loop looks at its continuations again only when the flusher says
    durability may have changed: a round, or a sync outside one. Each way
    runs the continuation; a request meanwhile does not."""
    manual = Flusher(FlusherConfig(interval=3600)).start()
    owner = OwnerLoop(manual, lambda now: None, lambda: (0, 0), lambda: None)
    owner.start()
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=manual)
    try:
        done: list[Future[None]] = [Future(), Future()]

        def wait_for(n: int) -> None:
            _, ticket = journal.append(b"x")
            owner.after_durable([ticket], lambda: done[n].set_result(None), done[n].set_exception, hurry=False)

        owner.submit(lambda: wait_for(0))
        for _ in range(3):  # requests, no flush: nothing is due
            ran: Future[None] = Future()
            owner.submit(lambda ran=ran: ran.set_result(None))  # type: ignore[misc]
            ran.result(10)
        assert not done[0].done()
        owner.submit(lambda: wait_for(1))
        manual.flush_now()  # a round
        done[0].result(10)
        done[1].result(10)
        late: Future[None] = Future()

        def wait_then_seal() -> None:
            _, ticket = journal.append(b"y")
            owner.after_durable([ticket], lambda: late.set_result(None), late.set_exception, hurry=False)
            threading.Thread(target=journal.seal).start()  # a sync outside any round, once the lock is free

        owner.submit(wait_then_seal)
        late.result(10)
    finally:
        owner.stop()
        journal.close()
        manual.stop()
