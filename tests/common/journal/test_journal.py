from __future__ import annotations

import errno
import hashlib
import os
import struct
import threading
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from common.journal import (
    CorruptJournal,
    Flusher,
    FlusherConfig,
    FlushFailed,
    FormatError,
    Journal,
    JournalConfig,
    JournalFull,
    JournalSealed,
    Marker,
    RecordTooLarge,
    WriteFailed,
)
from common.journal.header import HEADER_SIZE, SLOT_OFFSETS


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_append_read_and_reopen(tmp_path: Path, flusher: Flusher, journal: Journal) -> None:
    bodies = [os.urandom(n) for n in (0, 1, 7, 8, 9, 100, 5000)]
    offsets, ticket = journal.append_batch(bodies)
    journal.wait_durable(ticket, timeout=5)
    assert [journal.read(int(o)) for o in offsets] == bodies
    journal.close()
    again = Journal.open(tmp_path / "j", kind=b"TEST", flusher=flusher)
    assert again.metadata == b"meta" and again.count == len(bodies)
    assert [r.body for r in again.records()] == bodies
    assert again.recovery is not None and again.recovery.clean
    again.close()


def test_array_batch_and_marker_counters(journal: Journal) -> None:
    rows = np.random.default_rng(1).integers(0, 255, size=(1000, 24), dtype=np.uint8)
    offsets, _ = journal.append_batch(rows)
    assert journal.read(int(offsets[999])) == rows[999].tobytes()
    journal.set_markers(offsets[:10], Marker.RETIRED, expect=Marker.LIVE)
    journal.set_markers(offsets[10:12], Marker.BURIED)
    assert journal.counters[Marker.LIVE] == 988
    assert journal.counters[Marker.RETIRED] == 10 and journal.counters[Marker.BURIED] == 2
    assert journal.markers(offsets[:3]).tolist() == [Marker.RETIRED] * 3
    scanned = np.concatenate([c.markers for c in journal.scan()])
    assert (scanned == Marker.RETIRED).sum() == 10


def test_too_large_record_changes_nothing(tmp_path: Path, flusher: Flusher) -> None:
    j = Journal.create(tmp_path / "small", kind=b"TEST", flusher=flusher,
                       config=JournalConfig(max_record_bytes=100))
    with pytest.raises(RecordTooLarge):
        j.append_batch([b"ok", b"x" * 101])
    assert j.count == 0 and j.end == HEADER_SIZE
    j.close()


def test_capacity_refuses_appends_that_do_not_fit(tmp_path: Path, flusher: Flusher) -> None:
    j = Journal.create(tmp_path / "cap", kind=b"TEST", flusher=flusher,
                       config=JournalConfig(capacity_bytes=8192, extent_bytes=4096))
    j.append_batch([b"x" * 2000])
    with pytest.raises(JournalFull):
        j.append_batch([b"x" * 2100])
    j.append_batch([b"x" * 2000])
    assert j.count == 2 and os.path.getsize(tmp_path / "cap") <= 8192
    j.close()


def test_seal_then_open_in_constant_time(tmp_path: Path, flusher: Flusher, journal: Journal) -> None:
    offsets, _ = journal.append_batch([b"r"] * 100)
    journal.set_markers(offsets[:5], Marker.RETIRED)
    journal.seal()
    with pytest.raises(JournalSealed):
        journal.append(b"late")
    journal.set_markers(offsets[5:6], Marker.RETIRED)  # markers still change after sealing
    journal.close()
    assert os.path.getsize(tmp_path / "j") == journal.end
    with mock.patch("common.journal.journal.recover", side_effect=AssertionError("scanned")):
        sealed = Journal.open(tmp_path / "j", writable=False, recount=False)
    assert sealed.sealed and sealed.count == 100 and sealed.counters[Marker.RETIRED] == 6
    assert sealed.read(int(offsets[99])) == b"r"  # record access builds the anchors on demand
    sealed.close()
    recounted = Journal.open(tmp_path / "j", flusher=flusher)
    assert recounted.counters[Marker.RETIRED] == 6
    recounted.close()


