"""Start-up decides every file's fate from the file's own markers: the
catalog (an audit record for verify) never changes a decision."""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import workq
from common.journal import Flusher, FlusherConfig
from common.journal.header import METADATA_OFFSET, SLOT, SLOT_OFFSETS
from workq.config import WorkqConfig
from workq.disk.catalog import FILE as CATALOG
from workq.disk.records import job_dir, job_id, log_file, segment_file
from workq.state import collector, leasing
from workq.state.dispatch import Filters
from workq.state.queue import QueueState
from workq.state.recovery import recover
from workq.testing import crash

CONFIG = WorkqConfig(segment_bytes=64 << 10, reconnect_window_s=0.0, disk_floor_bytes=0, max_deliveries=1)
#: Bytes past the catalog's last record that are flipped too (a tail a crash may leave).
PAST_THE_END = 256


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory on tmpfs where there is one: thousands of recoveries fsync every file."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=base) as directory:
        yield Path(directory)


def busy_queue(root: Path) -> Path:
    """A crashed queue with every kind of file fate: pending, leased, buried
    and delivered items, a collected completion-log segment, and a segment
    the collector retired in the catalog and unlinked, brought back by a
    power cut before the directory's fsync, with its tombstones lost (its
    items LIVE, their results durable): the catalog and the markers disagree."""
    broker = workq.open(root, CONFIG)
    for batch in range(4):
        broker.enqueue("job", "m", "s", batch % 2, [b"x" * 1000] * 50, durable=True)
    broker.enqueue("other", "m", "t", 0, [b"y" * 10] * 20, durable=True)
    done = [i for i in broker.lease(1000, shapes=["s"], lanes=["0"]) if i.handle.segment == 1]
    finished = root / "workq" / "segments" / "0000000001.wqsg"
    kept = finished.read_bytes()  # every marker LIVE
    broker.complete([i.handle for i in done], [b"r" * 10] * len(done))  # small: one log segment, never collected
    broker.results("job", max_items=10_000)
    others = broker.lease(100, shapes=["t"])
    broker.complete([i.handle for i in others], [b"z" * 4000] * len(others))  # big: log segments roll
    broker.results("other", max_items=10_000)
    first_log = root / "workq" / "results" / job_dir(job_id("other")) / log_file(0)
    deadline = time.monotonic() + 30
    while (finished.exists() or first_log.exists()) and time.monotonic() < deadline:
        broker.flusher.flush_now()  # the tombstones durable, then the ledger entry: the collector goes on
        broker.tick()
    assert not finished.exists() and not first_log.exists()
    leased = broker.lease(30, worker="w", shapes=["s"])
    broker.release([i.handle for i in leased[:5]], worker="w")  # max_deliveries=1: buried
    broker.complete([i.handle for i in leased[5:15]], [b"z"] * 10)
    broker.results("job", max_items=3)
    crash(broker)
    finished.write_bytes(kept)  # the catalog says collected; the markers say pending
    return root


def decisions(root: Path) -> dict[str, Any]:
    """What recovery (and the collector's first pass) make of ``root``."""
    with Flusher(FlusherConfig(interval=0.001)) as flusher:
        state = QueueState(root / "workq", CONFIG, flusher)
        summary = recover(state)
        collector.collect_segments(state)
        made = {
            "summary": (summary.segments, summary.jobs, summary.pending, summary.buried, summary.results,
                        summary.finished),
            "next_segment": state.next_segment_id,
            "status": {log.name: state.job_status(log.name) for log in state.logs.values()},
            "segments": sorted((s.id, s.pending, s.buried, s.finished) for s in state.segments.values()),
            "leased": sorted(h for b in leasing.lease(state, "w", Filters(), 10_000, time.monotonic())
                             for h in b.handles),
            "files": sorted(str(p.relative_to(root)) for p in (root / "workq").rglob("*")
                            if p.is_file() and not p.name.startswith(CATALOG)),
        }
        state.close()
    return made


SAMPLED_FLIPS = 200
"""Catalog bytes the default run flips (the soak run flips every one)."""
FIXED_FLIPS = [*range(METADATA_OFFSET), *(o + i for o in SLOT_OFFSETS for i in range(SLOT.size + 4))]
"""Of those, always: the header's identity and both anchor slots (with their crcs)."""


