"""A batch searched through the store on a shard with an index answers as
faiss does on that index, and every shard still returns k rows when it
holds k live ones (issue 24).

The reference is plain faiss over the shard's own persisted index file
(``index.faiss``), searched in process with the same parameters. IVF256
over 10,000 clustered rows has lists of fewer than 20 rows, so at nprobe 1
faiss answers some queries with fewer than k = 20: the store must answer
those in full, and every other query exactly as faiss did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import faiss
import numpy as np
import pytest

import shardmgr
from shardmgr.store import layout
from shardmgr.store.store import Store

DIM, ROWS, K = 32, 10_000, 20
CENTERS, SPREAD = 16, 1.5
IVF, HNSW = "IVF256,Flat", "HNSW16"  # IVF256 needs 39 x 256 = 9,984 rows to be built: ROWS is enough
FAR = 1e4  # the growing shard's sealing row: nearer to no query than any stored row


def clustered(n: int, seed: int) -> np.ndarray:
    """``n`` rows around CENTERS fixed centres (the seed picks the draws, not the centres)."""
    centres = np.random.default_rng(1000).standard_normal((CENTERS, DIM))
    rng = np.random.default_rng(seed)
    return (centres[rng.integers(0, CENTERS, n)] + SPREAD * rng.standard_normal((n, DIM))).astype(np.float32)


def one_shard(path: Path, spec: str) -> tuple[Store, np.ndarray, faiss.Index]:
    """A store with one sealed shard of ROWS rows (ids = row numbers) under
    ``spec`` and a growing shard of one far row; its refs; faiss's reading
    of the shard's index file. Rewrites are off: deletes keep the index."""
    store = shardmgr.open(path, seal_bytes=ROWS * DIM * 4, index_train_rows=ROWS, rewrite_live_fraction=0,
                          merge_below_fraction=0)
    store.create_collection("c", DIM, "l2", index=spec)
    refs = store.append("c", clustered(ROWS, 0), np.arange(ROWS))
    store.append("c", np.full((1, DIM), FAR, np.float32), [ROWS])  # the shard is full: this seals it
    store.wait_for_indexes()
    assert store.collection_info("c")["sealed"] == 1
    return store, refs, faiss.read_index(str(path / "shards" / "c" / "00000001" / layout.INDEX))


