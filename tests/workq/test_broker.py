"""The embedded broker: the queue's rules through its public methods."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import workq
from common.journal import Flusher
from workq import Broker, DiskFull, Handle, NotLeased, PayloadTooLarge, UnknownHandle
from workq.state.dispatch import Filters


def status(broker: Broker, job: str) -> tuple[int, ...]:
    s = broker.job_status(job)
    return s["enqueued"], s["pending"], s["in_flight"], s["completed"], s["delivered"], s["buried"]


def test_round_trip_counts_and_positions(broker: Broker) -> None:
    handles = broker.enqueue("j", "llama", "chat", 512, [b"p0", b"p1", b"p2"], durable=True)
    assert status(broker, "j") == (3, 3, 0, 0, 0, 0)
    items = broker.lease(2, models=["llama"])
    assert [i.payload for i in items] == [b"p0", b"p1"] and [i.position for i in items] == [0, 1]
    assert items[0].job == "j" and items[0].key == ("llama", "chat", 512) and items[0].deliveries == 1
    assert status(broker, "j") == (3, 1, 2, 0, 0, 0)
    assert broker.complete([i.handle for i in items], [b"r0", b"r1"]) == ["completed", "completed"]
    assert status(broker, "j") == (3, 1, 0, 2, 0, 0)
    results = broker.results("j")
    assert [(r.handle, r.payload, r.position) for r in results] == [(handles[0], b"r0", 0), (handles[1], b"r1", 1)]
    assert status(broker, "j") == (3, 1, 0, 2, 2, 0)
    assert broker.results("j") == []
    more = broker.enqueue("j", "llama", "chat", 512, [b"p3"])
    assert broker.lease(10)[-1].position == 3 and more[0].segment == handles[0].segment


def test_each_input_gets_one_result_first_wins(broker: Broker) -> None:
    [h] = broker.enqueue("j", "m", "s", "l", [b"x"])
    [item] = broker.lease(1)
    assert broker.complete([h, h], [b"first", b"again"]) == ["completed", "duplicate"]
    assert broker.complete([h], [b"late"]) == ["duplicate"]
    assert [r.payload for r in broker.results("j")] == [b"first"]
    assert status(broker, "j") == (1, 0, 0, 1, 1, 0)
    del item


def test_a_late_result_for_a_pending_item_is_accepted_once(broker: Broker) -> None:
    [h] = broker.enqueue("j", "m", "s", "l", [b"x"])
    [item] = broker.lease(1)
    broker.release([item.handle])  # back to pending
    assert broker.complete([h], [b"late but first"]) == ["completed"]
    assert broker.lease(5) == []  # retired: never dispatched again
    assert status(broker, "j") == (1, 0, 0, 1, 0, 0)


def test_unknown_and_forged_handles_are_refused_and_change_nothing(broker: Broker) -> None:
    [h] = broker.enqueue("j", "m", "s", "l", [b"x" * 100])
    [item] = broker.lease(1)
    before = status(broker, "j")
    for bad in (Handle(h.segment, h.offset + 8), Handle(h.segment, 10**8), Handle(999, 4096)):
        with pytest.raises(UnknownHandle):
            broker.complete([item.handle, bad], [b"r", b"r"])
    assert status(broker, "j") == before
    with pytest.raises(NotLeased):
        broker.touch([Handle(h.segment, h.offset + 8)])
    assert status(broker, "never") == (0, 0, 0, 0, 0, 0)  # a job nothing was enqueued for (test_api_edges.py)


def test_bad_enqueue_input(open_broker: Callable[..., Broker]) -> None:
    broker = open_broker(max_payload_bytes=100)
    with pytest.raises(PayloadTooLarge, match="payload 1 has 101 bytes"):
        broker.enqueue("j", "m", "s", "l", [b"ok", b"x" * 101])
    with pytest.raises(ValueError, match="model must be"):
        broker.enqueue("j", "", "s", "l", [b"ok"])
    with pytest.raises(ValueError, match="job must be"):
        broker.enqueue("", "m", "s", "l", [b"ok"])
    assert broker.enqueue("j", "m", "s", "l", []) == []
    assert status(broker, "j") == (0, 0, 0, 0, 0, 0)  # nothing was written
    assert broker.stats()["keys"] == []


def test_lease_expiry_redelivers_then_buries_and_kick(open_broker: Callable[..., Broker]) -> None:
    broker = open_broker(lease_s=0.3, max_deliveries=2)
    [h] = broker.enqueue("j", "m", "s", "l", [b"poison"])
    first = broker.lease(1)
    assert first[0].deliveries == 1
    second = broker.lease(1, wait=5)  # waits for the expiry
    assert second and second[0].handle == h and second[0].deliveries == 2
    deadline = time.monotonic() + 5
    while status(broker, "j")[5] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert status(broker, "j") == (1, 0, 0, 0, 0, 1)  # buried after 2 deliveries
    assert broker.lease(1) == []
    assert broker.kick("j") == 1
    again = broker.lease(1)
    assert again[0].handle == h and again[0].deliveries == 1


def test_release_with_delay_and_touch(open_broker: Callable[..., Broker]) -> None:
    broker = open_broker(lease_s=1.5)
    broker.enqueue("j", "m", "s", "l", [b"a", b"b"])
    items = broker.lease(2)
    broker.release([items[0].handle], delay=0.8)
    assert status(broker, "j")[1:3] == (1, 1)
    assert broker.lease(1) == []  # delayed, not yet pending
    for _ in range(5):
        time.sleep(0.4)
        broker.touch([items[1].handle])  # kept alive past its 1.5 s lease
    got = broker.lease(5)
    assert [i.handle for i in got] == [items[0].handle]
    assert broker.complete([items[1].handle], [b"done"]) == ["completed"]


def test_lease_waits_for_new_work(broker: Broker) -> None:
    threading.Timer(0.3, lambda: broker.enqueue("j", "m", "s", "l", [b"late"])).start()
    started = time.monotonic()
    items = broker.lease(1, wait=10)
    assert [i.payload for i in items] == [b"late"] and time.monotonic() - started < 5


def test_results_wait_for_completion(broker: Broker) -> None:
    [h] = broker.enqueue("j", "m", "s", "l", [b"x"])
    broker.lease(1)
    threading.Timer(0.3, lambda: broker.complete([h], [b"r"])).start()
    assert [r.payload for r in broker.results("j", wait=10)] == [b"r"]


def test_fair_across_jobs_and_keys(broker: Broker) -> None:
    broker.enqueue("big", "m", "s", "l", [b"B"] * 100)
    broker.enqueue("small", "m", "s", "l", [b"S"] * 5)
    first = broker.lease(10)
    assert sum(i.job == "small" for i in first) == 5  # water-filling: small gets its share at once
    broker.enqueue("other", "m", "s2", "l", [b"O"] * 50)
    keys = [broker.lease(1)[0].key.shape for _ in range(4)]
    assert set(keys) == {"s", "s2"}  # successive leases rotate over keys
    assert [i.key for i in broker.lease(3, models=["nope"])] == []
    assert {i.key.shape for i in broker.lease(200, shapes=["s2"])} == {"s2"}


def test_rotation_collection_and_handles_never_reused(open_broker: Callable[..., Broker], tmp_path: Path) -> None:
    broker = open_broker(segment_bytes=64 * 1024, max_payload_bytes=16 * 1024)
    handles = []
    for _ in range(12):
        handles += broker.enqueue("j", "m", "s", "l", [b"z" * 10_000])
    assert len({h.segment for h in handles}) >= 2
    items = broker.lease(100)
    broker.complete([i.handle for i in items], [b"ok"] * len(items))
    broker.tick()
    files = sorted(p.name for p in (tmp_path / "data" / "workq" / "segments").iterdir())
    assert len(files) == 1  # only the newest segment is kept
    [fresh] = broker.enqueue("j", "m", "s", "l", [b"new"])
    assert fresh not in handles
    assert broker.complete([handles[0]], [b"late"]) == ["duplicate"]  # its segment is gone: already done


def test_disk_floor_refuses_enqueue_but_not_completion(open_broker: Callable[..., Broker]) -> None:
    broker = open_broker()
    [h] = broker.enqueue("j", "m", "s", "l", [b"x"])
    broker.lease(1)
    broker.close()
    broker = open_broker(disk_floor_bytes=2**62)
    with pytest.raises(DiskFull, match="below the floor"):
        broker.enqueue("j", "m", "s", "l", [b"y"])
    [item] = broker.lease(1)
    assert broker.complete([item.handle], [b"r"]) == ["completed"] and item.handle == h


def test_restart_keeps_pending_and_buried_and_counts(open_broker: Callable[..., Broker]) -> None:
    broker = open_broker(max_deliveries=1, lease_s=0.2)
    handles = broker.enqueue("j", "m", "s", "l", [b"a", b"b", b"c", b"d"], durable=True)
    items = broker.lease(2)
    broker.complete([items[0].handle], [b"ra"])
    time.sleep(0.5)
    broker.tick()  # items[1] expires after its only delivery: buried
    assert status(broker, "j") == (4, 2, 0, 1, 0, 1)
    broker.close()
    broker = open_broker(max_deliveries=1)
    assert broker.recovery.segments == 1
    assert status(broker, "j") == (4, 2, 0, 1, 0, 1)
    assert {i.handle for i in broker.lease(10)} == set(handles[2:])
    assert [r.payload for r in broker.results("j")] == [b"ra"]


def test_reconnect_window_holds_back_recovered_items(open_broker: Callable[..., Broker]) -> None:
    broker = open_broker()
    broker.enqueue("j", "m", "s", "l", [b"old"], durable=True)
    broker.close()
    broker = open_broker(reconnect_window_s=0.6)
    [new] = broker.enqueue("j", "m", "s", "l", [b"new"])
    assert [i.handle for i in broker.lease(10)] == [new]  # only items enqueued since the start
    started = time.monotonic()
    late = broker.lease(10, wait=5)
    assert [i.payload for i in late] == [b"old"] and time.monotonic() - started >= 0.3


def test_completion_logs_rotate_and_collect_with_counts_kept(open_broker: Callable[..., Broker],
                                                            tmp_path: Path) -> None:
    broker = open_broker(segment_bytes=64 * 1024, max_payload_bytes=16 * 1024)
    for _ in range(10):
        broker.enqueue("j", "m", "s", "l", [b"t"])
    for item in broker.lease(10):
        broker.complete([item.handle], [b"R" * 12_000])
    results_dir = next((tmp_path / "data" / "workq" / "results").iterdir())
    assert len(list(results_dir.iterdir())) >= 2
    assert len(broker.results("j", max_items=100)) == 10
    for _ in range(3):
        broker.tick()
        time.sleep(0.05)
    assert len(list(results_dir.iterdir())) == 1  # all delivered, sealed ones collected
    assert status(broker, "j") == (10, 0, 0, 10, 10, 0)
    broker.close()
    broker = open_broker(segment_bytes=64 * 1024, max_payload_bytes=16 * 1024)
    assert status(broker, "j") == (10, 0, 0, 10, 10, 0)  # the ledger carries the collected results
    broker.enqueue("j", "m", "s", "l", [b"u"])
    assert broker.lease(1)[0].position == 10


def test_results_sent_but_not_confirmed_come_back_and_pin_their_segment(open_broker: Callable[..., Broker]) -> None:
    broker = open_broker()
    [h] = broker.enqueue("j", "m", "s", "l", [b"x"])
    broker.complete([broker.lease(1)[0].handle], [b"r"])
    delivery = broker.results_async("j", 10).result()
    assert len(delivery) == 1
    assert len(broker.results_async("j", 10).result()) == 0  # in delivery: not handed out twice
    delivery.drop()  # the connection closed before the send
    delivery.confirm().result()  # too late: dropped, so this does nothing
    assert [r.payload for r in broker.results("j")] == [b"r"]
    assert h.segment == 1


def test_collection_never_pulls_a_segment_from_under_a_reader(open_broker: Callable[..., Broker],
                                                             tmp_path: Path) -> None:
    from common.journal import Journal

    broker = open_broker(segment_bytes=64 * 1024, max_payload_bytes=30_000)
    for _ in range(4):
        broker.enqueue("j", "m", "s", "l", [b"q" * 25_000])
    segments = sorted((tmp_path / "data" / "workq" / "segments").iterdir())
    reader = Journal.open(segments[0], writable=False)  # e.g. `shardmgr verify` in another process
    items = broker.lease(10)
    broker.complete([i.handle for i in items], [b"ok"] * len(items))
    broker.tick()
    assert not segments[0].exists()  # collected ...
    assert [len(r.body) for r in reader.records()] == [25_024] * reader.count  # ... and still fully readable
    reader.close()


def test_hello_and_release_count_a_repeated_handle_once(broker: Broker) -> None:
    h1, h2 = broker.enqueue("j", "m", "s", 1, [b"a", b"b"])
    dropped = broker.hello("w", [h1, h1])
    assert dropped == [] and status(broker, "j") == (2, 1, 1, 0, 0, 0)
    assert [i.handle for i in broker.lease(10, worker="w2")] == [h2]  # still dispatched
    broker.release([h1, h1], worker="w")
    assert status(broker, "j") == (2, 1, 1, 0, 0, 0)
    assert [i.handle for i in broker.lease(10, worker="w3")] == [h1]


def test_a_damaged_payload_is_buried_and_waiting_leases_still_answer(open_broker: Callable[..., Broker],
                                                                    tmp_path: Path) -> None:
    broker = open_broker()
    bad, good = broker.enqueue("j", "m", "s", 1, [b"payload-payload", b"fine"], durable=True)
    broker.close()
    [segment] = (tmp_path / "data" / "workq" / "segments").iterdir()
    with open(segment, "r+b") as f:  # one byte of rot inside the first payload
        f.seek(bad.offset + 16 + 24 + 2)
        f.write(b"X")
    broker = open_broker()
    answers: list[list] = []
    waiter = threading.Thread(target=lambda: answers.append(broker.lease(10, wait=2.0)), daemon=True)
    waiter.start()
    waiter.join(10)
    assert not waiter.is_alive() and [i.handle for i in answers[0]] == [good]
    assert status(broker, "j") == (2, 0, 1, 0, 0, 1)  # the damaged one is buried, for an operator to see


def test_a_parked_call_whose_retry_raises_is_answered(flusher: Flusher) -> None:
    from concurrent.futures import Future

    from workq.loop import OwnerLoop

    calls = []

    def attempt(final: bool) -> bool:
        calls.append(final)
        if len(calls) > 1:
            raise RuntimeError("boom")
        return False

    loop = OwnerLoop(flusher, tick=lambda now: None, changes=lambda: (len(calls), 0), stop=lambda: None)
    loop.start()
    done: Future[None] = Future()
    loop.submit(lambda: loop.park(time.monotonic() + 0.2, attempt, "items", done.set_exception))
    with pytest.raises(RuntimeError, match="boom"):
        done.result(10)
    loop.stop()


def test_finished_jobs_hold_no_open_files(open_broker: Callable[..., Broker], monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import workq.state.queue

    monkeypatch.setattr(workq.state.queue, "REST_AFTER_S", 0.0)
    broker = open_broker()
    before = len(os.listdir("/proc/self/fd"))
    for n in range(200):
        broker.enqueue(f"job-{n}", "m", "s", 1, [b"x"])
        broker.complete([broker.lease(1)[0].handle], [b"r"])
        broker.results(f"job-{n}")
    broker.flusher.flush_now()
    broker.tick()
    assert len(os.listdir("/proc/self/fd")) < before + 20  # not two per job
    assert status(broker, "job-7") == (1, 0, 0, 1, 1, 0)  # counts kept while resting
    [h] = broker.enqueue("job-7", "m", "s", 1, [b"y"])  # a resting job wakes up
    broker.complete([broker.lease(1)[0].handle], [b"r2"])
    assert [(r.handle, r.payload) for r in broker.results("job-7")] == [(h, b"r2")]
    assert status(broker, "job-7") == (2, 0, 0, 2, 2, 0)
    broker.close()
    reopened = open_broker()
    assert status(reopened, "job-7") == (2, 0, 0, 2, 2, 0) and status(reopened, "job-199") == (1, 0, 0, 1, 1, 0)


def test_embedded_open_takes_the_typed_configuration_of_serve(tmp_path: Path) -> None:
    from common.journal import FlusherConfig
    from workq.config import WorkqConfig

    config = WorkqConfig(reconnect_window_s=0.0, disk_floor_bytes=0)
    with workq.open(tmp_path, config, flusher=FlusherConfig(interval=3600.0), lease_s=7.0) as broker:
        assert broker.config.lease_s == 7.0 and broker.config.disk_floor_bytes == 0
        rounds = broker.flusher.stats.rounds
        broker.enqueue("j", "m", "s", 1, [b"x"])  # durable at the next round: in an hour
        time.sleep(0.2)
        assert broker.flusher.stats.rounds == rounds
        broker.enqueue("j", "m", "s", 1, [b"y"], durable=True)  # a waiter starts a round at once
        assert broker.flusher.stats.rounds > rounds


def test_a_waiting_call_cannot_be_cancelled_so_nothing_is_taken_unseen(tmp_path: Path) -> None:
    """A results or lease future cannot be cancelled once its call waits on
    the owner thread: no delivery or lease is made that nobody learns of."""
    from workq.config import WorkqConfig
    from workq.state.dispatch import Filters as Serves

    config = WorkqConfig(reconnect_window_s=0.0, disk_floor_bytes=0)
    with workq.open(tmp_path / "data", config) as broker:
        broker.enqueue("j", "m", "s", 1, [b"x"], durable=True)
        waiting = broker.results_async("j", 10, wait=2.0)
        time.sleep(0.1)
        assert not waiting.cancel()  # already waiting: it will be answered
        [item] = broker.lease(1)
        assert broker.complete([item.handle], [b"r"]) == ["completed"]
        delivery = waiting.result(10)
        assert [r.payload for r in delivery.results()] == [b"r"]
        delivery.drop()
        assert [r.payload for r in broker.results("j", 10, wait=1.0)] == [b"r"]
        leasing_call = broker.lease_async("w1", Serves(), 1, wait=2.0)
        time.sleep(0.1)
        assert not leasing_call.cancel()
        [again] = broker.enqueue("j", "m", "s", 1, [b"y"], durable=True)
        assert [b.handles for b in leasing_call.result(10)] == [[again.packed]]


def test_waits_and_delays_outside_their_limits_are_refused_and_change_nothing(broker: Broker) -> None:
    from common.wire.errors import BadRequest
    from workq.calls import MAX_DELAY_S, MAX_WAIT_S

    [h] = broker.enqueue("j", "m", "s", 1, [b"x"])
    [item] = broker.lease(1, worker="w")
    before = broker.job_status("j")
    for bad in (-1.0, float("nan"), float("inf"), 1e308, "1", True):
        with pytest.raises(BadRequest, match="delay must be a number of seconds in 0..604800"):
            broker.release([item.handle], delay=bad, worker="w")  # type: ignore[arg-type]
        with pytest.raises(BadRequest, match="wait must be a number of seconds in 0..3600"):
            broker.lease(1, wait=bad)  # type: ignore[arg-type]
        with pytest.raises(BadRequest, match="wait must be a number of seconds in 0..3600"):
            broker.results("j", wait=bad)  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="delay must be"):
        broker.release([item.handle], delay=MAX_DELAY_S * 1.01, worker="w")
    with pytest.raises(BadRequest, match="wait must be"):
        broker.lease(1, wait=MAX_WAIT_S + 1)
    for count in (-1, 1.5, None):
        with pytest.raises(BadRequest, match="max_items must be an integer >= 0"):
            broker.lease(count)  # type: ignore[arg-type]
    assert broker.job_status("j") == before  # still leased to w, nothing else moved
    broker.release([h], worker="w")
    assert [i.handle for i in broker.lease(1)] == [h]


def test_numpy_counts_and_seconds_are_taken_as_python_ones(broker: Broker) -> None:
    """The compiled worker side takes a caller's counts and seconds as objects and checks them
    (calls.py): numpy's integers and floats pass in both builds."""
    from common.wire.errors import BadRequest

    [h] = broker.enqueue("j", "m", "s", 1, [b"x"])
    [item] = broker.lease(np.int64(1), wait=np.float64(0.0), worker="w")  # type: ignore[arg-type]
    broker.release([item.handle], delay=np.float32(0.0), worker="w")  # type: ignore[arg-type]
    [batch] = broker.lease_async("w", Filters(), np.uint8(5), max_bytes=np.int64(10_000)).result(10)  # type: ignore[arg-type]
    assert batch.handles == [h.packed]
    assert broker.complete([h], [b"r"], durable=np.bool_(False)) == ["completed"]  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="max_bytes must be an integer >= 0"):
        broker.lease_async("w", Filters(), 1, max_bytes="big").result(10)  # type: ignore[arg-type]