def test_not_a_journal_and_wrong_kind(tmp_path: Path, flusher: Flusher, journal: Journal) -> None:
    (tmp_path / "junk").write_bytes(b"hello" * 1000)
    with pytest.raises(FormatError, match="bad magic"):
        Journal.open(tmp_path / "junk", flusher=flusher)
    with pytest.raises(FormatError, match="kind is b'TEST'"):
        Journal.open(tmp_path / "j", kind=b"WQSG", flusher=flusher)
    short = tmp_path / "short"
    short.write_bytes((tmp_path / "j").read_bytes()[:100])
    with pytest.raises(FormatError, match="shorter than"):
        Journal.open(short, writable=False)


def test_header_bit_flip_is_detected(tmp_path: Path, journal: Journal) -> None:
    journal.close()
    data = bytearray((tmp_path / "j").read_bytes())
    data[70] ^= 0x10  # inside the metadata
    (tmp_path / "j").write_bytes(data)
    with pytest.raises(FormatError, match="header checksum mismatch"):
        Journal.open(tmp_path / "j", writable=False)


def test_recovery_truncates_torn_tail_and_is_idempotent(tmp_path: Path, flusher: Flusher, journal: Journal) -> None:
    journal.append_batch([b"keep"] * 3)
    journal.close()
    path = tmp_path / "j"
    with open(path, "r+b") as f:
        f.seek(journal.end)
        f.write(b"\xb7" * 10 + os.urandom(100))
    j = Journal.open(path, flusher=flusher)
    assert j.count == 3 and j.recovery.tail_dirty and os.path.getsize(path) == j.end
    j.close()
    first = digest(path)
    j = Journal.open(path, flusher=flusher)
    assert j.recovery.clean and j.count == 3
    j.close()
    assert digest(path) == first


def test_recovery_drops_an_incomplete_batch(tmp_path: Path, flusher: Flusher, journal: Journal) -> None:
    journal.append_batch([b"first"])
    journal.flush(timeout=5)
    offsets, _ = journal.append_batch([b"a" * 30, b"b" * 30, b"c" * 30])
    journal.abandon()
    path = tmp_path / "j"
    with open(path, "r+b") as f:  # the batch's last record never reached the disk
        f.seek(int(offsets[2]))
        f.write(bytes(64))
    j = Journal.open(path, flusher=flusher)
    assert [r.body for r in j.records()] == [b"first"]
    assert j.recovery.dropped_records == 2
    j.close()


def test_damage_to_durable_records_raises_and_changes_nothing(tmp_path: Path, flusher: Flusher,
                                                             journal: Journal) -> None:
    offsets, _ = journal.append_batch([b"x" * 100] * 10)
    journal.close()
    path = tmp_path / "j"
    data = bytearray(path.read_bytes())
    data[int(offsets[4]) + 8] ^= 0x40  # a length bit of a durable record
    path.write_bytes(data)
    before = digest(path)
    with pytest.raises(CorruptJournal, match="flushed durable"):
        Journal.open(path, flusher=flusher)
    assert digest(path) == before


def test_readonly_open_changes_nothing(tmp_path: Path, flusher: Flusher, journal: Journal) -> None:
    journal.append_batch([b"a"] * 5)
    journal.abandon()
    path = tmp_path / "j"
    with open(path, "r+b") as f:
        f.seek(journal.end)
        f.write(b"garbage!" * 4)
    before = digest(path)
    ro = Journal.open(path, writable=False)
    assert ro.count == 5 and ro.recovery.tail_dirty
    with pytest.raises(Exception, match="read-only"):
        ro.append(b"no")
    ro.close()
    assert digest(path) == before


