"""search.merge: the shortcut for a complete first part that is the answer
already gives what the full sort gives, with ties, NaN scores, unsorted
parts and parts of any width (issue 24)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from shardmgr.store.knn import merge

Part = tuple[np.ndarray, np.ndarray, np.ndarray]


@st.composite
def shard_parts(draw: st.DrawFn) -> tuple[list[Part], int, int, str]:
    """1-6 parts of nq queries, each k_i <= k columns, scores from a few
    values (ties) and NaN, sorted per metric or not, refs and ids all found (>= 0)."""
    nq, k = draw(st.integers(1, 4)), draw(st.integers(1, 5))
    metric = draw(st.sampled_from(["l2", "ip"]))
    parts: list[Part] = []
    for number in range(draw(st.integers(1, 6))):  # past 4 x k columns the merge partitions first
        width = k if number == 0 and draw(st.booleans()) else draw(st.integers(0, k))
        values = draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0, np.nan]), min_size=nq * width,
                               max_size=nq * width))
        scores = np.array(values, np.float32).reshape(nq, width)
        if draw(st.booleans()):  # as faiss gives them: nearest first
            scores = np.sort(scores, axis=1) if metric == "l2" else -np.sort(-scores, axis=1)
        refs = (number << 40) + np.arange(nq * width, dtype=np.int64).reshape(nq, width)
        parts.append((scores, refs + 7, refs))
    return parts, nq, k, metric


@settings(max_examples=400, deadline=None)
@given(shard_parts())
def test_a_complete_merge_equals_the_full_sort(case: tuple[list[Part], int, int, str]) -> None:
    parts, nq, k, metric = case
    quick = merge(parts, nq, k, metric, complete=True)
    sorted_in_full = merge(parts, nq, k, metric, complete=False)  # nothing is missing: the same sort as before
    for mine, theirs in zip((quick.scores, quick.ids, quick.refs),
                            (sorted_in_full.scores, sorted_in_full.ids, sorted_in_full.refs)):
        np.testing.assert_array_equal(mine, theirs)
