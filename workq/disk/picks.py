"""Picks: which records of a scanned chunk a dispatch or a results take gets.

A dispatch takes a job's first pending items from a segment, and a results
take a log's first undelivered results, both in log order, both within a
count and a byte budget (payload plus REPLY_ITEM_BYTES per record; the
first record of a response is taken even if it alone passes the budget).

Each rule has two forms with the same answers (tests/workq/disk/test_picks.py):
the vectorised one for big chunks, and a plain-int one for chunks of at most
:data:`~common.journal.record.SMALL_BATCH` records, where numpy's per-call
overhead costs more than the work (one item per lease is common; most
results takes find one or two new results).
"""

from __future__ import annotations

from collections.abc import Set
from typing import Final

import numpy as np

from common.journal import Marker
from common.journal.record import SMALL_BATCH
from common.journal.scan import RecordChunk
from workq.config import REPLY_ITEM_BYTES

from .records import HEAD_BYTES, LEDGER

LIVE: Final = np.uint32(Marker.LIVE)
_LIVE, _LEDGER = int(Marker.LIVE), int(LEDGER)  # plain ints for the small forms

ResultsPick = tuple[np.ndarray, int, bool]
"""Indices of the results picked, their cost in bytes, and whether the take
must stop after them (a result not yet durable, or out of room; moot once
``limit`` are picked, when it stops anyway)."""

ItemsPick = tuple[np.ndarray, int, int | None]
"""Indices of the items picked, their cost in bytes, and where the dispatch
stops in the chunk (None: it goes on to the next records): past the last
item picked once ``limit`` are, or at the first item that did not fit."""


def budgeted(costs: np.ndarray, budget: int, first: bool) -> int:
    """How many of ``costs`` (taken in order) fit in ``budget`` bytes; with
    ``first``, at least one (a response is never empty for want of room)."""
    fits = int(np.searchsorted(np.cumsum(costs), budget, side="right"))
    return max(fits, min(1, len(costs))) if first else fits


def results(chunk: RecordChunk, handles: np.ndarray, skip: Set[int], completing: Set[int], limit: int,
            budget: int, first: bool) -> ResultsPick:
    """Up to ``limit`` LIVE results of ``chunk`` (not ledger entries, not at
    an offset in ``skip``: in delivery) before the first one whose handle is
    in ``completing``, within ``budget`` (``first``: at least one)."""
    if len(chunk) <= SMALL_BATCH:
        return _few_results(chunk, handles, skip, completing, limit, budget, first)
    mask = (chunk.markers == LIVE) & (handles != LEDGER)
    if skip:
        mask &= ~np.isin(chunk.offsets, np.fromiter(skip, dtype=np.int64, count=len(skip)))
    halt = False
    if completing:
        blocked = np.fromiter(completing, dtype=np.uint64, count=len(completing))
        unfinished = np.flatnonzero(mask & np.isin(handles, blocked))
        if len(unfinished):
            mask[int(unfinished[0]):] = False
            halt = True
    picked = np.flatnonzero(mask)[:limit]
    costs = chunk.lengths[picked] - HEAD_BYTES + REPLY_ITEM_BYTES
    kept = budgeted(costs, budget, first)
    return picked[:kept], int(costs[:kept].sum()), halt or kept < len(picked)


def _few_results(chunk: RecordChunk, handles: np.ndarray, skip: Set[int], completing: Set[int], limit: int,
                 budget: int, first: bool) -> ResultsPick:
    picked: list[int] = []
    cost, halt = 0, False
    for i, (offset, marker, length, handle) in enumerate(zip(chunk.offsets.tolist(), chunk.markers.tolist(),
                                                             chunk.lengths.tolist(), handles.tolist())):
        if marker != _LIVE or handle == _LEDGER or offset in skip:
            continue
        if handle in completing:
            halt = True
            break
        if len(picked) == limit:
            break
        size = length - HEAD_BYTES + REPLY_ITEM_BYTES
        if cost + size > budget and (picked or not first):
            halt = True
            break
        picked.append(i)
        cost += size
    return np.array(picked, dtype=np.int64), cost, halt


def items(chunk: RecordChunk, jobs: np.ndarray, job: int, held: Set[int], limit: int, budget: int,
          first: bool) -> ItemsPick:
    """Up to ``limit`` LIVE items of ``job`` in ``chunk`` (``jobs``: each
    record's job) whose offset is not ``held``, within ``budget``
    (``first``: at least one)."""
    if len(chunk) <= SMALL_BATCH:
        return _few_items(chunk, jobs, job, held, limit, budget, first)
    candidates = np.flatnonzero((chunk.markers == LIVE) & (jobs == np.uint64(job)))
    picked = _free(chunk.offsets, candidates, held, limit)
    costs = chunk.lengths[picked] - HEAD_BYTES + REPLY_ITEM_BYTES
    kept = budgeted(costs, budget, first)
    if kept == len(picked) < limit:
        return picked, int(costs.sum()), None
    cut = int(picked[kept - 1]) + 1 if kept else int(picked[0])
    return picked[:kept], int(costs[:kept].sum()), cut


def _free(offsets: np.ndarray, candidates: np.ndarray, held: Set[int], limit: int) -> np.ndarray:
    """The first ``limit`` of ``candidates`` (indices into ``offsets``)
    whose offset is not held; one set lookup per candidate looked at."""
    if not held:
        return candidates[:limit]
    picked = []
    for index, offset in zip(candidates.tolist(), offsets[candidates].tolist()):
        if offset not in held:
            picked.append(index)
            if len(picked) == limit:
                break
    return np.array(picked, dtype=np.int64)


def _few_items(chunk: RecordChunk, jobs: np.ndarray, job: int, held: Set[int], limit: int, budget: int,
               first: bool) -> ItemsPick:
    picked: list[int] = []
    cost = 0
    for i, (offset, marker, length, owner) in enumerate(zip(chunk.offsets.tolist(), chunk.markers.tolist(),
                                                            chunk.lengths.tolist(), jobs.tolist())):
        if marker != _LIVE or owner != job or offset in held:
            continue
        size = length - HEAD_BYTES + REPLY_ITEM_BYTES
        if cost + size > budget and (picked or not first):
            return np.array(picked, dtype=np.int64), cost, picked[-1] + 1 if picked else i
        picked.append(i)
        cost += size
        if len(picked) == limit:
            return np.array(picked, dtype=np.int64), cost, i + 1
    return np.array(picked, dtype=np.int64), cost, None