def test_fsync_failure_is_fatal_for_that_journal_only(tmp_path: Path, flusher: Flusher, journal: Journal) -> None:
    other = Journal.create(tmp_path / "other", kind=b"TEST", flusher=flusher)
    _, ok_ticket = journal.append(b"durable")
    journal.wait_durable(ok_ticket, timeout=5)
    real = os.fdatasync

    def failing(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(journal.path):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    with mock.patch("os.fdatasync", failing):
        _, ticket = journal.append(b"lost")
        with pytest.raises(FlushFailed, match="fdatasync failed"):
            journal.wait_durable(ticket, timeout=5)
        _, other_ticket = other.append(b"fine")
        other.wait_durable(other_ticket, timeout=5)
    assert not ticket.durable and ok_ticket.durable
    with pytest.raises(FlushFailed):  # never retried, never confirmed
        journal.wait_durable(ticket, timeout=1)
    with pytest.raises(FlushFailed):
        journal.append(b"more")
    assert flusher.stats.failures == 1
    other.close()


def test_failed_write_rolls_back_and_journal_stays_usable(tmp_path: Path, journal: Journal) -> None:
    journal.append_batch([b"before"])
    real = os.pwrite

    def short_then_full(fd: int, data: bytes, offset: int) -> int:
        if len(data) > 1000:
            real(fd, bytes(data)[:512], offset)  # part of the batch lands
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)

    with mock.patch("os.pwrite", short_then_full):
        with pytest.raises(WriteFailed, match="No space left") as info:
            journal.append_batch([b"y" * 600, b"z" * 600])
    assert info.value.errno == errno.ENOSPC
    assert journal.count == 1
    offsets, ticket = journal.append_batch([b"after"])
    journal.wait_durable(ticket, timeout=5)
    journal.close()
    with Journal.open(tmp_path / "j", writable=False) as j:
        assert [r.body for r in j.records()] == [b"before", b"after"]


def test_checkpoints_alternate_and_survive_a_torn_slot(tmp_path: Path, flusher: Flusher, journal: Journal) -> None:
    journal.append_batch([b"one"])
    journal.flush(timeout=5)
    journal.append_batch([b"two"])
    journal.flush(timeout=5)
    journal.close()
    path = tmp_path / "j"
    data = bytearray(path.read_bytes())
    gens = [struct.unpack_from("<Q", data, off)[0] for off in SLOT_OFFSETS]
    newest = SLOT_OFFSETS[gens.index(max(gens))]
    data[newest + 3] ^= 0xFF  # tear the newest checkpoint
    path.write_bytes(data)
    with Journal.open(path, writable=False) as j:
        assert [r.body for r in j.records()] == [b"one", b"two"]
        assert j.recovery.checkpoint.generation == min(gens)


def test_durable_wait_after_close_and_on_stopped_flusher(tmp_path: Path) -> None:
    f = Flusher().start()
    j = Journal.create(tmp_path / "k", kind=b"TEST", flusher=f)
    _, ticket = j.append(b"x")
    j.close()  # close flushes
    assert ticket.durable
    f.stop()
    with pytest.raises(ValueError, match="running Flusher"):
        Journal.open(tmp_path / "k", flusher=f)


def test_failed_append_never_resurfaces_after_a_power_cut(tmp_path: Path) -> None:
    from common.journal import FlusherConfig
    from common.journal.testing import PowerCut

    real_pwrite = os.pwrite
    for seed in range(12):
        d = tmp_path / str(seed)
        d.mkdir()
        flusher = Flusher(FlusherConfig(interval=3600)).start()
        with PowerCut(d, seed=seed) as cut:
            j = Journal.create(d / "j", kind=b"TEST", flusher=flusher)
            j.append_batch([b"first" * 10])
            j.flush(timeout=5)

            def write_sync_fail(fd: int, data: bytes, offset: int) -> int:
                real_pwrite(fd, data, offset)  # batch A lands whole ...
                os.fdatasync(fd)  # ... a flush or writeback makes it durable ...
                raise OSError(errno.ENOSPC, "No space left on device")  # ... and the append fails

            with mock.patch("os.pwrite", write_sync_fail), pytest.raises(WriteFailed):
                j.append_batch([b"A" * 500, b"A" * 500])
            j.append_batch([b"b" * 100, b"b" * 100, b"b" * 100])  # reuses A's offsets, not flushed
            flusher.stop(flush=False)
            cut.crash()
            j.abandon()
        with Journal.open(d / "j", writable=False) as again:
            bodies = [r.body for r in again.records()]
        assert bodies in ([b"first" * 10], [b"first" * 10] + [b"b" * 100] * 3), bodies


