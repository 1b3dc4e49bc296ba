"""Requests sent without waiting: answers as :class:`Pending` objects, a
bound on requests in flight (:class:`Pipe`), batches sent in one write
(:class:`Batch`).

No thread: a reply is read from the socket when someone needs it. Asking
one Pending for its result reads replies until its own is there; replies to
other requests met on the way are kept (servers may answer out of order)
and handed to their Pending when it is asked or settled. The bound: when
``max_in_flight`` requests are unanswered, sending one more first waits for
the oldest answer, so a caller that never asks for results keeps at most
that many requests, and their replies, in memory. Every few sends (and
every few hundred KiB) the replies that have already arrived are read
without waiting, so they do not fill the socket buffers while the caller
is still sending: a server that cannot write a reply stops reading, and a
client blocked sending would wait until the server gives up on it.

Errors are per request: each Pending raises its own (the server's error
for that request; Unavailable or ConnectionLost when the connection ended
before its answer, as in :mod:`common.wire.client`). A request marked
``resend`` (idempotent ones only) is sent once more after ConnectionLost;
once such a resend finds the server unreachable, the other resends fail
with that error at once for the next ``retry_for`` seconds (or until a
send succeeds) instead of each waiting that long again.

Threads: not thread-safe, like the RpcClient underneath; one per thread.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from concurrent.futures import CancelledError
from typing import Any, Final, Generic, Self, TypeVar, cast

import numpy as np
from mypy_extensions import mypyc_attr

from .client import ConnectionLost, Reply, RpcClient, _copy
from .errors import ServiceError, Unavailable

T = TypeVar("T")

DEFAULT_MAX_IN_FLIGHT: Final = 1000
"""Requests a Pipe lets wait for their answers before a send waits for the oldest one."""

POLL_EVERY: Final = 32
POLL_BYTES: Final = 256 << 10
"""A Pipe reads the replies already there (without waiting) once per
POLL_EVERY requests or POLL_BYTES of their parts sent, whichever comes
first; a batch is written in pieces no larger (in requests: half the bound)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """One request to send. ``resend``: the command is idempotent, so it is
    sent once more if the connection is lost before its answer."""

    cmd: str
    args: dict[str, Any] | None = None
    parts: dict[str, np.ndarray] | None = None
    resend: bool = False

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, cmd: str, args: dict[str, Any] | None = None, parts: dict[str, np.ndarray] | None = None,
                 resend: bool = False) -> None:
        object.__setattr__(self, "cmd", cmd)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "parts", parts)
        object.__setattr__(self, "resend", resend)


class Pending(Generic[T]):
    """The answer to one request sent without waiting.

    :meth:`result` waits for the answer (reading replies from the
    connection; bounded by the client's ``timeout`` per reply) and returns
    its decoded value or raises the request's error. Once answered it is
    done and keeps its value; asking again costs nothing.
    """

    __slots__ = ("request", "_pipe", "_decode", "_batch", "_id", "_done", "_value", "_error")

    def __init__(self, pipe: Pipe, request: Request, decode: Callable[[Reply], T], batch: Batch | None = None) -> None:
        self.request = request
        self._pipe = pipe
        self._decode = decode
        self._batch = batch  # set while it waits in a batch, not yet sent
        self._id: int | None = None
        self._done = False
        self._value: T | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """True once the answer (or the error) is here."""
        return self._done

    def result(self) -> T:
        """The decoded answer; raises the request's error instead if it failed."""
        if not self._done:
            self._pipe.settle(self)
        if self._error is not None:
            raise self._error
        return cast(T, self._value)

    def exception(self) -> BaseException | None:
        """The request's error, None if it succeeded (waits for the answer like :meth:`result`)."""
        if not self._done:
            self._pipe.settle(self)
        return self._error

    def _resolve(self, reply: Reply) -> None:
        try:
            self._value = self._decode(reply)
        except Exception as exc:  # a malformed reply: raised by result(), never lost in a settle
            self._error = exc
        self._done = True

    def _fail(self, error: BaseException) -> None:
        self._error, self._done, self._batch = error, True, None