def flip_catalog_bytes(tmp_path: Path, scratch: Path, every: bool) -> None:
    """Flip catalog bytes one at a time (every one, or the header region and
    a fixed sample of the rest): no flip may change a recovery decision."""
    pristine = busy_queue(tmp_path / "pristine")
    copy = scratch / "copy"
    shutil.copytree(pristine, copy)
    expected = decisions(copy)
    assert expected["summary"][5] == 50  # segment 1's items: finished from their results, not deleted unread
    assert "workq/segments/0000000001.wqsg" not in expected["files"]  # then collected: every marker RETIRED
    catalog = bytearray((pristine / "workq" / CATALOG).read_bytes())
    with Flusher(FlusherConfig(interval=0.001)) as flusher:
        from workq.disk.catalog import Catalog

        end = Catalog.open(pristine / "workq", flusher).journal.end  # noqa: SIM115 - read once, below
    offsets = list(range(min(len(catalog), end + PAST_THE_END)))
    if not every and len(offsets) > SAMPLED_FLIPS:
        rest = sorted(set(offsets) - set(FIXED_FLIPS))
        offsets = sorted(FIXED_FLIPS + random.Random(12).sample(rest, SAMPLED_FLIPS - len(FIXED_FLIPS)))
    started = time.monotonic()
    for offset in offsets:
        shutil.rmtree(copy)
        shutil.copytree(pristine, copy)
        flipped = bytearray(catalog)
        flipped[offset] ^= 0xFF
        (copy / "workq" / CATALOG).write_bytes(flipped)
        assert decisions(copy) == expected, f"flipping catalog byte {offset} changed a decision"
    print(f"{len(offsets)} flips in {time.monotonic() - started:.1f} s")


def test_catalog_bytes_flipped_change_no_decision(tmp_path: Path, scratch: Path) -> None:
    flip_catalog_bytes(tmp_path, scratch, every=False)


@pytest.mark.soak
def test_every_catalog_byte_flipped_changes_no_decision(tmp_path: Path, scratch: Path) -> None:
    flip_catalog_bytes(tmp_path, scratch, every=True)


def test_a_quarantined_newest_segment_keeps_its_id_unused(tmp_path: Path) -> None:
    """verify --repair moved the newest segment aside (no result names its
    items): its id stays used, so a worker still holding one of its handles
    can never be mistaken for holding a new item."""
    from workq.disk.records import QUARANTINE_DIR, quarantine_name

    root = tmp_path / "data"
    broker = workq.open(root, CONFIG)
    [held] = broker.enqueue("job", "m", "s", 0, [b"a"], durable=True)
    broker.close()
    segment = root / "workq" / "segments" / segment_file(held.segment)
    aside = root / QUARANTINE_DIR / "workq" / quarantine_name(segment.relative_to(root / "workq"), "20261201T000000")
    aside.parent.mkdir(parents=True)
    segment.rename(aside)  # what repair does
    broker = workq.open(root, CONFIG)
    try:
        [new] = broker.enqueue("job", "m", "s", 0, [b"b"], durable=True)
        assert new.segment > held.segment
        assert broker.hello("w", [held]) == [held]  # the old handle names nothing: drop it
    finally:
        broker.close()


def test_a_lost_newest_segment_keeps_its_id_unused(tmp_path: Path) -> None:
    """The newest segment is lost (not quarantined) while a worker holds one
    of its items and no result names any: no file proves its id, the
    catalog's floor keeps it unused, so the old handle names nothing."""
    root = tmp_path / "data"
    broker = workq.open(root, CONFIG)
    broker.enqueue("j", "m", "s", "a", [b"a-task"], durable=True)
    [held] = broker.enqueue("j", "m", "s", "b", [b"b-task"], durable=True)
    assert [i.handle for i in broker.lease(1, lanes=["b"], worker="w")] == [held]
    broker.close()
    (root / "workq" / "segments" / segment_file(held.segment)).unlink()  # lost
    broker = workq.open(root, CONFIG)
    try:
        [new] = broker.enqueue("other", "m", "s", "c", [b"unrelated task"], durable=True)
        assert new.segment > held.segment
        assert broker.complete([held], [b"late result of b-task"]) == ["duplicate"]  # its segment is gone
        assert broker.job_status("other")["pending"] == 1
    finally:
        broker.close()

