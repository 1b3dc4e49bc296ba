"""workq as a component of ``shardmgr serve``: its commands on the wire.

Arguments are checked on the connection's thread; the operation then runs on
the broker's owner thread, which answers the request. Commands and their
parts are documented in docs/workq.md.

A worker names itself with ``workq.hello`` (reporting the handles it holds)
before it leases; when its connection drops, its leases end after the
disconnect grace period unless it comes back and reports them.

Results are marked delivered when the response carrying them has been
written to the consumer's socket; if the connection closes first, they are
handed out again. ``_lock`` guards the per-connection maps (connection
threads, writer threads and the owner thread all touch them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from common.journal import Flusher
from common.wire.component import Component, Request
from common.wire.errors import BadRequest, Internal, ServiceError
from common.wire.framing import DEFAULT_MAX_FRAME_BYTES
from workq.disk.completion_log import CompletionLog, Outgoing
from workq.state.dispatch import Filters
from workq.state.queue import COMPLETED, Leased
from workq.state.stats import key_stats, totals

from .broker import Broker
from .config import WorkqConfig
from .protocol import Key
from .state import leasing

log = logging.getLogger(__name__)

LENGTH_DTYPES = ("<u4", "<i4", "<u8", "<i8")


def split(data: np.ndarray, lengths: np.ndarray) -> list[memoryview]:
    """Byte strings sent as one concatenated part plus their lengths."""
    if lengths.ndim != 1 or (lengths < 0).any() or int(lengths.sum()) != data.nbytes:
        raise BadRequest(f"lengths must be non-negative and sum to the {data.nbytes} data bytes")
    view = data.data.cast("B")
    ends = np.cumsum(lengths).tolist()
    return [view[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def joined(payloads: Sequence[memoryview | bytes]) -> dict[str, np.ndarray]:
    """The inverse of split: the parts for a list of byte strings."""
    lengths = np.fromiter((len(p) for p in payloads), dtype=np.uint32, count=len(payloads))
    return {"data": np.frombuffer(b"".join(payloads), dtype=np.uint8), "lengths": lengths}


class _Delivery:
    """One results response: sent (confirm) or dropped, exactly once."""

    def __init__(self, job_log: CompletionLog, batch: list[Outgoing]) -> None:
        self.job_log, self.batch = job_log, batch
        self.state = "sending"


class WorkqService(Component):
    name = "workq"

    def __init__(self, data_dir: Path, config: WorkqConfig, flusher: Flusher,
                 max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        fitted = config.fitted_to_frame(max_frame_bytes)
        if fitted != config:
            log.warning("workq: payloads and results capped at %d bytes to fit max_frame_bytes (%d)",
                        fitted.max_payload_bytes, max_frame_bytes)
        self.broker = Broker(data_dir, fitted, flusher=flusher, lock=False)
        #: Payload bytes one lease or results response may carry (see
        #: WorkqConfig.reply_bytes), so that it always fits a frame.
        self.reply_bytes = config.reply_bytes(max_frame_bytes)
        self._lock = threading.Lock()
        self._workers: dict[int, str] = {}  # connection -> worker name
        self._filters: dict[int, Filters] = {}  # connection -> what its worker serves
        self._deliveries: dict[int, list[_Delivery]] = {}  # connection -> results in flight to it
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

    def stop(self) -> None:
        self.broker.close()

    def stats(self) -> dict[str, float | int]:
        try:
            return self.broker.call(lambda f: f.set_result(totals(self.broker.state)), timeout=10)
        except Exception:  # the owner thread is stopping or stuck: report nothing rather than hang
            return {}

    def handle(self, request: Request) -> None:
        self._handlers[request.cmd](request)

    def connection_closed(self, connection_id: int) -> None:
        with self._lock:
            worker = self._workers.pop(connection_id, None)
            if worker in self._workers.values():
                worker = None  # the worker is connected again (or twice): its leases stay
            self._filters.pop(connection_id, None)
            deliveries = self._deliveries.pop(connection_id, [])
            dropped = [d for d in deliveries if d.state == "sending"]
            for delivery in dropped:
                delivery.state = "dropped"
        if worker is not None or dropped:
            self._on_owner(None, lambda: self._closed(worker, dropped))

    def _closed(self, worker: str | None, dropped: list[_Delivery]) -> None:
        if worker is not None:
            leasing.worker_gone(self.broker.state, worker, time.monotonic())
        for delivery in dropped:
            self.broker.state.drop_results(delivery.job_log, delivery.batch)

    # ---------------------------------------------------------------- helpers

    def _on_owner(self, request: Request | None, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the owner thread; errors become the request's answer."""

        def run() -> None:
            try:
                fn()
            except Exception as exc:
                if request is None:
                    log.exception("workq: cleanup failed")
                else:
                    _fail(request, exc)

        self.broker.submit(run)

    def _worker(self, request: Request) -> str:
        with self._lock:
            worker = self._workers.get(request.connection_id)
        if worker is None:
            raise BadRequest(f"{request.cmd}: send workq.hello first to name this worker")
        return worker

    @staticmethod
    def _handles(request: Request) -> np.ndarray:
        return request.part("handles", "<u8", ndim=1)

    @staticmethod
    def _payloads(request: Request) -> list[memoryview]:
        return split(request.part("data", "|u1", ndim=1), request.part("lengths", LENGTH_DTYPES, ndim=1))

    # --------------------------------------------------------------- producers

    def _enqueue(self, request: Request) -> None:
        job = request.arg("job", str)
        key = _key(request)
        durable = request.arg("durable", bool, False)
        payloads = self._payloads(request)

        def run() -> None:
            packed, ticket = self.broker.state.enqueue(job, key, payloads)
            reply = lambda: request.reply({}, {"handles": packed})  # noqa: E731
            if durable:
                self.broker.after_durable([ticket], reply, lambda exc: _fail(request, exc))
            else:
                reply()

        self._on_owner(request, run)

    def _job_status(self, request: Request) -> None:
        job = request.arg("job", str)
        self._on_owner(request, lambda: request.reply(self.broker.state.job_status(job)))

    def _results(self, request: Request) -> None:
        job = request.arg("job", str)
        limit = request.arg("max_items", int, 1000)
        wait = request.arg("wait", float, 0.0)
        if limit < 0 or wait < 0:
            raise BadRequest("workq.results: max_items and wait must be >= 0")

        def attempt(final: bool) -> bool:
            if not request.connection_open:
                return True  # nobody to answer
            job_log, batch = self.broker.state.take_results(job, limit, self.reply_bytes)
            if not batch and not final:
                return False
            self._send_results(request, job_log, batch)
            return True

        def run() -> None:
            self.broker.state.job(job)
            self.broker.park(time.monotonic() + wait, attempt, "results", lambda exc: _fail(request, exc))

        self._on_owner(request, run)

    def _send_results(self, request: Request, job_log: CompletionLog, batch: list[Outgoing]) -> None:
        payloads = [p for out in batch for p in out.payloads]
        parts = {"handles": np.concatenate([o.handles for o in batch]) if batch else np.zeros(0, np.uint64),
                 "positions": np.concatenate([o.positions for o in batch]) if batch else np.zeros(0, np.uint64),
                 **joined(payloads)}
        if not batch:
            request.reply({"count": 0}, parts)
            return
        delivery = _Delivery(job_log, batch)
        with self._lock:
            if request.connection_open:
                self._deliveries.setdefault(request.connection_id, []).append(delivery)
            else:
                delivery.state = "dropped"
        if delivery.state == "dropped":
            self.broker.state.drop_results(job_log, batch)
            return
        request.reply({"count": len(payloads)}, parts, on_sent=lambda: self._sent(request.connection_id, delivery))

    def _sent(self, connection_id: int, delivery: _Delivery) -> None:
        """Writer thread: the response is on the socket."""
        with self._lock:
            if delivery.state != "sending":
                return
            delivery.state = "sent"
            mine = self._deliveries.get(connection_id)
            if mine is not None and delivery in mine:
                mine.remove(delivery)
        self._on_owner(None, lambda: self.broker.state.confirm_results(delivery.job_log, delivery.batch))

    # ----------------------------------------------------------------- workers

    def _hello(self, request: Request) -> None:
        worker = request.arg("worker", str)
        if not 0 < len(worker) <= 256:
            raise BadRequest("workq.hello: worker must be a non-empty name of at most 256 characters")
        held = request.part("held", "<u8", ndim=1) if "held" in request.parts else np.zeros(0, np.uint64)
        try:
            filters = Filters.of(request.args.get("models"), request.args.get("shapes"), request.args.get("lanes"))
        except ValueError as exc:
            raise BadRequest(f"workq.hello: {exc}") from None
        with self._lock:
            self._workers[request.connection_id] = worker
            self._filters[request.connection_id] = filters

        def run() -> None:
            dropped = leasing.hello(self.broker.state, worker, held.tolist(), time.monotonic())
            request.reply({"kept": len(set(held.tolist())) - len(dropped)},
                          {"dropped": np.array(dropped, dtype=np.uint64)})

        self._on_owner(request, run)

    def _lease(self, request: Request) -> None:
        worker = self._worker(request)
        limit = request.arg("max_items", int, 1)
        wait = request.arg("wait", float, 0.0)
        if limit < 0 or wait < 0:
            raise BadRequest("workq.lease: max_items and wait must be >= 0")
        with self._lock:
            filters = self._filters[request.connection_id]

        def attempt(final: bool) -> bool:
            if not request.connection_open:
                return True
            return self.broker.try_lease(worker, filters, limit, final, lambda b: request.reply(*_lease_reply(b)),
                                         self.reply_bytes)

        self._on_owner(request, lambda: self.broker.park(time.monotonic() + wait, attempt, "items",
                                                         lambda exc: _fail(request, exc)))

    def _complete(self, request: Request) -> None:
        self._worker(request)
        packed = self._handles(request)
        payloads = self._payloads(request)
        if len(payloads) != len(packed):
            raise BadRequest(f"workq.complete: {len(packed)} handles but {len(payloads)} results")

        def answer(statuses: list[str]) -> None:
            status = np.fromiter((s == COMPLETED for s in statuses), dtype=np.uint8, count=len(statuses))
            request.reply({"completed": int(status.sum())}, {"status": status})

        self._on_owner(request, lambda: self.broker.complete_async(packed, payloads, answer,
                                                                   lambda exc: _fail(request, exc)))

    def _release(self, request: Request) -> None:
        worker = self._worker(request)
        packed = self._handles(request).tolist()
        delay = request.arg("delay", float, 0.0)
        if delay < 0:
            raise BadRequest("workq.release: delay must be >= 0")
        def run() -> None:
            leasing.release(self.broker.state, worker, packed, delay, time.monotonic())
            request.reply()

        self._on_owner(request, run)

    def _touch(self, request: Request) -> None:
        worker = self._worker(request)
        packed = self._handles(request).tolist()
        def run() -> None:
            leasing.touch(self.broker.state, worker, packed, time.monotonic())
            request.reply()

        self._on_owner(request, run)

    # ---------------------------------------------------------------- operator

    def _kick(self, request: Request) -> None:
        job = request.arg("job", str)
        self._on_owner(request, lambda: request.reply({"kicked": self.broker.state.kick(job)}))

    def _stats(self, request: Request) -> None:
        self._on_owner(request, lambda: request.reply({"totals": totals(self.broker.state),
                                                       "keys": key_stats(self.broker.state)}))


