"""workq's exceptions: one root, :class:`WorkqError`.

Errors that a server sends carry a stable ``workq.*`` code (see
docs/protocol.md and docs/workq.md) and are raised again by clients.
``DiskFull`` (free space below the floor, or the disk full) is the shared
``disk_full`` of common.wire.errors, re-exported here: the vector store
answers the same code.
"""

from __future__ import annotations

from common.wire.errors import BadRequest, Conflict, DiskFull, NotFound, ServiceError


class WorkqError(ServiceError):
    """Root of every workq error."""

    code = "workq.error"


class UnknownHandle(WorkqError, NotFound):
    """A handle that names no item of this broker (never dispatched, garbage)."""

    code = "workq.unknown_handle"


class NotLeased(WorkqError, Conflict):
    """The item is not leased by this worker (completed, reclaimed, or never leased)."""

    code = "workq.not_leased"


class UnknownJob(WorkqError, NotFound):
    """No item was ever enqueued for this job. Kept for clients of older
    servers: this version raises it nowhere (``job_status``, ``results`` and
    ``kick`` answer zeros, nothing and 0 for such a job)."""

    code = "workq.unknown_job"


class WorkerIdInUse(WorkqError, Conflict):
    """``workq.hello`` named a worker that another live connection holds,
    from another :class:`~workq.Worker` (another session): two processes
    must not share a worker id. The same Worker reconnecting takes its
    name over instead."""

    code = "workq.worker_id_in_use"


class PayloadTooLarge(WorkqError, BadRequest):
    """A payload or result exceeds the configured maximum."""

    code = "workq.payload_too_large"


class ResultsNotRecorded(WorkqError):
    """A complete call could write only some of its results (the cause says
    why). Those written are recorded; retrying the whole call is safe, since
    their items then answer ``duplicate``."""

    code = "workq.results_not_recorded"


__all__ = ["WorkqError", "UnknownHandle", "NotLeased", "UnknownJob", "WorkerIdInUse", "PayloadTooLarge",
           "DiskFull", "ResultsNotRecorded"]
