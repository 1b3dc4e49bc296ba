"""Results on their way to a consumer: delivered once, or not at all.

A :class:`Delivery` holds the results one results call took. They are *in
delivery* (no other call takes them) until the caller says what became of
the response that carries them: :meth:`Delivery.confirm` once it was handed
over (the network service: written to the consumer's socket; embedded use:
returned to the caller), which marks them DELIVERED, or
:meth:`Delivery.drop` if it never left (the connection closed first),
which makes them deliverable again. Whichever comes first takes effect;
the other does nothing. So a result is marked delivered only after the
response carrying it was handed over, and one that never left is not lost.

Threads: both methods may be called from any thread; the change runs
under the broker's owner lock.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

import numpy as np

from common.wire.errors import Unavailable
from workq.disk.completion_log import CompletionLog, Outgoing
from workq.protocol import Handle, Parts, Result, encode_results

from .answer import Promise
from .loop import OwnerLoop, settle

if TYPE_CHECKING:
    from .state.queue import QueueState

log = logging.getLogger(__name__)


class Delivery:
    """The results of one results call, in delivery."""

    def __init__(self, loop: OwnerLoop, state: QueueState, job_log: CompletionLog | None,
                 batch: list[Outgoing]) -> None:
        """``job_log`` may be None only with an empty batch (a job nothing was enqueued for)."""
        self._loop = loop
        self._state = state
        self._log = job_log
        self._batch = batch
        self._lock = threading.Lock()
        self._outcome: str | None = None  # "confirmed" or "dropped", once decided

    def __len__(self) -> int:
        return sum(len(out.handles) for out in self._batch)

    @property
    def handles(self) -> np.ndarray:
        """Packed input handles (uint64), in log order."""
        return np.concatenate([o.handles for o in self._batch]) if self._batch else np.zeros(0, np.uint64)

    @property
    def positions(self) -> np.ndarray:
        return np.concatenate([o.positions for o in self._batch]) if self._batch else np.zeros(0, np.uint64)

    @property
    def payloads(self) -> list[memoryview]:
        return [p for out in self._batch for p in out.payloads]

    def results(self) -> list[Result]:
        return [Result(Handle.unpack(h), bytes(p), pos)
                for h, p, pos in zip(self.handles.tolist(), self.payloads, self.positions.tolist())]

    def encode(self) -> tuple[dict[str, Any], Parts]:
        """The results response carrying these results (workq/protocol.py)."""
        return encode_results(self.handles, self.positions, self.payloads)

    def confirm(self, hurry: bool = True) -> Future[None]:
        """The response was handed over: mark the results DELIVERED. The
        future is answered once the marks are durable (DurabilityLost if
        they cannot be; Unavailable if the queue closed first). ``hurry``:
        start a flush round for them now; without it they are durable at
        the next timed round (for callers that do not wait for them)."""
        future: Future[None] = Future()
        self.confirm_into(future, hurry)
        return future

    def confirm_into(self, answer: Promise[None], hurry: bool = True) -> None:
        """:meth:`confirm`, answering into ``answer`` (a Future or a Callback: answer.py)."""
        job_log = self._log
        if not self._decide("confirmed") or not self._batch or job_log is None:
            settle(answer)
            return

        self._loop.call(lambda future: self._confirm_now(future, job_log, hurry), answer)

    def _confirm_now(self, future: Promise[None], job_log: CompletionLog, hurry: bool) -> None:
        """Owner lock: mark the batch delivered; answer once that is durable."""
        tickets = self._state.confirm_results(job_log, self._batch)
        self._loop.after_durable(tickets, lambda: settle(future), lambda exc: settle(future, error=exc),
                                 hurry=hurry, quick=True)

    def drop(self) -> None:
        """The response never left: the results are deliverable again."""
        job_log = self._log
        if not self._decide("dropped") or not self._batch or job_log is None:
            return
        with contextlib.suppress(Unavailable):  # closed: after a restart they are undelivered anyway
            self._loop.submit(lambda: self._state.drop_results(job_log, self._batch))

    def _decide(self, outcome: str) -> bool:
        with self._lock:
            if self._outcome is not None:
                return False
            self._outcome = outcome
            return True