def test_writable_reopen_of_a_sealed_journal_recounts(tmp_path: Path) -> None:
    from common.journal import FlusherConfig

    flusher = Flusher(FlusherConfig(interval=3600)).start()  # no round runs unless asked
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=flusher)
    offsets, _ = journal.append_batch([b"r"] * 10)
    journal.seal()
    journal.set_markers(offsets[:4], Marker.RETIRED)  # not flushed: the checkpoint still says LIVE
    journal.abandon()
    again = Journal.open(tmp_path / "j", flusher=flusher, recount=False)
    assert again.counters[Marker.RETIRED] == 4  # writable opens always recount from the markers
    again.set_markers(offsets[:4], Marker.BURIED, expect=Marker.RETIRED)
    again.flush(timeout=5)
    assert again.counters[Marker.BURIED] == 4 and again.counters[Marker.RETIRED] == 0
    again.close()
    flusher.stop()


def test_fdatasync_failure_during_open_is_reported(tmp_path: Path, flusher: Flusher, journal: Journal) -> None:
    journal.append_batch([b"x"])
    journal.abandon()
    fds_before = len(os.listdir("/proc/self/fd"))
    real = os.fdatasync

    def failing(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}") == str(tmp_path / "j"):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    with mock.patch("os.fdatasync", failing), pytest.raises(FlushFailed):
        Journal.open(tmp_path / "j", flusher=flusher)
    assert len(os.listdir("/proc/self/fd")) == fds_before


def test_prefix_fields_and_flusher_listener(tmp_path: Path, flusher: Flusher, journal: Journal) -> None:
    rounds: list[int] = []
    flusher.add_listener(lambda: rounds.append(1))
    prefix = np.zeros((3, 16), dtype=np.uint8)
    prefix.view("<u8")[:, 0] = [11, 22, 33]
    prefix.view("<u8")[:, 1] = [2**63, 5, 6]
    offsets, ticket = journal.append_batch([b"x", b"", b"yy"], prefix=prefix)
    journal.wait_durable(ticket, timeout=5)
    chunk = next(iter(journal.scan()))
    assert journal.fields(chunk, 0, "<u8").tolist() == [11, 22, 33]
    assert journal.fields(chunk, 8, "<u8").tolist() == [2**63, 5, 6]
    assert journal.fields(chunk, 16, "|u1").tolist() == [ord("x"), 0, ord("y")]  # 0 where too short
    assert journal.read(int(offsets[2])) == bytes(prefix[2]) + b"yy"
    assert rounds, "the listener was not called after a round that synced"


def test_open_with_a_limit_drops_unconfirmed_tail_records_only(tmp_path: Path) -> None:
    from common.journal import FlusherConfig

    flusher = Flusher(FlusherConfig(interval=3600)).start()
    j = Journal.create(tmp_path / "t", kind=b"TEST", flusher=flusher)
    first, _ = j.append_batch([b"a", b"b"])
    j.flush(timeout=5)
    second, _ = j.append_batch([b"c", b"d"], marker=Marker.BURIED)
    j.abandon()  # the second batch was never flushed
    with pytest.raises(CorruptJournal, match="flushed durable"):
        Journal.open(tmp_path / "t", flusher=flusher, limit=int(first[1]))
    j = Journal.open(tmp_path / "t", flusher=flusher, limit=int(second[0]))
    assert j.count == 2 and j.counters[Marker.BURIED] == 0 and j.end == int(second[0])
    assert os.path.getsize(tmp_path / "t") == j.end
    third, _ = j.append_batch([b"e"])
    assert third[0] == second[0]
    j.close()
    with Journal.open(tmp_path / "t", writable=False) as again:
        assert [r.body for r in again.records()] == [b"a", b"b", b"e"]
    flusher.stop()


