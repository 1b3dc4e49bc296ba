"""Enqueue requests as owner-loop messages: neighbours for one job and key merge.

Many producers that each enqueue one item at a time (a web handler, a chat
turn) send requests that wait together in the owner's inbox while the
owner lock is busy, and run as one batch. Adjacent enqueues of one job and
key in such a batch are
appended as one journal batch: one encode, one write, one ticket, instead of
one each, so the queue's cost per item falls as producers are added (group
commit already shares their flush). Each request still gets its own answer,
its own handles, and its own error if its arguments are bad; a failed write
fails every request of that append, none of which is then stored.

A merged append is one journal batch, all-or-nothing across a crash: the
same promise each request had alone (none is acknowledged durable before
the flush that covers them all).

Threads: built on any thread, run under the owner lock (loop.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Final

import numpy as np

from .answer import Promise
from .loop import Mergeable, OwnerLoop, settle
from .protocol import Key
from .state.queue import QueueState

MERGED_BYTES: Final = 4 << 20
"""Most payload bytes one merged append carries (a segment holds many)."""


class Enqueue(Mergeable):
    """One enqueue request: ``future`` answers its packed handles (uint64)
    (a Future, or the ``answer`` given: answer.py)."""

    def __init__(self, state: QueueState, loop: OwnerLoop, job: str, key: Key,
                 payloads: Sequence[memoryview | bytes], durable: bool,
                 answer: Promise[np.ndarray] | None = None) -> None:
        self.state, self.loop = state, loop
        self.job, self.key, self.payloads, self.durable = job, key, payloads, durable
        self.group = (job, key)
        self.future: Promise[np.ndarray] = answer if answer is not None else Future()

    @classmethod
    def run_many(cls, messages: list[Any]) -> None:
        started: list[Enqueue] = [m for m in messages if m.future.set_running_or_notify_cancel()]
        if not started:
            return
        if len(started) == 1:
            started[0]._append([started[0]])
            return
        mergeable = []
        for message in started:
            try:
                need = message.state.check_enqueue(message.job, message.payloads)
            except Exception as exc:
                settle(message.future, error=exc)
                continue
            if not message.payloads:
                settle(message.future, np.zeros(0, dtype=np.uint64))
            else:
                mergeable.append((message, need))
        for run in _chunks(mergeable, min(MERGED_BYTES, started[0].state.config.segment_bytes // 4)):
            run[0]._append(run)

    def _append(self, run: list[Enqueue]) -> None:
        """Append the run's payloads as one batch; answer each request."""
        try:
            packed, ticket = self.state.enqueue(self.job, self.key, [p for m in run for p in m.payloads])
        except Exception as exc:  # nothing was written
            for message in run:
                settle(message.future, error=exc)
            return
        answers = np.split(packed, np.cumsum([len(m.payloads) for m in run])[:-1]) if len(run) > 1 else [packed]
        now = [(m, a) for m, a in zip(run, answers) if not m.durable]
        later = [(m, a) for m, a in zip(run, answers) if m.durable]
        for message, answer in now:
            settle(message.future, answer)
        if later:
            self.loop.after_durable([ticket], lambda: _answer(later), lambda exc: _fail(later, exc), quick=True)


def _chunks(items: list[tuple[Enqueue, int]], limit: int) -> list[list[Enqueue]]:
    """Consecutive messages in runs of at most ``limit`` bytes (a larger one alone)."""
    runs: list[list[Enqueue]] = []
    size = limit + 1
    for message, need in items:
        if size + need > limit:
            runs.append([])
            size = 0
        runs[-1].append(message)
        size += need
    return runs


def _answer(answers: list[tuple[Enqueue, np.ndarray]]) -> None:
    for message, packed in answers:
        settle(message.future, packed)


def _fail(answers: list[tuple[Enqueue, np.ndarray]], exc: Exception) -> None:
    for message, _ in answers:
        settle(message.future, error=exc)
