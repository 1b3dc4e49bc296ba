"""Completion on the owner thread's state: what a consumer may see, and when
a completion log may go, while results and tombstones wait for a flush.

These drive QueueState directly with a flusher that only flushes when told
(interval of an hour), so "written but not yet durable" lasts as long as a
test wants.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import workq
from common.journal import Flusher, FlusherConfig, Marker
from common.journal.testing import PowerCut
from workq.config import WorkqConfig
from workq.disk.records import job_id
from workq.disk.segment import Segment
from workq.state import collector, completion
from workq.state.items import Completion
from workq.state.queue import QueueState
from workq.state.recovery import recover

KEY = workq.Key("m", "s", "1")


def new_state(root: Path, flusher: Flusher, **config: object) -> QueueState:
    state = QueueState(root / "workq", WorkqConfig(reconnect_window_s=0.0, disk_floor_bytes=0, **config), flusher)
    recover(state)
    return state


@pytest.fixture
def manual() -> Iterator[Flusher]:
    """A flusher that runs a round only when asked."""
    flusher = Flusher(FlusherConfig(interval=3600)).start()
    yield flusher
    flusher.stop()


def complete(state: QueueState, packed: np.ndarray, results: list[bytes]) -> completion.CompletionPlan:
    return completion.start(state, completion.plan(state, np.asarray(packed, np.uint64), results))


def test_results_reach_consumers_only_once_durable(tmp_path: Path, manual: Flusher) -> None:
    state = new_state(tmp_path, manual)
    packed, _ = state.enqueue("job", KEY, [b"a", b"b"])
    plan = complete(state, packed[:1], [b"ra"])
    assert not all(t.durable for t in plan.tickets)
    _, batch = state.take_results("job", 10)
    assert batch == []  # written, not durable: a power cut could still replace it
    status = state.job_status("job")
    assert (status["in_flight"], status["completed"], status["enqueued"]) == (1, 0, 2)
    manual.flush_now()
    completion.finish(state, plan)
    log, batch = state.take_results("job", 10)
    assert [bytes(p) for out in batch for p in out.payloads] == [b"ra"]
    assert state.job_status("job")["completed"] == 1
    state.drop_results(log, batch)


def test_a_later_result_waits_behind_an_unfinished_earlier_one(tmp_path: Path, manual: Flusher) -> None:
    state = new_state(tmp_path, manual)
    packed, _ = state.enqueue("job", KEY, [b"a", b"b"])
    first = complete(state, packed[:1], [b"ra"])
    manual.flush_now()
    second = complete(state, packed[1:], [b"rb"])
    completion.finish(state, first)
    _, batch = state.take_results("job", 10)
    assert [bytes(p) for out in batch for p in out.payloads] == [b"ra"]
    manual.flush_now()
    completion.finish(state, second)
    log, batch = state.take_results("job", 10)
    assert [bytes(p) for out in batch for p in out.payloads] == [b"rb"]  # the cursor did not skip it
    state.confirm_results(log, batch)


@pytest.mark.parametrize("buried", [False, True])
def test_an_aborted_completion_strands_its_items_until_recovery_settles_them(
        tmp_path: Path, manual: Flusher, buried: bool) -> None:
    """The flush of a result failed: the result may be on disk or not, so
    the item must get neither a second result nor be retired; recovery
    decides from what the disk holds."""
    from workq.state import leasing
    from workq.state.dispatch import Filters

    state = new_state(tmp_path, manual, max_deliveries=1)
    [h, other], _ = state.enqueue("job", KEY, [b"a", b"b"])
    if buried:
        [batch] = leasing.lease(state, "w", Filters(), 1, 0.0)
        leasing.release(state, "w", batch.handles, 0.0, 0.0)  # worn out: buried
        assert state.job_status("job")["buried"] == 1
    manual.flush_now()
    plan = complete(state, [h], [b"r"])
    completion.abort(state, plan, OSError("flush failed"))  # what the broker does on DurabilityLost
    status = state.job_status("job")
    assert (status["in_flight"], status["completed"], status["buried"], status["enqueued"]) == (1, 0, 0, 2)
    assert state.kick("job") == 0
    assert [b.handles for b in leasing.lease(state, "w", Filters(), 10, 0.0)] == [[int(other)]]
    assert state.take_results("job", 10)[1] == []
    assert completion.plan(state, np.array([h], np.uint64), [b"again"]).statuses == ["duplicate"]
    for segment in state.segments.values():
        segment.journal.close()
    for log in state.logs.values():
        for journal in log.segments.values():
            journal.close()
    after = new_state(tmp_path, manual)  # the result reached the disk after all: recovery finishes it
    assert after.job_status("job")["completed"] == 1 and after.job_status("job")["buried"] == 0


@pytest.mark.parametrize("failing", ["alpha", "beta"])
def test_a_failed_append_keeps_the_results_written_before_it(tmp_path: Path, manual: Flusher,
                                                              monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    state = new_state(tmp_path, manual)
    [x], _ = state.enqueue("alpha", KEY, [b"X"])
    [y], _ = state.enqueue("beta", KEY, [b"Y"])

    # the failing log's file refuses its next write (os.pwrite, as a real disk error would: the
    # journal's own methods are compiled and cannot be patched)
    failing_fd, pwrite = state.logs[job_id(failing)].active._file.fd, os.pwrite

    def broken(fd: int, data: object, offset: int) -> int:
        if fd == failing_fd:
            raise OSError(errno.EIO, "disk says no")
        return pwrite(fd, data, offset)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "pwrite", broken)
    plan = complete(state, [x, y], [b"rx", b"ry"])
    assert isinstance(plan.error, workq.ResultsNotRecorded) and "disk says no" in str(plan.error)
    manual.flush_now()
    completion.finish(state, plan)
    ok = "beta" if failing == "alpha" else "alpha"
    assert state.job_status(failing)["completed"] == 0 and state.job_status(failing)["pending"] == 1
    done = state.job_status(ok)["completed"]  # 1 if its append came first, else 0 (never appended)
    assert done == len(plan.groups) and state.job_status(ok)["pending"] == 1 - done
    retry = completion.plan(state, np.array([x, y], np.uint64), [b"rx again", b"ry again"])
    assert retry.statuses.count("duplicate") == done  # a retry of the whole call adds no second result


def test_results_too_big_for_a_segment_are_refused_whole(tmp_path: Path, manual: Flusher) -> None:
    state = new_state(tmp_path, manual, segment_bytes=64 * 1024)
    [x], _ = state.enqueue("alpha", KEY, [b"X"])
    [y], _ = state.enqueue("beta", KEY, [b"Y"])
    with pytest.raises(workq.PayloadTooLarge):
        completion.plan(state, np.array([x, y], np.uint64), [b"rx", bytes(70_000)])
    assert state.job_status("alpha")["completed"] == 0 and state.logs[job_id("alpha")].active.count == 0


def test_many_results_spill_over_segments(tmp_path: Path, manual: Flusher) -> None:
    state = new_state(tmp_path, manual, segment_bytes=64 * 1024)
    packed = np.concatenate([state.enqueue("job", KEY, [b"t"] * 10)[0] for _ in range(10)])
    plan = complete(state, packed, [bytes([i]) * 20_000 for i in range(100)])  # ~2 MB: ~40 segments
    manual.flush_now()
    assert completion.finish(state, plan) == ["completed"] * 100
    log, batch = state.take_results("job", 1000)
    assert len(log.segments) > 30
    assert [bytes(p)[:1] for out in batch for p in out.payloads] == [bytes([i]) for i in range(100)]
    state.confirm_results(log, batch)


@pytest.mark.parametrize("seed", range(4))
def test_a_completion_log_outlives_the_tombstones_of_its_results(tmp_path: Path, seed: int) -> None:
    """Power cut after a fully delivered completion segment could be
    collected: if its inputs' tombstones were not durable, the inputs would
    come back LIVE with no result and take a second one."""
    root = tmp_path / "root"
    (root / "workq").mkdir(parents=True)
    with PowerCut(root, seed=seed) as cut:
        flusher = Flusher(FlusherConfig(interval=3600)).start()
        state = new_state(root, flusher, segment_bytes=64 * 1024)
        [a, b], _ = state.enqueue("job", KEY, [b"A", b"B"])
        flusher.flush_now()
        plan = complete(state, [a], [b"rA"])
        flusher.flush_now()
        completion.finish(state, plan)  # the tombstone of A is written, not durable
        log, batch = state.take_results("job", 10)
        state.confirm_results(log, batch)  # the consumer has rA
        log.active.seal()
        complete(state, [b], [b"rB"])  # opens the next segment
        assert collector.start_logs(state) == []  # seq 0 stays: A's tombstone is not durable
        flusher.flush_now()
        [(job_log, seq, ticket)] = collector.start_logs(state)
        flusher.flush_now()
        assert ticket.durable
        collector.finish_log(job_log, seq)
        flusher.stop(flush=False)
        for segment in state.segments.values():
            segment.journal.abandon()
        for job_log in state.logs.values():
            for journal in job_log.segments.values():
                journal.abandon()
        cut.crash()
    broker = workq.open(root, reconnect_window_s=0.0, disk_floor_bytes=0, segment_bytes=64 * 1024)
    try:
        items = broker.lease(10)
        assert all(i.payload != b"A" for i in items)  # A is retired for good
        assert broker.job_status("job")["delivered"] == 1
    finally:
        broker.close()
    shutil.rmtree(root)


@pytest.fixture(scope="module")
def a_segment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Segment]:
    """A real, empty segment: the grouping only carries it (a stand-in object
    would do in pure Python, not where the typed code is compiled)."""
    flusher = Flusher(FlusherConfig(interval=3600)).start()
    segment = Segment.create(tmp_path_factory.mktemp("segment"), 5, KEY, flusher, capacity=1 << 20)
    yield segment
    segment.journal.close()
    flusher.stop()


@given(data=st.data())
def test_the_one_group_shortcut_groups_as_the_general_path(a_segment: Segment, data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 12))
    jobs = data.draw(st.lists(st.sampled_from([3, 7, 2**63 + 1]), min_size=n, max_size=n))
    markers = data.draw(st.lists(st.sampled_from([int(m) for m in Marker]), min_size=n, max_size=n))
    rows = sorted(data.draw(st.lists(st.integers(0, 2 * n), min_size=n, max_size=n, unique=True)))
    handles = [(5 << 32) | (r * 4 + 512) for r in range(2 * n + 1)]
    payloads = [bytes([r]) * r for r in range(2 * n + 1)]
    offsets = [(handles[r] & 0xFFFFFFFF) * 8 for r in rows]
    positions = list(range(100, 100 + n))
    segment = a_segment
    got: list[list[Completion]] = []
    accepts: list[list[bool]] = []
    for path in (completion._grouped, completion._by_job):
        accept = [False] * len(handles)
        got.append(path(segment, rows, handles, payloads, accept, offsets, jobs, positions, markers))
        accepts.append(accept)
    assert accepts[0] == accepts[1]
    assert len(got[0]) == len(got[1])
    for a, b in zip(*got):
        assert (a.job, a.segment, a.payloads) == (b.job, b.segment, b.payloads)
        for field in ("offsets", "handles", "positions", "markers"):
            x, y = getattr(a, field), getattr(b, field)
            assert type(x) is type(y) is list and x == y
