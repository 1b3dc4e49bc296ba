"""Snapshots and power cuts (the journal layer's simulator, common/journal/testing/,
which models file contents, file entries and directory entries).

A store and a queue share a flusher in one process, as in the server. Work
that was acknowledged but not yet flushed comes just before the snapshot:
the snapshot's flush makes it durable, so both the source and the copy must
hold it. Then:

* after a snapshot reported done, the source goes on (appends, deletes,
  completions, deliveries) and the power is cut: the copy verifies clean and
  holds exactly the rows and queue state of its instant, and the source
  holds what it acknowledged durably;
* the power is cut during a snapshot, at chosen points (no cleanup runs, as
  with a real cut): the source holds exactly what was acknowledged; what is
  at ``DEST`` or ``DEST.tmp`` is either refused (marked incomplete) or whole
  (verifies, holds the instant's contents); and the same snapshot again
  succeeds or says clearly why not.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import shardmgr
from common.journal import Flusher, FlusherConfig
from common.journal.lockfile import INCOMPLETE_NAME, IncompleteCopy
from common.journal.testing import PowerCut
from shardmgr import snapshots
from shardmgr.snapshots import CannotSnapshot
from shardmgr.store.config import StoreConfig
from shardmgr.store.store import Store
from tests.shardmgr import snapshot_contents as contents_of
from tests.shardmgr.snapshot_contents import JOB, Contents
from workq.broker import Broker
from workq.config import WorkqConfig

# where the power goes: (function of the snapshot module it is looked up in, the call that never runs)
CUTS = [
    ("shardmgr.store.copies.copy_prefix", 2),  # the queue and the sealed shards copied, the growing one half
    ("shardmgr.snapshots.sync_tree", 1),  # every file copied and synced, no directory
    ("shardmgr.snapshots.fsync_dir", 2),  # the mark removed, not yet durably
    ("shardmgr.snapshots.fsync_dir", 3),  # renamed, the parent not synced
]


class PowerLost(Exception):
    """Raised where the power goes; nothing after it runs (no cleanup either)."""


@dataclasses.dataclass
class Live:
    """A store and a queue on one data directory, sharing a flusher (as the server's)."""

    store: Store
    broker: Broker
    flusher: Flusher

    def lease(self, n: int) -> list[Any]:
        return self.broker.lease(n, worker="w", models=["m"])

    def crash(self) -> None:
        """Stop as a power cut would: no further flush, files released unsynced."""
        self.broker.abandon()
        self.store.abandon()
        self.flusher.stop(flush=False)


def start(data: Path) -> Live:
    flusher = Flusher(FlusherConfig(interval=0.002)).start()
    store = Store(data, StoreConfig(seal_bytes=contents_of.SEAL_BYTES, **contents_of.QUIET), flusher=flusher)
    store.open()
    broker = Broker(data, WorkqConfig(segment_bytes=64 << 10, reconnect_window_s=0.0, disk_floor_bytes=0),
                    flusher=flusher, lock=False)
    broker.open()
    return Live(store, broker, flusher)


def more_work(service: Live, contents: Contents, seed: int, durable: bool) -> None:
    """Appends, deletes, a completion and a delivery; ``contents`` follows.
    ``durable=False``: nothing waits for a flush (but the delivery, which always does)."""
    vectors, ids = contents_of.batch(seed, 100)
    contents.appended(service.store.append("c", vectors, ids, durable=durable), vectors, ids)
    victims = sorted(contents.vectors)[seed::97][:10]
    service.store.delete("c", victims, durable=durable)
    contents.delete(victims)
    leased = service.lease(30)
    service.broker.complete([i.handle for i in leased], [b"result of " + i.payload[:8] for i in leased], durable)
    contents.pending = [p for p in contents.pending if p not in {i.payload for i in leased}]
    contents.results += [b"result of " + i.payload[:8] for i in leased]
    for result in service.broker.results(JOB, max_items=20):
        contents.results.remove(result.payload)
    contents.status = service.broker.job_status(JOB)


@pytest.mark.parametrize("seed", range(5))
def test_a_snapshot_reported_done_survives_a_power_cut(tmp_path: Path, seed: int) -> None:
    snapshot_then_cut(tmp_path, seed)


@pytest.mark.soak
@pytest.mark.parametrize("seed", range(5, 60))
def test_a_snapshot_reported_done_survives_a_power_cut_soak(tmp_path: Path, seed: int) -> None:
    snapshot_then_cut(tmp_path, seed)


def snapshot_then_cut(tmp_path: Path, seed: int) -> None:
    world = tmp_path / "world"  # the simulator's root: the source, the copy and their parent's entries
    data, dest = world / "data", world / "snap"
    contents = contents_of.fill(data)
    with PowerCut(world, seed=seed) as cut:
        service = start(data)
        more_work(service, contents, seed + 1, durable=False)  # made durable by the snapshot's flush
        snapshots.take(dest, service.store, service.broker)
        at_snapshot = copy.deepcopy(contents)
        more_work(service, contents, seed + 2, durable=True)  # the source goes on; the copy must not see it
        service.crash()
        cut.crash()
    report = shardmgr.verify(dest, deep=True)
    assert report.exit_code == 0, report.problems
    contents_of.check(dest, at_snapshot)
    contents_of.check(data, contents)


@pytest.mark.parametrize(("point", "seed"), list(itertools.product(CUTS, range(2))),
                         ids=lambda v: f"{v[0].rsplit('.', 1)[1]}-{v[1]}" if isinstance(v, tuple) else str(v))
def test_a_power_cut_during_a_snapshot_leaves_the_source_whole_and_no_half_copy(
        tmp_path: Path, point: tuple[str, int], seed: int) -> None:
    cut_during_snapshot(tmp_path, point, seed)


@pytest.mark.soak
@pytest.mark.parametrize(("point", "seed"), list(itertools.product(CUTS, range(2, 20))))
def test_a_power_cut_during_a_snapshot_soak(tmp_path: Path, point: tuple[str, int], seed: int) -> None:
    cut_during_snapshot(tmp_path, point, seed)


def cut_during_snapshot(tmp_path: Path, point: tuple[str, int], seed: int) -> None:
    world = tmp_path / "world"
    data, dest = world / "data", world / "snap"
    building = world / "snap.tmp"
    contents = contents_of.fill(data)
    with PowerCut(world, seed=seed) as cut:
        service = start(data)
        more_work(service, contents, seed + 1, durable=False)
        with _power_lost_at(*point), pytest.raises(PowerLost):
            snapshots.take(dest, service.store, service.broker)
        service.crash()
        cut.crash()
    assert shardmgr.verify(data, deep=True).exit_code <= 1  # at most what recovery finishes (torn tails)
    for place in (dest, building):
        if place.exists() and not (place / INCOMPLETE_NAME).exists():  # no mark: it must be whole
            report = shardmgr.verify(place, deep=True)
            assert report.exit_code == 0, (place, report.problems)
    if (building / INCOMPLETE_NAME).exists():
        with pytest.raises(IncompleteCopy):
            shardmgr.open(building)
    _snapshot_again(data, dest, building, contents)
    contents_of.check(data, contents)
    report = shardmgr.verify(data, deep=True)
    assert report.exit_code == 0, report.problems


def _snapshot_again(data: Path, dest: Path, building: Path, contents: Contents) -> None:
    """The same snapshot, offline: done, or refused for a clear reason (a whole copy is there already)."""
    unmarked = building.exists() and not (building / INCOMPLETE_NAME).exists()
    try:
        shardmgr.snapshot(data, dest)
    except CannotSnapshot as exc:
        assert dest.exists() or unmarked, exc
        assert ("exists: give a new path" if dest.exists() else "is not a snapshot cut short") in str(exc)
        place = dest if dest.exists() else building
    else:
        assert not building.exists()
        place = dest
    report = shardmgr.verify(place, deep=True)
    assert report.exit_code == 0, report.problems
    contents_of.check(place, contents)


@contextmanager
def _power_lost_at(target: str, n: int) -> Iterator[None]:
    """Lose the power at the ``n``-th call of ``target``: it raises PowerLost
    instead, and the snapshot's cleanup (which a cut would never run) is skipped."""
    module, name = target.rsplit(".", 1)
    real = getattr(__import__(module, fromlist=[name]), name)
    calls = itertools.count(1)

    def cut(*args: Any, **kwargs: Any) -> Any:
        if next(calls) == n:
            raise PowerLost(target)
        return real(*args, **kwargs)

    with mock.patch(target, side_effect=cut), mock.patch.object(snapshots, "_discard"):
        yield
