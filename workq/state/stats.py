"""The operator view: totals and per-key figures (``shardmgr queue stats``).

Computed on demand under the owner lock from the in-memory positions and a
few record heads (the oldest pending item per key, the item pinning the
oldest segment), never by reading payloads.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from common.journal import Marker
from common.journal.header import HEADER_SIZE
from workq.disk.records import TIME_AT, job_dir
from workq.disk.segment import Segment
from workq.protocol import Handle

if TYPE_CHECKING:
    from .queue import QueueState

STATE_NAMES: Final = {int(Marker.LIVE): "pending or leased", int(Marker.BURIED): "buried"}


def totals(state: QueueState) -> dict[str, int]:
    """Flat counters for ``stats`` and Prometheus."""
    return {
        "segments": len(state.segments), "keys": len(state.keys), "jobs": len(state.logs),
        **state.items.totals(),
        "results_undelivered": sum(log.undelivered for log in state.logs.values()),
        "segment_bytes": sum(s.journal.end for s in state.segments.values()),
        "reconnect_window_open": int(state.window_ends > time.monotonic()),
        **state.full_disk.stats(),
    }


def key_stats(state: QueueState) -> list[dict[str, Any]]:
    """Per key: pending, in flight, buried, oldest pending age, segments,
    live and dead bytes, and the oldest item pinning its oldest segment."""
    in_flight: dict[int, int] = {}
    for leases in state.items.leases.by_worker.values():
        for lease in leases:
            in_flight[lease.segment] = in_flight.get(lease.segment, 0) + len(lease.handles)
    now_ns = time.time_ns()
    out = []
    for key, segments in sorted(state.keys.items()):
        used = sum(s.journal.end - HEADER_SIZE for s in segments)
        dead = sum(s.dead_bytes for s in segments)
        out.append({
            "model": key.model, "shape": key.shape, "lane": key.lane,
            "pending": sum(s.pending for s in segments),
            "in_flight": sum(in_flight.get(s.id, 0) for s in segments),
            "buried": sum(s.buried for s in segments),
            "segments": len(segments), "live_bytes": used - dead, "dead_bytes": dead,
            "oldest_pending_age_s": _oldest_pending_age(segments, now_ns),
            "pinned_by": _pinning(state, segments, now_ns),
        })
    return out


def _oldest_pending_age(segments: list[Segment], now_ns: int) -> float | None:
    for segment in segments:
        starts = [c.cursor for c in segment.jobs.values() if c.pending > 0]
        if starts:
            for chunk in segment.journal.scan(start=min(starts)):
                live = [i for i in np.flatnonzero(chunk.markers == np.uint32(Marker.LIVE)).tolist()
                        if int(chunk.offsets[i]) not in segment.held]
                if live:
                    first = chunk[live[0]:live[0] + 1]
                    return round((now_ns - int(segment.journal.fields(first, TIME_AT, "<u8")[0])) / 1e9, 3)
    return None


def _pinning(state: QueueState, segments: list[Segment], now_ns: int) -> dict[str, Any] | None:
    """The oldest unfinished item of the oldest segment: it keeps that segment on disk."""
    oldest = segments[0]
    found = oldest.oldest_unfinished()
    if found is None:
        return None
    offset, job, enqueued_ns, marker = found
    name = state.logs[job].name if job in state.logs else job_dir(job)
    return {"segment": oldest.id, "handle": str(Handle(oldest.id, offset)), "job": name,
            "age_s": round((now_ns - enqueued_ns) / 1e9, 3), "state": STATE_NAMES.get(marker, "unknown")}
