"""The catalog of queue files: recorded on creation, tombstoned before
collection, rebuilt when lost, compacted, and what verify makes of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from common.journal import Flusher, FlusherConfig, Marker
from common.journal.check import Findings, Severity
from shardmgr.verification import queue_checks as queue_check
from workq import Broker
from workq.disk import catalog as catalog_module
from workq.disk.catalog import RESULTS, SEGMENT, Catalog, Entry


def findings_of(root: Path) -> list[tuple[str, Severity, str]]:
    findings = Findings()
    queue_check.check(root / "workq", findings, deep=True)
    return [(str(Path(p.path).relative_to(root / "workq")), p.severity, p.what) for p in findings.problems]


def catalog_of(root: Path) -> dict[Entry, Marker]:
    with Flusher(FlusherConfig()) as flusher:
        book = Catalog.open(root / "workq", flusher)
        try:
            return {e: m for e, (_, m) in book.entries.items()}
        finally:
            book.close()


def fill(broker: Broker, segments: int = 3) -> None:
    """Items enough for ``segments`` small segments, all completed and delivered."""
    for _ in range(segments):
        broker.enqueue("job", "m", "s", 0, [b"x" * 1000] * 50, durable=True)
    while leased := broker.lease(100, worker="w"):
        broker.complete([i.handle for i in leased], [b"r"] * len(leased))
    broker.results("job", max_items=10_000)


def test_files_are_recorded_and_collection_tombstones_first(open_broker: Callable[..., Broker],
                                                            tmp_path: Path) -> None:
    broker = open_broker(segment_bytes=64 << 10)
    fill(broker)
    broker.close()  # collects the finished segments
    root = tmp_path / "data"
    book = catalog_of(root)
    present = {Entry(SEGMENT, int(p.stem)) for p in (root / "workq" / "segments").glob("*.wqsg")}
    assert {e for e, m in book.items() if m == Marker.LIVE and e.kind == SEGMENT} == present
    retired = {e for e, m in book.items() if m == Marker.RETIRED}
    assert retired and all(not e.path(root / "workq").exists() for e in retired)
    assert any(e.kind == RESULTS and m == Marker.LIVE for e, m in book.items())
    assert findings_of(root) == []


def test_recovery_finishes_a_collection_cut_before_the_unlink(open_broker: Callable[..., Broker],
                                                              tmp_path: Path) -> None:
    root = tmp_path / "data"
    segment = root / "workq" / "segments" / "0000000001.wqsg"
    broker = open_broker(segment_bytes=64 << 10, idle_seal_s=0.001)
    broker.enqueue("job", "m", "s", 0, [b"x" * 1000] * 50, durable=True)
    broker.close()
    broker = open_broker(segment_bytes=64 << 10)  # recovery seals segment 1; the new item goes to segment 2
    broker.enqueue("job", "m", "s", 0, [b"y"], durable=True)
    items = [i for i in broker.lease(100) if i.handle.segment == 1]
    broker.complete([i.handle for i in items], [b"r"] * len(items))  # every marker of segment 1 is RETIRED
    kept = segment.read_bytes()
    broker.close()  # the collector retires its catalog record durably, then unlinks it
    assert not segment.exists() and catalog_of(root)[Entry(SEGMENT, 1)] == Marker.RETIRED
    segment.write_bytes(kept)  # as if a crash came before the unlink
    assert ("segments/0000000001.wqsg", Severity.REPAIRABLE, "collected") in findings_of(root)
    broker = open_broker(segment_bytes=64 << 10)
    broker.tick()  # its own markers say it is finished: the collector deletes it
    assert not segment.exists()
    assert broker.job_status("job")["pending"] == 1 and broker.job_status("job")["completed"] == 50
    broker.close()
    assert findings_of(root) == []


def test_the_markers_win_over_a_catalog_that_calls_a_live_segment_collected(open_broker: Callable[..., Broker],
                                                                            tmp_path: Path) -> None:
    """The catalog is an audit record: recovery never obeys it. A catalog
    that says a segment with pending items was collected loses nothing."""
    root = tmp_path / "data"
    broker = open_broker(segment_bytes=64 << 10, idle_seal_s=0.001)
    broker.enqueue("job", "m", "s", 0, [b"x" * 1000] * 50, durable=True)
    broker.close()
    broker = open_broker(segment_bytes=64 << 10)
    broker.enqueue("job", "m", "s", 0, [b"y"], durable=True)
    broker.close()
    with Flusher(FlusherConfig()) as flusher:  # a wrong, durable tombstone in the catalog
        book = Catalog.open(root / "workq", flusher)
        book.retire_durably([Entry(SEGMENT, 1)])
        book.close()
    broker = open_broker(segment_bytes=64 << 10)
    broker.tick()
    assert (root / "workq" / "segments" / "0000000001.wqsg").exists()
    assert broker.job_status("job")["pending"] == 51
    assert len(broker.lease(100)) == 51
    broker.close()
    assert catalog_of(root)[Entry(SEGMENT, 1)] == Marker.LIVE  # the audit record follows the files again
    assert findings_of(root) == []


def test_a_lost_catalog_is_rebuilt_from_the_files(open_broker: Callable[..., Broker], tmp_path: Path) -> None:
    root = tmp_path / "data"
    broker = open_broker(segment_bytes=64 << 10)
    for _ in range(2):
        broker.enqueue("job", "m", "s", 0, [b"x" * 1000] * 50, durable=True)
    broker.close()
    (root / "workq" / catalog_module.FILE).unlink()
    assert findings_of(root) == [(catalog_module.FILE, Severity.REPAIRABLE, "missing")]
    open_broker(segment_bytes=64 << 10).close()
    assert findings_of(root) == []
    assert len([e for e, m in catalog_of(root).items() if m == Marker.LIVE]) == 3  # two segments, one log


def test_a_lost_file_is_reported_and_the_broker_still_starts(open_broker: Callable[..., Broker],
                                                             tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "data"
    broker = open_broker(segment_bytes=64 << 10)
    for _ in range(2):
        broker.enqueue("job", "m", "s", 0, [b"x" * 1000] * 50, durable=True)
    broker.close()
    (root / "workq" / "segments" / "0000000001.wqsg").unlink()
    assert findings_of(root) == [("segments/0000000001.wqsg", Severity.CORRUPT, "missing")]
    broker = open_broker(segment_bytes=64 << 10)
    assert "0000000001.wqsg is missing" in caplog.text
    assert 0 < broker.job_status("job")["pending"] < 100
    broker.close()
    assert findings_of(root) == [("segments/0000000001.wqsg", Severity.CORRUPT, "missing")]  # until acknowledged


def test_a_catalog_of_mostly_dead_records_is_compacted(open_broker: Callable[..., Broker], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalog_module, "COMPACT_AFTER", 4)
    root = tmp_path / "data"
    broker = open_broker(segment_bytes=64 << 10)
    fill(broker, segments=8)
    broker.close()
    before = catalog_of(root)  # opening compacts: read the records themselves first
    open_broker(segment_bytes=64 << 10).close()
    after = catalog_of(root)
    assert {e for e, m in after.items()} == {e for e, m in before.items() if m == Marker.LIVE}
    assert all(m == Marker.LIVE for m in after.values())
    assert findings_of(root) == []


def test_nothing_is_unlinked_after_a_failed_tombstone_flush(open_broker: Callable[..., Broker], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib
    import errno
    import os

    import common.journal.syncer
    from common.journal.errors import FlushFailed
    from workq.config import WorkqConfig
    from workq.state import collector
    from workq.state.queue import QueueState
    from workq.state.recovery import recover
    from workq.testing import crash

    broker = open_broker(segment_bytes=64 << 10)
    fill(broker, segments=3)
    crash(broker)  # finished segments the collector has not deleted yet stay behind
    with Flusher(FlusherConfig(interval=0.002)) as flusher:
        state = QueueState(tmp_path / "data" / "workq", WorkqConfig(segment_bytes=64 << 10), flusher)
        recover(state)
        catalog = state.catalog
        assert catalog is not None
        real = os.fdatasync

        def fdatasync(fd: int) -> None:  # the catalog's disk fails: its tombstones never become durable
            if fd == catalog.journal._file.fd:
                raise OSError(errno.EIO, "Input/output error")
            real(fd)

        monkeypatch.setattr(common.journal.syncer.os, "fdatasync", fdatasync)
        segments = sorted((tmp_path / "data" / "workq" / "segments").glob("*.wqsg"))
        assert len(segments) > 1 and any(s.finished for s in state.segments.values())
        for _ in range(2):  # the second try finds the tombstones already set in memory
            with contextlib.suppress(FlushFailed):
                collector.collect_segments(state)
        assert all(p.exists() for p in segments)
        state.abandon()


def test_segment_ids_are_never_reused_after_the_newest_is_lost(open_broker: Callable[..., Broker],
                                                               tmp_path: Path) -> None:
    root = five_completed(open_broker, tmp_path)  # their results name handles of segment 1
    (root / "workq" / "segments" / "0000000001.wqsg").unlink()  # lost (or quarantined by repair)
    broker = open_broker(segment_bytes=64 << 10)
    handles = broker.enqueue("job", "m", "s", 0, [b"y"] * 5, durable=True)
    assert {h.segment for h in handles} == {2}
    broker.close()
    broker = open_broker(segment_bytes=64 << 10)
    assert broker.job_status("job")["pending"] == 5  # not mistaken for the old, completed items
    broker.close()


def test_a_damaged_catalog_does_not_stop_the_queue(open_broker: Callable[..., Broker], tmp_path: Path) -> None:
    root = tmp_path / "data"
    broker = open_broker(segment_bytes=64 << 10)
    broker.enqueue("job", "m", "s", 0, [b"x"] * 5, durable=True)
    broker.close()
    path = root / "workq" / catalog_module.FILE
    data = bytearray(path.read_bytes())
    data[100] ^= 1
    path.write_bytes(bytes(data))
    assert (catalog_module.FILE, Severity.CORRUPT, "header") in findings_of(root)
    broker = open_broker(segment_bytes=64 << 10)
    assert broker.job_status("job")["pending"] == 5
    broker.close()
    assert [(s, w) for _, s, w in findings_of(root)] == [(Severity.NOTE, "damaged_catalog")]  # kept


def test_a_job_whose_log_was_lost_is_usable_by_name(open_broker: Callable[..., Broker], tmp_path: Path) -> None:
    root = tmp_path / "data"
    broker = open_broker(segment_bytes=64 << 10)
    broker.enqueue("alpha", "m", "s", 0, [b"x"] * 5, durable=True)
    broker.close()
    for path in (root / "workq" / "results").glob("*/*.wqcl"):
        path.unlink()
    broker = open_broker(segment_bytes=64 << 10)
    broker.enqueue("alpha", "m", "s", 0, [b"y"], durable=True)
    assert broker.job_status("alpha")["pending"] == 6
    broker.close()


def test_a_clean_stop_collects_completions_it_confirmed_last(open_broker: Callable[..., Broker],
                                                             tmp_path: Path) -> None:
    import numpy as np

    broker = open_broker(segment_bytes=64 << 10)
    for _ in range(3):
        broker.enqueue("job", "m", "s", 0, [b"x" * 1000] * 50, durable=True)
    leased = broker.lease(1000, worker="w")
    packed = np.array([i.handle.packed for i in leased], dtype=np.uint64)
    completed = broker.complete_async(packed, [b"r"] * len(leased))  # answered only when durable: the stop comes first
    broker.close()
    assert set(completed.result()) == {"completed"}
    assert findings_of(tmp_path / "data") == []


def test_a_flipped_bit_in_a_catalog_id_is_not_believed(open_broker: Callable[..., Broker], tmp_path: Path) -> None:
    from common.journal.record import RECORD_HEADER_SIZE

    root = tmp_path / "data"
    broker = open_broker(segment_bytes=64 << 10)
    broker.enqueue("job", "m", "s", 0, [b"x"] * 5, durable=True)
    broker.close()
    offset = {e: o for e, (o, _) in catalog_entries(root).items()}[Entry(SEGMENT, 1)]
    path = root / "workq" / catalog_module.FILE
    data = bytearray(path.read_bytes())
    data[offset + RECORD_HEADER_SIZE + 8 + 5] ^= 1  # bit 40 of the segment id, at rest
    path.write_bytes(bytes(data))
    broker = open_broker(segment_bytes=64 << 10)  # the catalog is found damaged, moved aside, rebuilt
    handles = broker.enqueue("job", "m", "s", 1, [b"y"] * 3, durable=True)
    assert {h.segment for h in handles} == {2}
    leased = [i for i in broker.lease(10, worker="w") if i.key.lane == 1]
    assert broker.complete([i.handle for i in leased], [b"r"] * 3) == ["completed"] * 3
    broker.close()
    assert [w for _, _, w in findings_of(root)] == ["damaged_catalog"]


def test_no_reuse_when_the_newest_segment_and_the_catalog_are_both_lost(open_broker: Callable[..., Broker],
                                                                        tmp_path: Path) -> None:
    root = five_completed(open_broker, tmp_path)
    (root / "workq" / "segments" / "0000000001.wqsg").unlink()
    (root / "workq" / catalog_module.FILE).unlink()
    broker = open_broker(segment_bytes=64 << 10)
    assert {h.segment for h in broker.enqueue("job", "m", "s", 0, [b"y"] * 5, durable=True)} == {2}
    broker.close()
    broker = open_broker(segment_bytes=64 << 10)
    assert broker.job_status("job")["pending"] == 5  # the results of segment 1 do not claim them
    broker.close()


def test_a_lost_log_segments_number_is_never_reused(open_broker: Callable[..., Broker], tmp_path: Path) -> None:
    root = tmp_path / "data"
    broker = open_broker(segment_bytes=64 << 10)
    broker.enqueue("job", "m", "s", 0, [b"x"] * 200, durable=True)
    leased = broker.lease(150, worker="w")
    broker.complete([i.handle for i in leased], [b"r" * 1000] * len(leased))  # several log segments
    broker.close()
    newest = sorted((root / "workq" / "results").glob("*/*.wqcl"))[-1]
    newest.unlink()
    lost = (str(newest.relative_to(root / "workq")), Severity.CORRUPT, "missing")
    assert lost in findings_of(root)
    broker = open_broker(segment_bytes=64 << 10)
    more = broker.lease(10, worker="w")
    broker.complete([i.handle for i in more], [b"r"] * len(more))
    broker.close()
    assert not newest.exists() and lost in findings_of(root)  # still reported: not masked by a new file


def test_a_wholly_lost_log_is_reported_and_the_name_comes_back(open_broker: Callable[..., Broker], tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "data"
    broker = open_broker(segment_bytes=64 << 10)
    broker.enqueue("alpha", "m", "s", 0, [b"x"] * 5, durable=True)
    leased = broker.lease(2, worker="w")
    broker.complete([i.handle for i in leased], [b"r"] * 2)
    broker.close()
    for path in (root / "workq" / "results").glob("*/*.wqcl"):
        path.unlink()
    broker = open_broker(segment_bytes=64 << 10)
    assert "is missing" in caplog.text
    broker.enqueue("alpha", "m", "s", 0, [b"y"], durable=True)
    broker.close()
    assert ("results/9a08c8ea20d20653/00000000.wqcl", Severity.CORRUPT, "missing") in findings_of(root)
    broker = open_broker(segment_bytes=64 << 10)  # after a restart the name is still known
    assert {i.job for i in broker.lease(10, worker="w")} == {"alpha"}
    broker.close()


def five_completed(open_broker: Callable[..., Broker], tmp_path: Path) -> Path:
    """A closed queue whose five items (segment 1) have results; returns its directory."""
    broker = open_broker(segment_bytes=64 << 10)
    broker.enqueue("job", "m", "s", 0, [b"x"] * 5, durable=True)
    leased = broker.lease(5, worker="w")
    broker.complete([i.handle for i in leased], [b"r"] * 5)
    broker.close()
    return tmp_path / "data"


def catalog_entries(root: Path) -> dict[Entry, tuple[int, Marker]]:
    with Flusher(FlusherConfig()) as flusher:
        book = Catalog.open(root / "workq", flusher)
        try:
            return dict(book.entries)
        finally:
            book.close()


def test_a_damaged_catalog_record_blames_the_catalog_only(open_broker: Callable[..., Broker],
                                                          tmp_path: Path) -> None:
    from common.journal.record import RECORD_HEADER_SIZE

    root = five_completed(open_broker, tmp_path)
    path = root / "workq" / catalog_module.FILE
    pristine = path.read_bytes()
    for entry, (offset, _) in catalog_entries(root).items():
        for at in range(offset + RECORD_HEADER_SIZE, offset + RECORD_HEADER_SIZE + 24):  # every body byte
            data = bytearray(pristine)
            data[at] ^= 0x10
            path.write_bytes(bytes(data))
            found = findings_of(root)
            assert {where for where, severity, _ in found if severity == Severity.CORRUPT} == {catalog_module.FILE}, \
                (entry, at, found)
    path.write_bytes(pristine)