def test_companion_files_are_synced_with_the_journal_before_anything_is_confirmed(tmp_path: Path,
                                                                                 flusher: Flusher) -> None:
    """The companion and the journal are synced at once (the journal on a
    helper thread); the write is confirmed only once both have returned."""
    j = Journal.create(tmp_path / "j2", kind=b"TEST", flusher=flusher)
    data_fd = os.open(tmp_path / "data", os.O_RDWR | os.O_CREAT, 0o644)
    j.add_companion(data_fd)
    spans: dict[str, tuple[float, float, str]] = {}
    real = os.fdatasync

    def slow(fd: int) -> None:
        name, started = os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), time.monotonic()
        time.sleep(0.05 if name == "data" else 0.2)  # a round that does not wait for the journal fails below
        assert not ticket.durable, "confirmed before every file of its sync was durable"
        real(fd)
        spans[name] = (started, time.monotonic(), threading.current_thread().name)

    os.pwrite(data_fd, b"payload", 0)
    _, ticket = j.append(b"describes the payload")
    with mock.patch("os.fdatasync", slow):
        j.wait_durable(ticket, timeout=5)
    assert ticket.durable and set(spans) == {"data", "j2"}
    (data_start, data_end, data_thread), (j_start, j_end, j_thread) = spans["data"], spans["j2"]
    assert data_thread != j_thread and j_start < data_end and data_start < j_end  # at once
    j.close()
    os.close(data_fd)


@pytest.mark.parametrize("failing_file", ["data", "j3"])
def test_a_failed_companion_or_journal_sync_confirms_nothing(tmp_path: Path, flusher: Flusher,
                                                             failing_file: str) -> None:
    j = Journal.create(tmp_path / "j3", kind=b"TEST", flusher=flusher)
    data_fd = os.open(tmp_path / "data", os.O_RDWR | os.O_CREAT, 0o644)
    j.add_companion(data_fd)
    real = os.fdatasync

    def failing(fd: int) -> None:
        if os.path.basename(os.readlink(f"/proc/self/fd/{fd}")) == failing_file:
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    _, ticket = j.append(b"x")
    with mock.patch("os.fdatasync", failing), pytest.raises(FlushFailed, match="fdatasync failed"):
        j.wait_durable(ticket, timeout=5)
    assert not ticket.durable
    j.abandon()
    os.close(data_fd)



def test_a_forked_child_syncs_companions_on_threads_of_its_own(tmp_path: Path, flusher: Flusher) -> None:
    """The helper threads that sync a journal beside its companions are not
    inherited by fork: a child that appends and waits for durability must
    not wait forever on the parent's pool (it gets its own)."""
    parent = Journal.create(tmp_path / "parent", kind=b"TEST", flusher=flusher)
    data_fd = os.open(tmp_path / "parent-data", os.O_RDWR | os.O_CREAT, 0o644)
    parent.add_companion(data_fd)
    parent.wait_durable(parent.append(b"the parent's pool exists now")[1], timeout=5)
    pid = os.fork()
    if pid == 0:  # the child: its own flusher and journal, as a forked worker would open them
        code = 1
        try:
            with Flusher(FlusherConfig(interval=0.002)) as child_flusher:
                child = Journal.create(tmp_path / "child", kind=b"TEST", flusher=child_flusher)
                fd = os.open(tmp_path / "child-data", os.O_RDWR | os.O_CREAT, 0o644)
                child.add_companion(fd)
                child.wait_durable(child.append(b"x")[1], timeout=5)
                child.close()
                code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child's durable append did not finish in 20 s")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    parent.close()
    os.close(data_fd)
