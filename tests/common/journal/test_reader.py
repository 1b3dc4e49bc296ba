"""Reading records (common/journal/reader.py): readers racing appends never
see a body cut short, and the few-records paths of fields() and bodies()
agree with the vectorised ones, damage included."""

from __future__ import annotations

import threading
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

from common.journal import CorruptJournal, Flusher, Journal, JournalConfig, Marker, reader
from common.journal.scan import RecordChunk


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


def test_record_at_reads_one_record_by_its_marker(journal: Journal) -> None:
    offsets = journal.append_batch([b"alpha", b"", b"gamma" * 50]).offsets.tolist()
    journal.set_markers([offsets[1]], Marker.RETIRED)
    assert [None if b is None else bytes(b) for b in (journal.record_at(o, Marker.LIVE) for o in offsets)] == [
        b"alpha", None, b"gamma" * 50]
    retired = journal.record_at(offsets[1], Marker.RETIRED)
    assert retired is not None and bytes(retired) == b""
    assert journal.record_at(journal.end, Marker.LIVE) is None  # the end of the records: nothing there
    with open(journal.path, "r+b") as f:  # a body byte flipped: the live record is refused, naming it
        f.seek(offsets[2] + 16 + 7)
        f.write(b"X")
    with pytest.raises(CorruptJournal, match=f"at byte {offsets[2]}"):
        journal.record_at(offsets[2], Marker.LIVE)
    journal.set_markers([offsets[2]], Marker.BURIED)
    assert journal.record_at(offsets[2], Marker.LIVE) is None  # buried: its marker is read, its body never


def test_head_at_reads_a_records_marker_and_first_body_bytes(journal: Journal) -> None:
    offsets = journal.append_batch([b"0123456789", b"abc"]).offsets.tolist()
    journal.set_markers([offsets[1]], Marker.RETIRED)
    assert journal.head_at(offsets[0], 4) == (int(Marker.LIVE), b"0123")
    assert journal.head_at(offsets[1], 3) == (int(Marker.RETIRED), b"abc")
    with pytest.raises(ValueError, match="not within the records"):
        journal.head_at(journal.end, 1)  # past the end: refused, nothing read
