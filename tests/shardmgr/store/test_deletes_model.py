"""Row deletes in the embedded store against an in-memory model.

The model holds every appended row by ref: its vector, its id and whether
it was deleted. Rules append (small batches, and large ones that fill a
shard), delete chosen refs (deleted ones among them, and duplicates),
delete by id, try deletes naming refs of no row (refused, nothing
deleted), and restart the store: cleanly or by abandoning it as a crash
would (every write reached the page cache, so nothing may be lost; the
growing shard is sealed then). After every step collection_info counts
the live and the deleted rows of the model, and an exact search returns
the live rows only, nearest first, padded with -1.

Vectors are small integers (dimension 4), so squared L2 distances are
exact in float32 and scores compare with ``==``. Shards seal at 4 KiB of
vectors (256 rows), so a run spans several sealed shards and a growing one.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import shardmgr
from common.journal import FlusherConfig
from shardmgr.errors import RowDeleted, UnknownRef
from shardmgr.store.refs import ROW_BITS
from shardmgr.store.store import Store
from tests.profiles import examples

DIM = 4
SEAL_BYTES = 4096  # 256 rows of dimension 4
EXTENT_BYTES = 65536
MAX_K = 50  # the widest search the checks ask for
ID_POOL = 24  # ids repeat across rows, so delete_ids often hits several
FLUSHER = FlusherConfig(interval=0.002)
COORD = st.integers(-4, 4)
VECTOR = st.lists(COORD, min_size=DIM, max_size=DIM)
IDS = st.integers(0, ID_POOL - 1)


@dataclasses.dataclass
class ModelRow:
    """What the store should hold at one ref."""

    vector: np.ndarray  # float32 [DIM]
    id: int
    deleted: bool = False


class DeletesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="shardmgr-deletes-model-"))
        self.store: Store | None = self._open()
        self.store.create_collection("c", DIM)
        self.rows: dict[int, ModelRow] = {}
        self.appended = False  # since this store was opened: a crash then must seal the growing shard

    def _open(self) -> Store:
        # no background rewrite: it would drop deleted rows from the count ("deleted" is the rows whose
        # space is not reclaimed yet) at a moment the model cannot know; test_rewrite.py covers rewrites
        return shardmgr.open(self.dir / "data", seal_bytes=SEAL_BYTES, extent_bytes=EXTENT_BYTES, flusher=FLUSHER,
                             rewrite_live_fraction=0, merge_below_fraction=0)

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def s(self) -> Store:
        assert self.store is not None
        return self.store

    def live(self) -> list[int]:
        return sorted(r for r, m in self.rows.items() if not m.deleted)

    def known(self) -> list[int]:
        return sorted(self.rows)

    # --------------------------------------------------------------- writes

    def _append(self, vectors: np.ndarray, ids: np.ndarray, durable: bool) -> None:
        refs = self.s.append("c", vectors, ids, durable=durable)
        self.appended = True
        assert refs.dtype == np.int64 and len(refs) == len(vectors)
        for ref, vector, id_ in zip(refs.tolist(), vectors, ids.tolist()):
            assert ref not in self.rows, f"ref {ref} handed out twice"
            self.rows[ref] = ModelRow(vector.copy(), id_)

    @rule(vectors=st.lists(VECTOR, min_size=1, max_size=6), data=st.data(), durable=st.booleans())
    def append_few(self, vectors: list[list[int]], data: st.DataObject, durable: bool) -> None:
        drawn = data.draw(st.lists(IDS, min_size=len(vectors), max_size=len(vectors)), label="ids")
        self._append(np.array(vectors, dtype=np.float32), np.array(drawn, dtype=np.int64), durable)

    @rule(n=st.integers(100, 300), seed=st.integers(0, 2**32 - 1), durable=st.booleans())
    def append_many(self, n: int, seed: int, durable: bool) -> None:
        """Enough rows to fill (and seal) a shard now and then."""
        rng = np.random.default_rng(seed)
        self._append(rng.integers(-4, 5, (n, DIM)).astype(np.float32), rng.integers(0, ID_POOL, n), durable)

    @precondition(lambda self: self.rows)
    @rule(data=st.data(), durable=st.booleans())
    def delete_refs(self, data: st.DataObject, durable: bool) -> None:
        """Some known refs, deleted ones and repeats among them."""
        refs = data.draw(st.lists(st.sampled_from(self.known()), min_size=1, max_size=12), label="refs")
        fresh = {r for r in refs if not self.rows[r].deleted}
        assert self.s.delete("c", np.array(refs, dtype=np.int64), durable=durable) == len(fresh)
        for r in fresh:
            self.rows[r].deleted = True

    @precondition(lambda self: any(m.deleted for m in self.rows.values()))
    @rule(data=st.data())
    def delete_deleted_again(self, data: st.DataObject) -> None:
        gone = sorted(r for r, m in self.rows.items() if m.deleted)
        refs = data.draw(st.lists(st.sampled_from(gone), min_size=1, max_size=4), label="refs")
        assert self.s.delete("c", np.array(refs, dtype=np.int64)) == 0

    @rule(ids=st.lists(st.integers(0, ID_POOL + 2), max_size=4), durable=st.booleans())
    def delete_ids(self, ids: list[int], durable: bool) -> None:
        """Every live row carrying one of ``ids`` (some carried by no row)."""
        hit = [r for r, m in self.rows.items() if not m.deleted and m.id in ids]
        assert self.s.delete_ids("c", np.array(ids, dtype=np.int64), durable=durable) == len(hit)
        for r in hit:
            self.rows[r].deleted = True

    @rule(data=st.data(), bad=st.sampled_from(["next_row", "no_shard", "negative", "row_past_shard"]))
    def delete_unknown_ref(self, data: st.DataObject, bad: str) -> None:
        """A call naming a ref of no row is refused whole: nothing is deleted."""
        known = self.known()
        last = max(known, default=(1 << ROW_BITS) - 1)
        last_shard = last >> ROW_BITS
        wrong = {"next_row": last + 1, "no_shard": (last_shard + 7) << ROW_BITS, "negative": -1,
                 "row_past_shard": (1 << ROW_BITS) | ((1 << ROW_BITS) - 1)}[bad]
        good = data.draw(st.lists(st.sampled_from(known), max_size=4), label="good") if known else []
        refs = good + [wrong]
        data.draw(st.randoms()).shuffle(refs)
        with pytest.raises(UnknownRef):
            self.s.delete("c", np.array(refs, dtype=np.int64))

    @rule()
    def delete_nothing(self) -> None:
        assert self.s.delete("c", np.zeros(0, dtype=np.int64)) == 0
        assert self.s.delete_ids("c", np.zeros(0, dtype=np.int64)) == 0

    @rule(crash=st.booleans())
    def reopen(self, crash: bool) -> None:
        """Close (or abandon, as a process crash would) and open again: every
        row and delete stays. After a crash of a session that appended, the
        growing shard is sealed (a clean close may leave it growing, and a
        session that appended nothing leaves its clean-close marker valid:
        close_marker.py)."""
        if crash:
            self.s.abandon()
        else:
            self.s.close()
        self.store = None
        self.store = self._open()
        info = self.s.collection_info("c")
        assert not info["quarantined"]
        if crash and self.appended:
            assert info["growing"] == 0 and info["sealed"] == info["shards"]
        self.appended = False

    @rule()
    def flush(self) -> None:
        self.s.flush()

    # ---------------------------------------------------------------- reads

    @precondition(lambda self: self.rows)
    @rule(data=st.data())
    def get(self, data: st.DataObject) -> None:
        """A batch of refs: their vectors and ids if all are live, else RowDeleted."""
        refs = data.draw(st.lists(st.sampled_from(self.known()), min_size=1, max_size=6), label="refs")
        array = np.array(refs, dtype=np.int64)
        if any(self.rows[r].deleted for r in refs):
            with pytest.raises(RowDeleted):
                self.s.get("c", array)
            with pytest.raises(RowDeleted):
                self.s.ids("c", array)
            return
        np.testing.assert_array_equal(self.s.get("c", array), np.stack([self.rows[r].vector for r in refs]))
        np.testing.assert_array_equal(self.s.ids("c", array), [self.rows[r].id for r in refs])

    @rule(queries=st.lists(VECTOR, min_size=1, max_size=3), extra=st.integers(0, 3))
    def search(self, queries: list[list[int]], extra: int) -> None:
        self._check_search(np.array(queries, dtype=np.float32), extra)

    @invariant()
    def counts_match(self) -> None:
        if self.store is None:
            return
        info = self.s.collection_info("c")
        deleted = sum(m.deleted for m in self.rows.values())
        assert (info["rows"], info["deleted"]) == (len(self.rows) - deleted, deleted)

    @invariant()
    def search_finds_the_live_rows(self) -> None:
        if self.store is not None:
            self._check_search(np.array([[0] * DIM, [4, -4, 4, -4]], dtype=np.float32), extra=2)

    def _check_search(self, queries: np.ndarray, extra: int) -> None:
        """k = the live rows plus ``extra`` (at most MAX_K, at least 1): the
        exact top-k of the live rows per query, then -1 padding."""
        live = self.live()
        k = max(1, min(len(live) + extra, MAX_K))
        scores, ids, refs = self.s.search("c", queries, k)
        assert scores.shape == ids.shape == refs.shape == (len(queries), k)
        if live:
            vectors = np.stack([self.rows[r].vector for r in live]).astype(np.float64)
        for q, query in enumerate(queries):
            found = refs[q][refs[q] >= 0].tolist()
            want = min(k, len(live))
            assert len(found) == want and len(set(found)) == want, f"query {q}: refs {refs[q].tolist()}"
            assert (refs[q][want:] == -1).all() and (ids[q][want:] == -1).all() and np.isinf(scores[q][want:]).all()
            gone = [r for r in found if r not in self.rows or self.rows[r].deleted]
            assert not gone, f"search returned deleted or unknown refs {gone}"
            if not live:
                continue
            exact = ((vectors - query) ** 2).sum(axis=1)
            by_ref = dict(zip(live, exact.tolist()))
            assert scores[q][:want].tolist() == sorted(exact.tolist())[:want], "not the exact top-k"
            assert scores[q][:want].tolist() == [by_ref[r] for r in found], "a score is not its row's distance"
            assert ids[q][:want].tolist() == [self.rows[r].id for r in found]
            if want == len(live):
                assert set(found) == set(live)


# A step costs a few store calls and a reopen a few shard opens: 12 examples of 30 steps in the
# default run, the soak profile's 2,000 under HYPOTHESIS_PROFILE=soak (tests/profiles.py).
# Failures are shrunk, not explained.
TestDeletesModel = DeletesMachine.TestCase
TestDeletesModel.settings = settings(
    stateful_step_count=30, deadline=None, report_multiple_bugs=False,
    phases=[p for p in Phase if p is not Phase.explain],
    max_examples=examples(12))
