"""The broker's files under simulated power cuts and interrupted completions.

Every operation the test saw confirmed must survive: an enqueue with
durable=True, a complete() that answered 'completed', a results() that
returned. After the crash, the queue is run to the end; every durably
enqueued input must have exactly one result in total, equal to the first
confirmed one, and no result may come back twice.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

import workq
from common.journal import Flusher, FlusherConfig
from common.journal.check import Findings, Severity
from common.journal.testing import PowerCut
from shardmgr.verification import queue_checks as queue_check
from workq.config import WorkqConfig
from workq.state import completion
from workq.state.queue import QueueState
from workq.state.recovery import recover
from workq.testing import crash


def result_of(payload: bytes) -> bytes:
    return b"R:" + payload[::-1]


def drain(broker: workq.Broker, seen: dict, returned: set) -> None:
    """Lease and complete everything left, then collect every result."""
    while True:
        items = broker.lease(500)
        if not items:
            break
        broker.complete([i.handle for i in items], [result_of(i.payload) for i in items])
    while True:
        results = broker.results("job", max_items=1000)
        if not results:
            break
        for r in results:
            assert r.handle not in returned, f"result for {r.handle} returned twice"
            returned.add(r.handle)
            seen[r.handle] = r.payload


def workload(broker: workq.Broker, rng: random.Random, enqueued: dict, completed: dict, returned: set,
             seen: dict) -> None:
    for _ in range(rng.randint(5, 40)):
        op = rng.random()
        if op < 0.4:
            payloads = [rng.randbytes(rng.randint(1, 300)) for _ in range(rng.randint(1, 20))]
            durable = rng.random() < 0.7
            handles = broker.enqueue("job", "m", rng.choice(["a", "b"]), 1, payloads, durable=durable)
            if durable:
                enqueued.update(zip(handles, payloads))
        elif op < 0.75:
            items = broker.lease(rng.randint(1, 30))
            done = [i for i in items if rng.random() < 0.8]
            durable = rng.random() < 0.5  # not waited for: a power cut may lose it, and the item runs again
            statuses = broker.complete([i.handle for i in done], [result_of(i.payload) for i in done], durable)
            if durable:
                completed.update((i.handle, result_of(i.payload)) for i, s in zip(done, statuses) if s == "completed")
        elif enqueued or completed:
            for r in broker.results("job", max_items=rng.randint(1, 50)):
                assert r.handle not in returned
                returned.add(r.handle)
                seen[r.handle] = r.payload


@pytest.mark.parametrize("seed", range(8))
def test_power_cut_loses_nothing_confirmed(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    data = tmp_path / "data"
    enqueued: dict = {}
    completed: dict = {}
    returned: set = set()
    seen: dict = {}
    for life in range(3):
        (data / "workq").mkdir(parents=True, exist_ok=True)
        with PowerCut(data, seed=seed * 10 + life) as cut:
            broker = workq.open(data, reconnect_window_s=0.0, disk_floor_bytes=0,
                                segment_bytes=256 * 1024, lease_s=3600)
            workload(broker, rng, enqueued, completed, returned, seen)
            crash(broker)
            cut.crash()
        findings = Findings()  # a power cut leaves nothing recovery cannot repair (the catalog included)
        queue_check.check(data / "workq", findings, deep=True)
        assert findings.worst() <= Severity.REPAIRABLE, findings.problems
    broker = workq.open(data, reconnect_window_s=0.0, disk_floor_bytes=0, segment_bytes=256 * 1024)
    drain(broker, seen, returned)
    broker.close()
    for handle, payload in enqueued.items():
        assert handle in seen, f"durably enqueued {handle} has no result"
        assert seen[handle] == completed.get(handle, result_of(payload))
    assert set(seen) >= set(completed)


def test_recovery_finishes_a_completion_cut_between_result_and_tombstone(tmp_path: Path) -> None:
    config = WorkqConfig(reconnect_window_s=0.0, disk_floor_bytes=0)
    with Flusher(FlusherConfig(interval=0.002)) as flusher:
        state = QueueState(tmp_path / "workq", config, flusher)
        recover(state)
        packed, ticket = state.enqueue("job", workq.Key("m", "s", "1"), [b"a", b"b", b"c"])
        from workq.state import leasing
        from workq.state.dispatch import Filters

        items = [h for batch in leasing.lease(state, "w", Filters(), 3, 0.0) for h in batch.handles]
        plan = completion.start(state, completion.plan(state, packed, [b"ra", b"rb", b"rc"]))
        flusher.flush_now()  # (1) results durable ... and the crash comes before (2) the tombstones
        assert all(t.durable for t in plan.tickets) and len(items) == 3
        for segment in state.segments.values():
            segment.journal.close()
        for log in state.logs.values():
            for journal in log.segments.values():
                journal.close()
    broker = workq.open(tmp_path, reconnect_window_s=0.0, disk_floor_bytes=0)
    try:
        assert broker.recovery.finished == 3
        assert broker.job_status("job")["completed"] == 3 and broker.job_status("job")["pending"] == 0
        assert broker.lease(10) == []  # tombstoned by recovery: never dispatched again
        assert sorted(r.payload for r in broker.results("job")) == [b"ra", b"rb", b"rc"]
        assert np.array_equal(sorted(h.packed for h in [r.handle for r in broker.results("job")]), [])
    finally:
        broker.close()
