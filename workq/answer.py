"""Where an owner-thread operation puts its answer: a Future, or a Callback.

Embedded callers get a :class:`concurrent.futures.Future`. The network
service needs no Future: it only turns the answer into a reply, on the
thread that answers. A :class:`Callback` does that with one call, without
the Future's lock, condition and callback list (they cost more than a
one-item operation's reply itself).

Both satisfy :class:`Promise`, the part of a Future's interface the owner
thread uses (loop.py): ``set_running_or_notify_cancel`` when the
operation starts, then ``set_result`` or ``set_exception`` once (a second
answer raises InvalidStateError; ``settle`` ignores it).

Threads: a Callback is answered by one thread at a time (the owner
thread, or the submitting thread if the loop refused the operation); its
functions run on that thread and must not block.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import InvalidStateError
from typing import Generic, Protocol, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
T_contra = TypeVar("T_contra", contravariant=True)


class Promise(Protocol[T_contra]):
    """What an operation answers into (a Future satisfies it)."""

    def set_running_or_notify_cancel(self) -> bool: ...

    def set_result(self, result: T_contra) -> None: ...

    def set_exception(self, exception: BaseException | None) -> None: ...


class Callback(Generic[T]):
    """A one-shot answer that calls ``then(value)``, or ``fail(error)``, at
    once on the answering thread. It cannot be cancelled. If ``then``
    raises, ``fail`` gets that error (the caller still learns of the
    answer); what ``fail`` raises is logged, as a Future logs what its
    callbacks raise."""

    __slots__ = ("_then", "_fail", "_answered")

    def __init__(self, then: Callable[[T], None], fail: Callable[[BaseException], None]) -> None:
        self._then = then
        self._fail = fail
        self._answered = False

    def set_running_or_notify_cancel(self) -> bool:
        return True

    def set_result(self, result: T) -> None:
        self._claim()
        try:
            self._then(result)
        except Exception as exc:
            self._failed(exc)

    def set_exception(self, exception: BaseException | None) -> None:
        self._claim()
        self._failed(exception if exception is not None else RuntimeError("answered with no error"))

    @property
    def answered(self) -> bool:
        return self._answered

    def _claim(self) -> None:
        if self._answered:
            raise InvalidStateError("the callback was answered already")
        self._answered = True

    def _failed(self, error: BaseException) -> None:
        try:
            self._fail(error)
        except Exception:
            log.exception("workq: answering a failed call failed")
