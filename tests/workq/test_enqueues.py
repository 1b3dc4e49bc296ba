"""Enqueue requests that reach the owner thread together merge into one append (workq/enqueues.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager

import numpy as np
import pytest

from common.journal import Marker
from workq import Broker, PayloadTooLarge
from workq.protocol import Handle, Key

KEY = Key.of("m", "s", 1)


@contextmanager
def owner_paused(broker: Broker) -> Iterator[None]:
    """Hold the owner lock, so what is submitted meanwhile waits in the inbox
    and runs as one batch (another thread submits the hold and so runs it)."""
    entered, go = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        go.wait(10)

    holder = threading.Thread(target=broker._loop.submit, args=(hold,))
    holder.start()
    assert entered.wait(10)
    try:
        yield
    finally:
        go.set()
        holder.join(10)


def batches_of(broker: Broker, handles: list[int]) -> list[list[int]]:
    """The journal batches (by BATCH_CONTINUES) holding these packed handles, as lists of handles."""
    segment = broker._state.segments[Handle.unpack(handles[0]).segment]
    out: list[list[int]] = [[]]
    for chunk in segment.journal.scan():
        for offset, continues in zip(chunk.offsets.tolist(), chunk.continues.tolist()):
            out[-1].append(Handle(segment.id, offset).packed)
            if not continues:
                out.append([])
    return [b for b in out if b and set(b) & set(handles)]


def test_neighbouring_enqueues_are_one_append_with_their_own_answers(broker: Broker) -> None:
    with owner_paused(broker):
        futures = [broker.enqueue_async("j", KEY, [f"p{i}".encode()] * (1 + i % 3), durable=i % 2 == 1)
                   for i in range(40)]
    answers = [f.result(10).tolist() for f in futures]
    assert [len(a) for a in answers] == [1 + i % 3 for i in range(40)]
    flat = [h for a in answers for h in a]
    assert len(set(flat)) == len(flat) and flat == sorted(flat)  # in request order, none shared
    assert batches_of(broker, flat) == [flat]  # one journal batch for all forty requests
    items = broker.lease(100)
    assert [i.handle.packed for i in items] == flat
    assert [i.payload for i in items] == [f"p{i}".encode() for i in range(40) for _ in range(1 + i % 3)]
    assert [i.position for i in items] == list(range(len(flat)))


def test_a_bad_request_fails_alone_and_its_neighbours_are_stored(broker: Broker) -> None:
    limit = broker.config.payload_limit
    with owner_paused(broker):
        good1 = broker.enqueue_async("j", KEY, [b"a"])
        bad = broker.enqueue_async("j", KEY, [b"b", b"x" * (limit + 1)])
        empty = broker.enqueue_async("j", KEY, [])
        cancelled = broker.enqueue_async("j", KEY, [b"never"])
        assert cancelled.cancel()
        good2 = broker.enqueue_async("j", KEY, [b"d"], durable=True)
        bad_name: Future[np.ndarray] = broker.enqueue_async("", KEY, [b"c"])  # another group: runs alone
    with pytest.raises(PayloadTooLarge, match="payload 1 has"):
        bad.result(10)
    with pytest.raises(ValueError, match="job must be"):
        bad_name.result(10)
    assert empty.result(10).tolist() == []
    stored = good1.result(10).tolist() + good2.result(10).tolist()
    assert batches_of(broker, stored) == [stored]
    assert [i.payload for i in broker.lease(10)] == [b"a", b"d"]
    assert broker.job_status("j")["enqueued"] == 2


def test_only_neighbours_of_one_job_and_key_merge(broker: Broker) -> None:
    other = Key.of("m", "s", 2)
    with owner_paused(broker):
        first = [broker.enqueue_async("j", KEY, [b"1"]) for _ in range(3)]
        status = broker.job_status_async("j")  # not an enqueue: the runs on either side stay apart
        second = [broker.enqueue_async("j", KEY, [b"2"]) for _ in range(3)]
        elsewhere = broker.enqueue_async("j", other, [b"3"])
        third = broker.enqueue_async("k", KEY, [b"4"])
    assert status.result(10)["enqueued"] == 3  # it saw exactly the requests before it
    a = [h for f in first for h in f.result(10).tolist()]
    b = [h for f in second for h in f.result(10).tolist()]
    assert batches_of(broker, a + b) == [a, b]
    assert elsewhere.result(10).tolist() and third.result(10).tolist()
    assert broker._state.segments[Handle.unpack(a[0]).segment].journal.count_of(Marker.LIVE) == 7
