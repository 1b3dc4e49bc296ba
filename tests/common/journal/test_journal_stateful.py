"""The journal against an in-memory model, through flushes, reopens and power cuts.

The model holds, per record, its body, its marker, and every marker it may
legitimately show after a power cut (those set since the last flush).
"""

from __future__ import annotations

import collections
import dataclasses
import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from common.journal import Flusher, FlusherConfig, Journal, JournalConfig, JournalSealed, Marker
from common.journal.testing import PowerCut

MANUAL = FlusherConfig(interval=3600.0)  # rounds run only when a rule flushes
CONFIG = JournalConfig(extent_bytes=16384)


@dataclasses.dataclass
class ModelRecord:
    offset: int
    body: bytes
    marker: Marker
    possible: set[Marker]
    closes_batch: bool


class JournalMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="journal-model-"))
        self.flusher = Flusher(MANUAL).start()
        self.cut = PowerCut(self.dir, seed=0)
        self.cut.install()
        self.journal = Journal.create(self.dir / "j", kind=b"TEST", flusher=self.flusher, config=CONFIG)
        self.model: list[ModelRecord] = []
        self.durable_count = 0  # records confirmed durable by a completed flush
        self.sealed = False

    def teardown(self) -> None:
        self.cut.uninstall()
        self.journal.close()
        self.flusher.stop()
        shutil.rmtree(self.dir)

    def _all_durable(self) -> None:
        for rec in self.model:
            rec.possible = {rec.marker}
        self.durable_count = len(self.model)

    @rule(bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=5),
          marker=st.sampled_from(list(Marker)))
    def append(self, bodies: list[bytes], marker: Marker) -> None:
        if self.sealed:
            try:
                self.journal.append_batch(bodies, marker)
            except JournalSealed:
                return
            raise AssertionError("append to a sealed journal succeeded")
        offsets, _ = self.journal.append_batch(bodies, marker)
        for i, (off, body) in enumerate(zip(offsets.tolist(), bodies)):
            self.model.append(ModelRecord(off, body, marker, {marker}, i == len(bodies) - 1))

    @precondition(lambda self: self.model)
    @rule(data=st.data(), marker=st.sampled_from(list(Marker)))
    def set_marker(self, data: st.DataObject, marker: Marker) -> None:
        picks = data.draw(st.lists(st.integers(0, len(self.model) - 1), min_size=1, max_size=4))
        self.journal.set_markers([self.model[i].offset for i in picks], marker)
        for i in picks:
            self.model[i].marker = marker
            self.model[i].possible.add(marker)

    @rule()
    def flush(self) -> None:
        self.journal.flush(timeout=10)
        self._all_durable()

    @rule()
    def seal(self) -> None:
        self.journal.seal()
        self.sealed = True
        self._all_durable()

    @rule()
    def reopen(self) -> None:
        self.journal.close()
        self.journal = Journal.open(self.dir / "j", flusher=self.flusher, config=CONFIG)
        got = [(r.offset, r.body, r.marker) for r in self.journal.records()]
        assert got == [(m.offset, m.body, m.marker) for m in self.model]
        self._all_durable()

    @rule(seed=st.integers(0, 2**32 - 1))
    def power_cut(self, seed: int) -> None:
        self.flusher.stop(flush=False)
        self.cut.rng.seed(seed)
        self.cut.crash()
        self.journal.abandon()
        self.flusher = Flusher(MANUAL).start()
        self.journal = Journal.open(self.dir / "j", flusher=self.flusher, config=CONFIG)
        got = list(self.journal.records())
        assert len(got) <= len(self.model), "recovery produced records that were never written"
        for rec, want in zip(got, self.model):
            assert (rec.offset, rec.body) == (want.offset, want.body)
            assert rec.marker in want.possible, (rec.marker, want.possible)
        assert not got or self.model[len(got) - 1].closes_batch, "a batch survived only in part"
        assert len(got) >= self.durable_count, "a record confirmed durable was lost"
        del self.model[len(got):]
        for rec, want in zip(got, self.model):
            want.marker = rec.marker
        self._all_durable()  # recovery flushed what it kept
        self.sealed = self.journal.sealed

    @invariant()
    def counters_match(self) -> None:
        expected = collections.Counter(m.marker for m in self.model)
        assert self.journal.count == len(self.model)
        assert self.journal.counters == {m: expected.get(m, 0) for m in Marker}


TestJournalModel = JournalMachine.TestCase
TestJournalModel.settings = settings(stateful_step_count=30)  # examples: the loaded profile
