"""Checking one journal offline (common/check.py): each rule, its severity
and offset, and the offline repairs of bytes outside the checksums."""

from __future__ import annotations

from pathlib import Path

import pytest

from common.journal import Flusher, Journal, JournalConfig, Marker
from common.journal.check import Severity, check_journal, zero_record_padding
from common.journal.header import HEADER_SIZE, SLOT_OFFSETS, read_checkpoints


def make(path: Path, flusher: Flusher, bodies: list[bytes], *, seal: bool) -> list[int]:
    journal = Journal.create(path, kind=b"TEST", flusher=flusher, config=JournalConfig(extent_bytes=4096))
    offsets = journal.append_batch(bodies).offsets.tolist()
    journal.set_markers(offsets[:2], Marker.RETIRED)
    journal.seal() if seal else journal.flush()
    journal.close()
    return offsets


def found(path: Path, deep: bool = True, kind: bytes | None = b"TEST") -> list[tuple[Severity, str, int | None]]:
    check = check_journal(path, kind=kind, deep=deep)
    check.close()
    return [(p.severity, p.what, p.offset) for p in check.problems]


def poke(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


BODIES = [b"abc", b"defgh" * 3, b"x" * 100, b"yz"]


@pytest.mark.parametrize("seal", [True, False])
def test_a_clean_journal_has_no_problems(tmp_path: Path, flusher: Flusher, seal: bool) -> None:
    make(tmp_path / "j", flusher, BODIES, seal=seal)
    assert found(tmp_path / "j") == [] and found(tmp_path / "j", deep=False) == []


def test_the_header_and_its_kind(tmp_path: Path, flusher: Flusher) -> None:
    path = tmp_path / "j"
    make(path, flusher, BODIES, seal=True)
    assert found(path, kind=b"ELSE") == [(Severity.CORRUPT, "kind", 12)]
    poke(path, 100, b"\x01")  # metadata: under the header checksum
    assert found(path)[0][:2] == (Severity.CORRUPT, "header")


def test_slots_and_padding_are_repairable(tmp_path: Path, flusher: Flusher) -> None:
    path = tmp_path / "j"
    make(path, flusher, BODIES, seal=True)
    slots = read_checkpoints(path.read_bytes()[:HEADER_SIZE])
    older = min(range(2), key=lambda i: slots[i].generation if slots[i] else -1)  # the newest says what is sealed
    poke(path, SLOT_OFFSETS[older] + 9, b"\xff")
    poke(path, 3000, b"\x01")
    assert sorted(found(path, deep=False)) == [(Severity.REPAIRABLE, "checkpoint_slot", SLOT_OFFSETS[older]),
                                              (Severity.REPAIRABLE, "header_padding", 3000)]


def test_record_padding_is_found_deep_and_zeroed_by_repair(tmp_path: Path, flusher: Flusher) -> None:
    path = tmp_path / "j"
    offsets = make(path, flusher, BODIES, seal=True)
    poke(path, offsets[0] + 16 + 3, b"\x07")  # the first record's padding (3-byte body, 8-byte alignment)
    assert found(path, deep=False) == []  # outside every checksum: only the deep run reads records
    assert found(path) == [(Severity.REPAIRABLE, "record_padding", offsets[0])]
    assert zero_record_padding(path) == 1
    assert found(path) == []


def test_a_flipped_body_bit_is_corrupt_at_its_record(tmp_path: Path, flusher: Flusher) -> None:
    path = tmp_path / "j"
    offsets = make(path, flusher, BODIES, seal=True)
    poke(path, offsets[2] + 16 + 50, b"!")
    assert found(path, deep=False) == []  # sealed: O(1), no record read
    assert found(path) == [(Severity.CORRUPT, "checksum", offsets[2])]


def test_a_flipped_marker_is_corrupt(tmp_path: Path, flusher: Flusher) -> None:
    path = tmp_path / "j"
    offsets = make(path, flusher, BODIES, seal=False)
    poke(path, offsets[1], b"\x00")
    assert [(s, w) for s, w, _ in found(path)] == [(Severity.CORRUPT, "records")]


def test_tails(tmp_path: Path, flusher: Flusher) -> None:
    sealed, open_ = tmp_path / "sealed", tmp_path / "open"
    make(sealed, flusher, BODIES, seal=True)
    make(open_, flusher, BODIES, seal=False)
    end = sealed.stat().st_size
    with open(sealed, "ab") as f:
        f.write(b"junk")
    assert found(sealed, deep=False) == [(Severity.REPAIRABLE, "sealed_tail", end)]
    poke(open_, HEADER_SIZE + 4000, b"\x01")  # in the preallocated zeros after the records
    [(severity, what, _)] = found(open_, deep=False)
    assert (severity, what) == (Severity.REPAIRABLE, "torn_tail")
    with open(sealed, "r+b") as f:
        f.truncate(end - 8)
    assert found(sealed, deep=False) == [(Severity.CORRUPT, "sealed_size", end - 8)]


def test_records_a_checkpoint_confirmed_are_corrupt_when_cut(tmp_path: Path, flusher: Flusher) -> None:
    path = tmp_path / "j"
    offsets = make(path, flusher, BODIES, seal=False)
    with open(path, "r+b") as f:
        f.truncate(offsets[3])
    [(severity, what, _)] = found(path)
    assert (severity, what) == (Severity.CORRUPT, "records")


@pytest.mark.parametrize("alignment", [8, 64, 512])
def test_zero_record_padding_rewrites_exactly_the_padding(tmp_path: Path, flusher: Flusher, alignment: int) -> None:
    path = tmp_path / "j"
    bodies = [b"a" * n for n in (0, 1, 7, 8, 9, 47, 48, 100, 495, 496, 1000)]
    journal = Journal.create(path, kind=b"TEST", flusher=flusher, config=JournalConfig(alignment=alignment))
    offsets = journal.append_batch(bodies).offsets.tolist()
    journal.seal()
    journal.close()
    clean = path.read_bytes()
    padded = 0
    for offset, body in zip(offsets, bodies):  # the layout of record.py, spelled out: 16-byte header, body, padding
        start = offset + 16 + len(body)
        end = -(-start // alignment) * alignment
        poke(path, start, b"\xee" * (end - start))
        padded += end > start
    assert zero_record_padding(path) == padded
    assert path.read_bytes() == clean  # every padding byte zeroed, no body byte touched
