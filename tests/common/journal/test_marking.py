"""Marker changes (common/journal/marking.py): only the 4 marker bytes are
written, conditional changes are all or nothing, and an offset that is not a
record start (structurally, or by the record chain) changes nothing."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from common.journal import Journal, Marker, MarkerConflict, RecordNotFound
from common.journal.header import HEADER_SIZE


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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