def faiss_search(made: faiss.Index, queries: np.ndarray, knob: str, value: int,
                 keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """faiss's own answer at ``knob`` = ``value``, over the rows ``keep`` selects (all: None)."""
    params: Any = faiss.SearchParametersIVF() if knob == "nprobe" else faiss.SearchParametersHNSW()  # type: ignore[attr-defined]
    setattr(params, knob, value)
    if keep is not None:
        selector = faiss.IDSelectorBatch(keep)
        params.sel = selector
    scores, rows = made.search(queries, K, params=params)
    return scores, rows


def full(rows: np.ndarray) -> np.ndarray:
    """Per query: whether it got K rows."""
    answered: np.ndarray = (rows >= 0).sum(axis=1) == K
    return answered


@pytest.mark.parametrize("spec, knob, values", [(IVF, "nprobe", [1, 4, 16]), (HNSW, "efSearch", [20, 64])])
def test_a_batch_is_faiss_s_answer_for_every_query_faiss_answered_in_full(tmp_path: Path, spec: str, knob: str,
                                                                         values: list[int]) -> None:
    store, _, made = one_shard(tmp_path, spec)
    queries = clustered(300, 5)
    for value in values:
        scores, ids, refs = store.search("c", queries, K, {knob: value})
        expected_scores, expected_rows = faiss_search(made, queries, knob, value)
        answered = full(expected_rows)
        assert answered.mean() > 0.9, "the reference is meaningful only if faiss answers most queries in full"
        np.testing.assert_array_equal(ids[answered], expected_rows[answered])  # ids are row numbers here
        np.testing.assert_array_equal(scores[answered], expected_scores[answered])
        assert (refs >= 0).all() and (ids >= 0).all(), f"{knob} {value}: a query got fewer than k rows"
    store.close()


def test_a_query_ivf_answers_short_at_nprobe_1_still_gets_k_rows(tmp_path: Path) -> None:
    store, _, made = one_shard(tmp_path, IVF)
    queries = clustered(300, 5)
    _, expected_rows = faiss_search(made, queries, "nprobe", 1)
    short = ~full(expected_rows)
    assert short.sum() >= 3, "the data should give faiss some short answers at nprobe 1"
    scores, ids, _ = store.search("c", queries, K, {"nprobe": 1})
    assert (ids[short] >= 0).all()
    assert all(len(set(row)) == K for row in ids[short].tolist()), "k distinct rows"
    assert (np.diff(scores[short], axis=1) >= 0).all(), "nearest first"
    # searched again through the index at twice the lists: faiss's own answer there
    wider_scores, wider_rows = faiss_search(made, queries[short], "nprobe", 2)
    assert full(wider_rows).all()
    np.testing.assert_array_equal(ids[short], wider_rows)
    np.testing.assert_array_equal(scores[short], wider_scores)
    store.close()


@pytest.mark.parametrize("spec, knob, value", [(IVF, "nprobe", 1), (HNSW, "efSearch", 20)])
def test_with_deletes_no_deleted_row_comes_back_and_k_rows_do(tmp_path: Path, spec: str, knob: str,
                                                              value: int) -> None:
    """The neighbourhoods of some queries are deleted whole (the index runs
    dry there), then all but K rows of the shard: both times every query
    gets k live rows, never a deleted one; with only K live rows left, they
    are exactly the answer of every query."""
    store, refs, made = one_shard(tmp_path, spec)
    vectors = clustered(ROWS, 0)
    queries = clustered(200, 5)
    flat = faiss.IndexFlatL2(DIM)
    flat.add(vectors)
    _, near = flat.search(queries[:20], 1000)
    dead = np.unique(near)
    store.delete("c", refs[dead])
    live = np.setdiff1d(np.arange(ROWS), dead)
    _, expected_rows = faiss_search(made, queries, knob, value, live)
    assert (~full(expected_rows)).sum() >= 3, "faiss should run dry on some queries here"
    _, ids, found = store.search("c", queries, K, {knob: value})
    assert (found >= 0).all() and (ids >= 0).all(), "fewer than k rows although the shard holds them"
    assert not np.isin(ids, dead).any(), "a deleted row came back"
    assert all(len(set(row)) == K for row in ids.tolist())

    kept = live[:: len(live) // K][:K]  # K live rows spread over the shard
    store.delete("c", refs[np.setdiff1d(live, kept)])
    scores, ids, found = store.search("c", queries, K, {knob: value})
    np.testing.assert_array_equal(np.sort(ids, axis=1), np.broadcast_to(np.sort(kept), ids.shape))
    assert (np.diff(scores, axis=1) >= 0).all()
    store.close()


def test_growing_rows_that_rank_among_the_first_k_are_merged_in(tmp_path: Path) -> None:
    """Rows of the growing shard nearer than the index's k-th are merged into
    its answer; the rest of each answer is faiss's, in faiss's order."""
    store, _, made = one_shard(tmp_path, IVF)
    queries = clustered(50, 5)
    store.append("c", queries[:5], ROWS + 1 + np.arange(5))  # five queries' own vectors: each one's nearest
    scores, ids, _ = store.search("c", queries, K, {"nprobe": 4})
    expected_scores, expected_rows = faiss_search(made, queries, "nprobe", 4)
    assert full(expected_rows).all()
    np.testing.assert_array_equal(ids[:5, 0], ROWS + 1 + np.arange(5))
    assert (scores[:5, 0] <= expected_scores[:5, 0]).all()
    np.testing.assert_array_equal(ids[:5, 1:], expected_rows[:5, :-1])
    np.testing.assert_array_equal(ids[5:], expected_rows[5:])
    np.testing.assert_array_equal(scores[5:], expected_scores[5:])
    store.close()
