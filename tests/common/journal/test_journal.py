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
    FlushFailed,
    FormatError,
    Journal,
    JournalConfig,
    JournalFull,
    JournalSealed,
    Marker,
    MarkerConflict,
    RecordNotFound,
    RecordTooLarge,
    WriteFailed,
    reader,
)
from common.journal.header import HEADER_SIZE, SLOT_OFFSETS
from common.journal.scan import RecordChunk


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def journal(tmp_path: Path, flusher: Flusher) -> Journal:
    j = Journal.create(tmp_path / "j", kind=b"TEST", flusher=flusher, metadata=b"meta")
    yield j
    j.close()


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


def test_marker_change_writes_exactly_four_bytes(tmp_path: Path, journal: Journal) -> None:
    offsets, _ = journal.append_batch([b"a" * 50, b"b" * 50])
    journal.flush(timeout=5)
    before = (tmp_path / "j").read_bytes()
    journal.set_markers([offsets[1]], Marker.RETIRED)
    after = (tmp_path / "j").read_bytes()
    diff = [i for i in range(HEADER_SIZE, len(before)) if before[i] != after[i]]
    assert diff and min(diff) >= offsets[1] and max(diff) < offsets[1] + 4


def test_conditional_marker_change_is_all_or_nothing(journal: Journal) -> None:
    offsets, _ = journal.append_batch([b"x"] * 4)
    journal.set_markers(offsets[2:3], Marker.RETIRED)
    with pytest.raises(MarkerConflict, match="1 of 4 records are not LIVE") as info:
        journal.set_markers(offsets, Marker.DELIVERED, expect=Marker.LIVE)
    assert info.value.offsets == [int(offsets[2])]
    assert journal.markers(offsets).tolist() == [Marker.LIVE, Marker.LIVE, Marker.RETIRED, Marker.LIVE]


def test_bad_offsets_are_refused_and_change_nothing(tmp_path: Path, journal: Journal) -> None:
    offsets, _ = journal.append_batch([b"\xb7" * 64])
    journal.flush(timeout=5)
    before = digest(tmp_path / "j")
    for bad in (0, 12, int(offsets[0]) + 4, int(offsets[0]) + 16, journal.end, 10**9, -8):
        with pytest.raises(RecordNotFound):
            journal.set_markers([int(offsets[0]), bad], Marker.RETIRED)
        with pytest.raises(RecordNotFound):
            journal.read(bad)
    assert digest(tmp_path / "j") == before
    assert journal.counters[Marker.LIVE] == 1


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


def test_offsets_inside_bodies_are_refused_even_with_a_forged_header(tmp_path: Path, journal: Journal) -> None:
    from common.journal.record import encode_batch

    forged = bytes(encode_batch([b"forged body"], first_seq=1, alignment=8).data)
    offsets, _ = journal.append_batch([b"x" * 40, b"p" * 8 + forged * 3, b"tail"])
    journal.flush(timeout=5)
    inner = int(offsets[1]) + 16 + 8  # where a forged record image starts (8-aligned)
    assert (tmp_path / "j").read_bytes()[inner:inner + 16] == forged[:16]
    before = digest(tmp_path / "j")
    with pytest.raises(RecordNotFound, match="inside another record"):
        journal.read(inner)
    with pytest.raises(RecordNotFound, match="inside another record"):
        journal.set_markers([int(offsets[0]), inner], Marker.RETIRED)
    assert digest(tmp_path / "j") == before and journal.counters[Marker.LIVE] == 3


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


def test_concurrent_readers_never_see_short_bodies(tmp_path: Path, flusher: Flusher) -> None:
    j = Journal.create(tmp_path / "race", kind=b"TEST", flusher=flusher, config=JournalConfig(extent_bytes=4096))
    stop = threading.Event()
    problems: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            for rec in j.records():
                if rec.body != bytes([rec.body[0]]) * 3000 if rec.body else True:
                    problems.append(f"bad body at {rec.offset}: {len(rec.body)} bytes")

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for i in range(300):
        j.append_batch([bytes([i % 256]) * 3000])
    stop.set()
    for t in threads:
        t.join()
    j.close()
    assert not problems, problems[:3]


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


def whole_chunk(journal: Journal, count: int) -> RecordChunk:
    """Every record as one chunk (a scan's first step stops after SMALL_BATCH records)."""
    parts = list(journal.scan())
    chunk = RecordChunk(*(np.concatenate([getattr(c, f) for c in parts])
                          for f in ("offsets", "markers", "lengths", "continues")), 0)
    assert len(chunk) == count
    return chunk


@pytest.mark.parametrize("dtype", ["<u8", "<u4", "<i8", "|u1", "<u2"])
def test_fields_of_a_few_records_agree_with_the_vectorised_gather(journal: Journal, dtype: str) -> None:
    rng = np.random.default_rng(7)
    bodies = [rng.bytes(int(n)) for n in rng.integers(0, 40, size=12)]
    journal.append_batch(bodies)
    chunk = whole_chunk(journal, 12)
    for at in (0, 3, 8, 17, 30):
        for part in (slice(0, 1), slice(2, 7), slice(4, 12)):
            few = journal.fields(chunk[part], at, dtype)
            with mock.patch.object(reader, "SMALL_BATCH", 0):
                many = journal.fields(chunk[part], at, dtype)
            assert few.dtype == many.dtype and few.tolist() == many.tolist(), (at, part)


def test_bodies_of_a_few_records_agree_with_the_vectorised_read(tmp_path: Path, journal: Journal) -> None:
    rng = np.random.default_rng(11)
    bodies = [rng.bytes(int(n)) for n in rng.integers(0, 90, size=12)]
    offsets = journal.append_batch(bodies).offsets.tolist()
    chunk = whole_chunk(journal, 12)
    for skip in (0, 3, 40):
        for part in (slice(0, 1), slice(2, 7), slice(4, 12)):
            few = [bytes(b) for b in journal.bodies(chunk[part], skip)]
            with mock.patch.object(reader, "SMALL_BATCH", 0):
                many = [bytes(b) for b in journal.bodies(chunk[part], skip)]
            assert few == many == [b[skip:] for b in bodies[part]], (skip, part)
    with open(journal.path, "r+b") as f:  # one body byte flipped: both paths name that record
        f.seek(offsets[5] + 16)
        byte = f.read(1)
        f.seek(offsets[5] + 16)
        f.write(bytes([byte[0] ^ 0x40]))
    errors = []
    for small in (8, 0):
        with mock.patch.object(reader, "SMALL_BATCH", small), pytest.raises(CorruptJournal) as caught:
            journal.bodies(chunk[4:9])
        errors.append(str(caught.value))
    assert errors[0] == errors[1] and str(offsets[5]) in errors[0]