class Pipe:
    """The requests in flight on one :class:`RpcClient`, at most ``max_in_flight``."""

    def __init__(self, rpc: RpcClient, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT) -> None:
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an integer >= 1, got {max_in_flight!r}")
        self.rpc = rpc
        self.max_in_flight = max_in_flight
        self._in_flight: dict[int, Pending[Any]] = {}  # by request id; ids grow, so the oldest is first
        self._unpolled = 0  # requests sent since the last poll
        self._unpolled_bytes = 0  # and the bytes of their parts
        self._unreachable: ServiceError | None = None  # why the last resend could not be sent
        self._unreachable_until = 0.0  # monotonic time it stops standing for the others

    @property
    def in_flight(self) -> int:
        """Requests sent whose Pending is not settled yet (answers read but not yet handed over count too)."""
        return len(self._in_flight)

    def submit(self, request: Request, decode: Callable[[Reply], T]) -> Pending[T]:
        """Send ``request`` now (first waiting for the oldest answer if the
        bound is reached); its answer comes through the returned Pending. An
        error sending it (the server unreachable) is that Pending's error."""
        self._make_room(1)
        pending = Pending(self, request, decode)
        try:
            try:
                request_id = self.rpc.send(request.cmd, request.args, request.parts)
            except ConnectionLost:
                if not request.resend:
                    raise
                request_id = self.rpc.send(request.cmd, request.args, request.parts)
        except ServiceError as exc:
            pending._fail(exc)
            return pending
        self._track(pending, request_id)
        self._sent(1, _size(request))
        return pending

    def send_batch(self, pendings: list[Pending[Any]]) -> None:
        """Send pendings not yet sent, in order, in writes of at most half
        the bound and about POLL_BYTES (waiting for older answers to make
        room). If the server cannot be reached, the rest fail with that error."""
        step = max(1, self.max_in_flight // 2)
        chunk: list[Pending[Any]] = []
        size = 0
        for index, pending in enumerate(pendings):
            chunk.append(pending)
            size += _size(pending.request)
            if len(chunk) < step and size < POLL_BYTES and index < len(pendings) - 1:
                continue
            self._make_room(len(chunk))
            try:
                ids = self.rpc.send_many([(p.request.cmd, p.request.args, p.request.parts) for p in chunk])
            except ServiceError as exc:  # nothing of this chunk was sent: the server is unreachable
                for rest in pendings[index + 1 - len(chunk):]:
                    rest._fail(_copy(exc))
                return
            for sent, request_id in zip(chunk, ids, strict=True):
                self._track(sent, request_id)
            self._sent(len(chunk), size)
            chunk, size = [], 0

    def settle(self, pending: Pending[Any]) -> None:
        """Wait for ``pending``'s answer and hand it over (replies to other
        requests read on the way are kept for them)."""
        if pending._id is None and pending._batch is not None:
            pending._batch.send()  # asked for before its batch was sent: send the batch now
        if pending._done:
            return
        if pending._id is None:
            raise ValueError("this Pending was never sent")
        try:
            reply = self._receive(pending.request, pending._id)
        except ServiceError as exc:
            self._in_flight.pop(pending._id, None)
            pending._fail(exc)
            return
        self._in_flight.pop(pending._id, None)
        pending._resolve(reply)

    def settle_all(self) -> None:
        """Wait for the answer to every request in flight (errors stay in their Pending)."""
        while self._in_flight:
            self.settle(next(iter(self._in_flight.values())))

    def _track(self, pending: Pending[Any], request_id: int) -> None:
        pending._id, pending._batch = request_id, None
        self._in_flight[request_id] = pending

    def _sent(self, requests: int, size: int) -> None:
        self._unreachable = None
        self._unpolled += requests
        self._unpolled_bytes += size
        if self._unpolled >= POLL_EVERY or self._unpolled_bytes >= POLL_BYTES:
            self._unpolled = self._unpolled_bytes = 0
            self.rpc.poll()

    def _make_room(self, n: int) -> None:
        while self._in_flight and len(self._in_flight) + n > self.max_in_flight:
            self.settle(next(iter(self._in_flight.values())))

    def _receive(self, request: Request, request_id: int) -> Reply:
        try:
            try:
                return self.rpc.receive(request_id)
            except ValueError as exc:
                if isinstance(exc, ServiceError):  # BadRequest is a ValueError too: the server's answer
                    raise
                # The RpcClient forgot the request: someone closed it.
                raise ConnectionLost("the connection was closed before this request's answer was read; "
                                     "it may have been applied") from exc
        except ConnectionLost:
            if not request.resend:
                raise
        if self._unreachable is not None and time.monotonic() < self._unreachable_until:
            raise _copy(self._unreachable)  # another resend just found the server gone: do not wait again
        try:
            return self.rpc.call(request.cmd, request.args, request.parts)
        except Unavailable as exc:
            if not isinstance(exc, ConnectionLost):
                self._unreachable, self._unreachable_until = exc, time.monotonic() + self.rpc.retry_for
            raise


@mypyc_attr(allow_interpreted_subclasses=True)  # workq's QueuePipeline
class Batch:
    """Requests queued and sent together (a pipeline, as redis-py has).

    :meth:`add` queues a request and returns its Pending; nothing is sent
    until :meth:`send` or :meth:`execute`, or until half the Pipe's bound
    is queued (then those go out in one write). :meth:`execute` sends the
    rest and returns every answer in the order added, the first error
    raised (once all answers are read) or, with ``raise_on_error=False``,
    errors in place of values. As a context manager it executes on a clean
    exit; if the block raises, requests still queued are dropped unsent
    (their Pending raise CancelledError) and those already sent are
    answered as usual.
    """

    def __init__(self, pipe: Pipe, raise_on_error: bool = True) -> None:
        self.pipe = pipe
        self.raise_on_error = raise_on_error
        self._queued: list[Pending[Any]] = []
        self._added: list[Pending[Any]] = []

    def add(self, request: Request, decode: Callable[[Reply], T]) -> Pending[T]:
        """Queue ``request``; its answer comes through the returned Pending."""
        pending = Pending(self.pipe, request, decode, self)
        self._queued.append(pending)
        self._added.append(pending)
        if len(self._queued) >= max(1, self.pipe.max_in_flight // 2):
            self.send()
        return pending

    def __len__(self) -> int:
        """Requests added since the last execute."""
        return len(self._added)

    def send(self) -> None:
        """Send what is queued, without waiting for answers."""
        queued, self._queued = self._queued, []
        self.pipe.send_batch(queued)

    def execute(self, raise_on_error: bool | None = None) -> list[Any]:
        """Send what is queued, wait for every answer and return them in
        order; the batch is then empty and can be used again."""
        self.send()
        added, self._added = self._added, []
        errors = [p.exception() for p in added]  # settles each, in order
        first = next((e for e in errors if e is not None), None)
        if first is not None and (self.raise_on_error if raise_on_error is None else raise_on_error):
            raise first
        return [e if e is not None else p.result() for p, e in zip(added, errors, strict=True)]

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        if exc_type is None:
            self.execute()
            return
        for pending in self._queued:
            pending._fail(CancelledError("not sent: the block of its pipeline raised"))
        self._queued, self._added = [], []


def _size(request: Request) -> int:
    return sum(part.nbytes for part in request.parts.values()) if request.parts else 0
