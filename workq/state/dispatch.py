"""Dispatch planning: which pending items a lease takes, fairly.

Fair across keys: each lease starts at the next key in rotation among the
keys the worker serves, and fills from the following keys if the first runs
short (items carry their key, so a worker can group them). Fair across
jobs: within a key, the lease's items are shared among the jobs with
pending items by water-filling (equal shares, capped by what each job has,
leftovers shared again), starting at the next job in rotation. A job's
items come from its oldest segments first, in enqueue order.

Planning reads (it walks segments and reads the chosen payloads) but
changes nothing; the commit (Segment.commit_take and the lease table) is
in-memory only, so a dispatch either happens whole or not at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TypeVar

from workq.config import REPLY_BATCH_BYTES
from workq.disk.segment import Segment, Taken
from workq.protocol import Key

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class Filters:
    """What a worker serves: models, shapes and lanes (None: any)."""

    models: frozenset[str] | None = None
    shapes: frozenset[str] | None = None
    lanes: frozenset[str] | None = None

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, models: frozenset[str] | None = None, shapes: frozenset[str] | None = None,
                 lanes: frozenset[str] | None = None) -> None:
        object.__setattr__(self, "models", models)
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "lanes", lanes)

    def match(self, key: Key) -> bool:
        return ((self.models is None or key.model in self.models)
                and (self.shapes is None or key.shape in self.shapes)
                and (self.lanes is None or key.lane_name in self.lanes))

    @classmethod
    def of(cls, models: object = None, shapes: object = None, lanes: object = None) -> Filters:
        """Filters from lists of names (ints allowed for lanes); ValueError if malformed."""
        return cls(*(None if v is None else _names(name, v) for name, v in
                     (("models", models), ("shapes", shapes), ("lanes", lanes))))


def _names(name: str, values: object) -> frozenset[str]:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, set, frozenset)):
        raise ValueError(f"{name} must be a list of strings, got {values!r}")
    out = []
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a list of strings, got an item {value!r}")
        out.append(value)
    return frozenset(out)


def rotated(items: Sequence[T], start: int) -> list[T]:
    """``items`` starting at index ``start`` (mod len), wrapping around."""
    if not items:
        return []
    start %= len(items)
    return list(items[start:]) + list(items[:start])


def water_fill(available: dict[int, int], total: int, order: list[int]) -> dict[int, int]:
    """Share ``total`` among jobs: equal shares capped by availability."""
    alloc = {job: 0 for job in order}
    active = [job for job in order if available.get(job, 0) > 0]
    while total > 0 and active:
        share = max(1, total // len(active))
        for job in list(active):
            give = min(share, available[job] - alloc[job], total)
            alloc[job] += give
            total -= give
            if alloc[job] >= available[job]:
                active.remove(job)
            if total == 0:
                break
    return alloc


def shares(available: dict[int, int], limit: int, job_turn: int) -> list[tuple[int, int]]:
    """Each job's share of a lease of ``limit`` items, in dispatch order:
    water-filling from the job in turn (jobs with none left out). One item
    goes to the job in turn: water-filling's answer, without its dicts."""
    jobs = sorted(available)
    if limit == 1:
        return [(jobs[job_turn % len(jobs)], 1)]
    return [(job, n) for job, n in water_fill(available, limit, rotated(jobs, job_turn)).items() if n]


def plan_key(segments: list[Segment], limit: int, job_turn: int, max_bytes: int | None = None,
             first: bool = True) -> list[Taken]:
    """Up to ``limit`` pending items of one key's dispatchable segments,
    within ``max_bytes`` of response (see Segment.take; ``first``: nothing
    is taken yet, so at least one item is)."""
    available: dict[int, int] = {}
    for segment in segments:
        for job, cursor in segment.jobs.items():
            if cursor.pending > 0:
                available[job] = available.get(job, 0) + cursor.pending
    if not available:
        return []
    budget = max_bytes if max_bytes is not None else 1 << 62
    taken: list[Taken] = []
    for job, quota in shares(available, limit, job_turn):
        for segment in segments:
            if quota <= 0 or budget <= REPLY_BATCH_BYTES:
                break
            part = segment.take(job, quota, budget - REPLY_BATCH_BYTES, first and not taken)
            if part is not None:
                taken.append(part)
                quota -= len(part.offsets)
                budget -= part.cost + REPLY_BATCH_BYTES
    return taken