def test_a_durable_flag_with_no_truth_value_fails_before_anything_is_written(broker: Broker) -> None:
    [h] = broker.enqueue("j", "m", "s", 1, [b"x"])
    broker.lease(1)
    with pytest.raises(ValueError, match="truth value"):
        broker.complete([h], [b"r"], durable=np.array([True, False]))  # type: ignore[arg-type]
    assert broker.job_status("j")["in_flight"] == 1  # still leased, no result recorded
    assert broker.complete([h], [b"r"]) == ["completed"]

def test_complete_answers_duplicate_per_item_and_keeps_the_first(broker: Broker) -> None:
    h1, h2, h3 = broker.enqueue("j", "m", "s", 1, [b"1", b"2", b"3"])
    broker.lease(3)
    assert broker.complete([h1, h2], [b"r1", b"r2"]) == ["completed", "completed"]
    assert broker.complete([h1, h3, h3], [b"again", b"r3", b"r3b"]) == ["duplicate", "completed", "duplicate"]
    assert [r.payload for r in broker.results("j")] == [b"r1", b"r2", b"r3"]


def test_a_lease_stops_at_an_item_that_does_not_fit_and_leaves_it_pending(broker: Broker) -> None:
    small, big = b"s" * 10, b"B" * 20_000
    broker.enqueue("j", "m", "s", 1, [small])
    broker.enqueue("j", "m", "s", 2, [big, small])  # another key: taken after the first one's item
    filters = Filters.of(None, None, None)
    batches = broker.lease_async("w", filters, 3, 0.0, max_bytes=12_000).result(10)
    assert [p for b in batches for p in b.payloads] == [small]  # the big one did not fit: nothing after it
    rest = broker.lease_async("w", filters, 3, 0.0, max_bytes=100_000).result(10)
    assert [p for b in rest for p in b.payloads] == [big, small]
