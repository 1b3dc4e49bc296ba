"""workq as a component of ``shardmgr serve``: frames in, Broker calls, frames out.

Each command's arguments and parts are checked on the connection's thread
and become one :class:`~workq.broker.Broker` call; its answer (under the
broker's owner lock, often on the connection's own thread: a Callback for
the commands workers and consumers repeat, a Future's callback for the
others) becomes the reply. Every queue rule lives
in the broker; what is here is the wire's own: which worker a connection
is, which results responses are on their way to which connection, and the
byte budget of a response. Commands and their parts are in docs/workq.md;
the encodings in protocol.py.

A worker names itself with ``workq.hello`` (reporting the handles it holds)
before it leases; when its connection drops, its leases end after the
disconnect grace period unless it comes back and reports them. A name
belongs to one live connection: a hello naming a worker that another live
connection holds waits up to CLAIM_WAIT_S for it to close, then is refused
(WorkerIdInUse), unless it carries the same ``session`` (the same Worker
object, reconnected before the server noticed its old connection died),
which takes the name over at once.

Results are marked delivered when the response carrying them has been
written to the consumer's socket (its ``on_sent``); if the connection
closes first, they are dropped and handed out again (delivery.py).

Threads: ``_lock`` guards the per-connection maps, which connection
threads, writer threads, the owner and flusher threads all touch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Final, TypeVar

import numpy as np

from common.journal import Flusher
from common.wire.component import Component, Request
from common.wire.errors import BadRequest, Internal, ServiceError, Unavailable
from common.wire.framing import DEFAULT_MAX_FRAME_BYTES, Body

from .answer import Callback
from .broker import Broker
from .calls import Alive
from .config import WorkqConfig
from .delivery import Delivery
from .errors import WorkerIdInUse
from .protocol import LENGTH_DTYPES, Key, encode_lease, encode_statuses, encode_statuses_and_lease, split_view
from .state.dispatch import Filters
from .totals import TotalsReader

log = logging.getLogger(__name__)

T = TypeVar("T")
Reply = tuple[dict[str, Any], Body]
MAX_SESSION: Final = 128  # characters of a hello's session token
#: Seconds a hello waits for the connection holding its worker id to close
#: before it is refused: a client that closed and reconnected at once is
#: not refused because the server had not handled the close yet.
CLAIM_WAIT_S: Final = 2.0


@dataclasses.dataclass(frozen=True, slots=True)
class _Claim:
    """The live connection a worker name belongs to, and the session (one
    Worker object; None from clients that send none) that said hello on it."""

    connection: int
    session: str | None

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, connection: int, session: str | None) -> None:
        object.__setattr__(self, "connection", connection)
        object.__setattr__(self, "session", session)


class WorkqService(Component):
    name = "workq"

    def __init__(self, data_dir: Path, config: WorkqConfig, flusher: Flusher,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        fitted = config.fitted_to_frame(max_frame_bytes)
        if fitted != config:
            log.warning("workq: payloads and results capped at %d bytes to fit max_frame_bytes (%d)",
                        fitted.max_payload_bytes, max_frame_bytes)
        self.broker = Broker(data_dir, fitted, flusher=flusher, lock=False)
        self.workers = self.broker.workers  # compiled to compiled: the worker side's calls skip the broker's
        self.totals = TotalsReader(self.broker.totals_async)
        #: Payload bytes one lease or results response may carry (see
        #: WorkqConfig.reply_bytes), so that it always fits a frame.
        self.reply_bytes = config.reply_bytes(max_frame_bytes)
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)  # notified when a connection gives its worker id up
        self._workers: dict[int, str] = {}  # connection -> worker name
        self._claims: dict[str, _Claim] = {}  # worker name -> its connection (the inverse of _workers)
        self._filters: dict[int, Filters] = {}  # connection -> what its worker serves
        self._deliveries: dict[int, set[Delivery]] = {}  # connection -> results responses on their way to it
        self._handlers: dict[str, Callable[[Request], None]] = {
            "workq.enqueue": self._enqueue, "workq.results": self._results, "workq.job_status": self._job_status,
            "workq.hello": self._hello, "workq.lease": self._lease, "workq.complete": self._complete,
            "workq.release": self._release, "workq.touch": self._touch, "workq.kick": self._kick,
            "workq.stats": self._stats,
        }

    # -------------------------------------------------------------- component

    def commands(self) -> Iterable[str]:
        return self._handlers

    def recover(self) -> None:
        self.broker.recover()

    def start(self) -> None:
        self.broker.start()

    def quiesce(self) -> None:
        self.broker.quiesce()

    def stop(self) -> None:
        self.broker.close()

    def stats(self) -> dict[str, float | int]:
        """The queue's totals; the last ones, marked stale, if the owner cannot answer (totals.py)."""
        return self.totals.read()

    def handle(self, request: Request) -> None:
        self._handlers[request.cmd](request)

    def connection_closed(self, connection_id: int) -> None:
        with self._lock:
            worker = self._workers.pop(connection_id, None)  # None too if its Worker moved to a new connection
            if worker is not None:
                del self._claims[worker]
                self._released.notify_all()
            self._filters.pop(connection_id, None)
            deliveries = self._deliveries.pop(connection_id, set())
        for delivery in deliveries:
            delivery.drop()
        if worker is not None:
            with contextlib.suppress(Unavailable):  # closed: leases are in memory only
                self.workers.worker_gone(worker)

    # ---------------------------------------------------------------- helpers

    @staticmethod
    def _then(request: Request, use: Callable[[T], None]) -> Callback[T]:
        """An answer that calls ``use(value)``; an error (the operation's, or
        one ``use`` raises) answers ``request``."""
        return Callback(use, lambda error: _fail(request, error))

    def _answer(self, request: Request, reply: Callable[[T], Reply | dict[str, Any]]) -> Callback[T]:
        """An answer that replies to ``request`` with ``reply(value)`` (a result, or a result and parts)."""

        def use(value: T) -> None:
            answer = reply(value)
            if isinstance(answer, tuple):
                request.reply(*answer)
            else:
                request.reply(answer)

        return self._then(request, use)

    def _relay(self, request: Request, future: Future[T], reply: Callable[[T], Reply | dict[str, Any]]) -> None:
        """:meth:`_answer` for an operation that answers with a Future; a
        cancelled future (nobody left to answer) does nothing."""
        answer = self._answer(request, reply)

        def done(f: Future[T]) -> None:
            if f.cancelled():
                return
            error = f.exception()
            if error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(f.result())

        future.add_done_callback(done)

    def _worker(self, request: Request) -> str:
        with self._lock:
            worker = self._workers.get(request.connection_id)
        if worker is None:
            raise BadRequest(f"{request.cmd}: send workq.hello first to name this worker")
        return worker

    @staticmethod
    def _payloads(request: Request) -> list[memoryview]:
        return split_view(request.part_view("data"), request.part_ints("lengths", LENGTH_DTYPES))

    @staticmethod
    def _handles(request: Request) -> np.ndarray:
        return request.part("handles", "<u8", ndim=1)

    # --------------------------------------------------------------- producers

    def _enqueue(self, request: Request) -> None:
        try:
            key = Key.of(request.args.get("model"), request.args.get("shape"), request.args.get("lane"))
        except ValueError as exc:
            raise BadRequest(f"{request.cmd}: {exc}") from None
        answer: Callback[np.ndarray] = self._answer(request, lambda packed: ({}, {"handles": packed}))
        self.broker.enqueue_into(answer, request.arg("job", str), key, self._payloads(request),
                                 request.arg("durable", bool, False))

    def _job_status(self, request: Request) -> None:
        self._relay(request, self.broker.job_status_async(request.arg("job", str)), lambda status: status)

    def _results(self, request: Request) -> None:
        answer: Callback[Delivery] = self._then(request, lambda delivery: self._send(request, delivery))
        self.broker.results_into(answer, request.arg("job", str), request.arg("max_items", int, 1000),
                                 request.arg("wait", float, 0.0), max_bytes=self.reply_bytes,
                                 alive=lambda: request.connection_open)

    def _send(self, request: Request, delivery: Delivery) -> None:
        """Owner thread: reply with the results; they count as delivered once written."""
        if not len(delivery):
            request.reply(*delivery.encode())
            return
        connection = request.connection_id
        with self._lock:
            sending = request.connection_open
            if sending:
                self._deliveries.setdefault(connection, set()).add(delivery)
        if not sending:
            delivery.drop()
            return
        request.reply(*delivery.encode(), on_sent=lambda: self._sent(connection, delivery))

    def _sent(self, connection: int, delivery: Delivery) -> None:
        """Writer thread: the response is on the socket."""
        with self._lock:
            self._deliveries.get(connection, set()).discard(delivery)
        # nobody waits for these marks (the response is out): the next timed round makes them durable
        delivery.confirm_into(Callback(_ignore, _log_unconfirmed), hurry=False)

    # ----------------------------------------------------------------- workers

    def _hello(self, request: Request) -> None:
        worker = request.arg("worker", str)
        if not 0 < len(worker) <= 256:
            raise BadRequest("workq.hello: worker must be a non-empty name of at most 256 characters")
        session = request.arg("session", str, None)
        if session is not None and not 0 < len(session) <= MAX_SESSION:
            raise BadRequest(f"workq.hello: session must be a non-empty string of at most {MAX_SESSION} characters")
        held = request.part("held", "<u8", ndim=1) if "held" in request.parts else np.zeros(0, np.uint64)
        try:
            filters = Filters.of(request.args.get("models"), request.args.get("shapes"), request.args.get("lanes"))
        except ValueError as exc:
            raise BadRequest(f"workq.hello: {exc}") from None
        given_up = self._claim(request, worker, session, filters)
        if given_up is not None:
            with contextlib.suppress(Unavailable):
                self.workers.worker_gone(given_up)
        reported = len(set(held.tolist()))
        self._relay(request, self.workers.hello_async(worker, held),
                     lambda dropped: ({"kept": reported - len(dropped)},
                                      {"dropped": np.array(dropped, dtype=np.uint64)}))

    def _claim(self, request: Request, worker: str, session: str | None, filters: Filters) -> str | None:
        """Give ``worker`` to the request's connection (WorkerIdInUse,
        changing nothing, if another live connection of another session
        still holds it after CLAIM_WAIT_S); returns the name the connection
        held before, if it gives one up. Runs on the connection's thread."""
        connection = request.connection_id
        deadline = time.monotonic() + CLAIM_WAIT_S
        with self._lock:
            while (claim := self._claims.get(worker)) is not None and claim.connection != connection and (
                    session is None or claim.session != session):
                if not self._released.wait(deadline - time.monotonic()):
                    raise WorkerIdInUse(f"worker id {worker!r} is in use by another live connection (another "
                                        f"process or Worker object): give each worker its own id (if that "
                                        f"process is gone, its id is free once the server sees its connection close)")
            if not request.connection_open:  # closed while it waited: a claim now would outlive the close
                raise Unavailable("workq.hello: the connection closed")
            if claim is not None and claim.connection != connection:
                # the same Worker on a new connection: the old one is dead, though not closed here yet
                del self._workers[claim.connection]
                del self._filters[claim.connection]
            previous = self._workers.get(connection)
            if previous is not None and previous != worker:
                del self._claims[previous]
                self._released.notify_all()
            self._claims[worker] = _Claim(connection, session)
            self._workers[connection] = worker
            self._filters[connection] = filters
        return previous if previous != worker else None

    def _holds(self, connection: int, worker: str) -> bool:
        """True while ``connection`` is still ``worker``'s (a dict read: atomic, no lock needed)."""
        return self._workers.get(connection) == worker

    def _leasing(self, request: Request) -> tuple[str, Filters, Alive]:
        """The connection's worker and filters (one look: a Worker reconnecting
        elsewhere takes both away), and whether a waiting lease for it is
        still wanted: one parked on a connection its worker left (for a new
        one) ends, taking nothing."""
        connection = request.connection_id
        with self._lock:
            worker, filters = self._workers.get(connection), self._filters.get(connection)
        if worker is None or filters is None:
            raise BadRequest(f"{request.cmd}: send workq.hello first to name this worker")
        return worker, filters, lambda: request.connection_open and self._holds(connection, worker)

    def _lease(self, request: Request) -> None:
        worker, filters, alive = self._leasing(request)
        self.workers.lease_into(self._answer(request, encode_lease), worker, filters, request.arg("max_items", int, 1),
                               request.arg("wait", float, 0.0), max_bytes=self.reply_bytes, alive=alive)

    def _complete(self, request: Request) -> None:
        worker = self._worker(request)
        packed = request.part_ints("handles", "<u8")
        payloads = self._payloads(request)
        if len(payloads) != len(packed):
            raise BadRequest(f"workq.complete: {len(packed)} handles but {len(payloads)} results")
        then_lease = request.arg("lease", int, 0)
        durable = request.arg("durable", bool, True)
        if not then_lease:
            self.workers.complete_into(self._answer(request, encode_statuses), packed, payloads, durable)
            return
        worker, filters, alive = self._leasing(request)
        self.workers.complete_and_lease_into(
            self._answer(request, encode_statuses_and_lease), worker, filters, packed, payloads, then_lease,
            request.arg("wait", float, 0.0), durable=durable, max_bytes=self.reply_bytes - len(packed), alive=alive)

    def _release(self, request: Request) -> None:
        future = self.workers.release_async(self._worker(request), self._handles(request),
                                           request.arg("delay", float, 0.0))
        self._relay(request, future, lambda _: {})

    def _touch(self, request: Request) -> None:
        self._relay(request, self.workers.touch_async(self._worker(request), self._handles(request)), lambda _: {})

    # ---------------------------------------------------------------- operator

    def _kick(self, request: Request) -> None:
        self._relay(request, self.broker.kick_async(request.arg("job", str)), lambda kicked: {"kicked": kicked})

    def _stats(self, request: Request) -> None:
        self._relay(request, self.broker.stats_async(), lambda stats: stats)


def _fail(request: Request, exc: BaseException) -> None:
    """Answer ``request`` with ``exc`` as a coded error (ValueError: bad_request)."""
    if isinstance(exc, ServiceError):
        request.fail(exc)
    elif isinstance(exc, ValueError):
        request.fail(BadRequest(f"{request.cmd}: {exc}"))
    else:
        log.error("workq: %s failed", request.cmd, exc_info=exc)
        request.fail(Internal(f"{request.cmd}: {type(exc).__name__}: {exc}"))


def _ignore(_: None) -> None:
    pass


def _log_unconfirmed(error: BaseException) -> None:
    log.error("workq: results written to a consumer could not be marked delivered: %s", error)
