"""Dispatch planning's shares (workq/state/dispatch.py): the one-item answer is water-filling's."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from workq.state.dispatch import rotated, shares, water_fill

availability = st.dictionaries(st.integers(0, 50), st.integers(1, 5), min_size=1, max_size=8)


@given(available=availability, limit=st.integers(1, 30), turn=st.integers(0, 100))
def test_shares_are_water_fillings_from_the_job_in_turn(available: dict[int, int], limit: int, turn: int) -> None:
    filled = water_fill(available, limit, rotated(sorted(available), turn))
    assert shares(available, limit, turn) == [(job, n) for job, n in filled.items() if n]
    assert sum(n for _, n in shares(available, limit, turn)) == min(limit, sum(available.values()))