def _fail(request: Request, exc: Exception) -> None:
    """Answer ``request`` with ``exc`` as a coded error (ValueError: bad_request)."""
    if isinstance(exc, ServiceError):
        request.fail(exc)
    elif isinstance(exc, ValueError):
        request.fail(BadRequest(f"{request.cmd}: {exc}"))
    else:
        log.error("workq: %s failed", request.cmd, exc_info=exc)
        request.fail(Internal(f"{request.cmd}: {type(exc).__name__}: {exc}"))


def _key(request: Request) -> Key:
    try:
        return Key.of(request.args.get("model"), request.args.get("shape"), request.args.get("lane"))
    except ValueError as exc:
        raise BadRequest(f"{request.cmd}: {exc}") from None


def _lease_reply(batches: list[Leased]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Arrays for a lease response: per item, its batch's job and key by index."""
    jobs = sorted({b.job for b in batches})
    keys = sorted({b.key for b in batches})
    job_index = {j: i for i, j in enumerate(jobs)}
    key_index = {k: i for i, k in enumerate(keys)}
    sizes = [len(b.handles) for b in batches]
    empty = np.zeros(0, dtype=np.uint64)
    parts: dict[str, np.ndarray] = {
        "handles": np.concatenate([b.handles for b in batches]) if batches else empty,
        "positions": np.concatenate([b.positions for b in batches]).astype(np.uint64) if batches else empty,
        "deliveries": np.concatenate([b.deliveries for b in batches]) if batches else empty.astype(np.uint32),
        "job_index": np.repeat(np.array([job_index[b.job] for b in batches], dtype=np.uint32), sizes),
        "key_index": np.repeat(np.array([key_index[b.key] for b in batches], dtype=np.uint32), sizes),
        **joined([p for b in batches for p in b.payloads]),
    }
    return {"jobs": jobs, "keys": [list(k) for k in keys]}, parts
