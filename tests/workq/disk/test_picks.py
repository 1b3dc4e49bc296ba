"""The plain-int forms of the dispatch and results picks against the vectorised ones."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from common.journal import Marker
from common.journal.scan import RecordChunk
from tests.profiles import examples
from workq.disk import picks
from workq.disk.records import LEDGER

T = TypeVar("T")
MARKERS = [int(Marker.LIVE)] * 3 + [int(Marker.DELIVERED), int(Marker.RETIRED)]


@st.composite
def chunks(draw: st.DrawFn, owners: list[int]) -> tuple[RecordChunk, np.ndarray]:
    """A chunk of up to SMALL_BATCH records and a per-record value (its handle or its job)."""
    n = draw(st.integers(0, 8))
    offsets = np.cumsum(np.array(draw(st.lists(st.integers(1, 9), min_size=n, max_size=n)), dtype=np.int64)) * 64
    markers = np.array(draw(st.lists(st.sampled_from(MARKERS), min_size=n, max_size=n)), dtype=np.uint32)
    lengths = np.array(draw(st.lists(st.integers(24, 600), min_size=n, max_size=n)), dtype=np.int64)
    values = np.array(draw(st.lists(st.sampled_from(owners), min_size=n, max_size=n)), dtype=np.uint64)
    return RecordChunk(offsets, markers, lengths, np.zeros(n, dtype=bool), 0), values


def offsets_at(chunk: RecordChunk, at: set[int]) -> set[int]:
    return {int(chunk.offsets[i]) for i in at if i < len(chunk)}


def both_forms(pick: Callable[..., T], *args: Any) -> tuple[T, T]:
    """``pick(*args)`` by its plain-int form and by its vectorised one."""
    few = pick(*args)
    with mock.patch.object(picks, "SMALL_BATCH", -1):
        return few, pick(*args)


@settings(max_examples=examples(200))
@given(chunk=chunks([1, 2, 3, 4, 5, 6, int(LEDGER)]), skip_at=st.sets(st.integers(0, 7)),
       completing=st.sets(st.integers(1, 6), max_size=2), limit=st.integers(1, 9), budget=st.integers(0, 3000),
       first=st.booleans())
def test_results_picks_of_few_records_equal_the_vectorised_ones(
        chunk: tuple[RecordChunk, np.ndarray], skip_at: set[int], completing: set[int], limit: int, budget: int,
        first: bool) -> None:
    records, handles = chunk
    skip = offsets_at(records, skip_at)
    few, many = both_forms(picks.results, records, handles, skip, completing, limit, budget, first)
    assert few[0].tolist() == many[0].tolist() and few[1] == many[1]
    if len(few[0]) < limit:  # at the limit the take stops anyway: whether a later result is blocked is moot
        assert few[2] == many[2]


@settings(max_examples=examples(200))
@given(chunk=chunks([1, 2, 3]), held_at=st.sets(st.integers(0, 7)), job=st.integers(1, 3),
       limit=st.integers(1, 9), budget=st.integers(0, 3000), first=st.booleans())
def test_dispatch_picks_of_few_records_equal_the_vectorised_ones(
        chunk: tuple[RecordChunk, np.ndarray], held_at: set[int], job: int, limit: int, budget: int,
        first: bool) -> None:
    records, jobs = chunk
    held = offsets_at(records, held_at)
    few, many = both_forms(picks.items, records, jobs, job, held, limit, budget, first)
    assert (few[0].tolist(), few[1], few[2]) == (many[0].tolist(), many[1], many[2])
