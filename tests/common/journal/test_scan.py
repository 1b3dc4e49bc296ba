"""The vectorised walk against a plain one-record-at-a-time reference."""

from __future__ import annotations

import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from common.journal.header import HEADER_SIZE
from common.journal.marker import MARKER_VALUES, Marker
from common.journal.record import encode_batch
from common.journal.scan import END, INVALID, SEQ, Walk


def reference_walk(buf: bytes, start: int, stop: int, align: int, seq: int, max_len: int) -> tuple[list[int], int]:
    """Follow the chain one record at a time; return offsets and stop position."""
    offsets, pos = [], start
    while pos + 16 <= stop:
        marker, _crc, length_word, rec_seq = struct.unpack_from("<IIII", buf, pos)
        length = length_word & (2**28 - 1)
        padded = (16 + length + align - 1) // align * align
        if (marker not in MARKER_VALUES or length_word & (0x7 << 28) or length > max_len
                or pos + padded > stop or rec_seq != seq % 2**32):
            break
        offsets.append(pos)
        seq += 1
        pos += (16 + length + align - 1) // align * align
    return offsets, pos


def walk_all(buf: bytes, align: int, window: int, max_len: int = 2**20,
             few_first: bool = True) -> tuple[list[int], Walk]:
    arr = np.frombuffer(buf, dtype=np.uint8)
    walk = Walk(arr, start=HEADER_SIZE, stop=len(buf), alignment=align, first_seq=0, max_record_bytes=max_len,
                window=window, few_first=few_first)
    chunks = list(walk)
    offsets = [o for chunk in chunks for o in chunk.offsets.tolist()]
    for chunk in chunks:  # what each record's header says, as the walk reports it
        for i, off in enumerate(chunk.offsets.tolist()):
            marker, _crc, word, seq = struct.unpack_from("<IIII", buf, off)
            assert (int(chunk.markers[i]), int(chunk.lengths[i])) == (marker, word & (2**28 - 1))
            assert bool(chunk.continues[i]) == bool(word >> 31)
            assert seq == (chunk.first_seq + i) % 2**32
    return offsets, walk


def journal_bytes(bodies: list[bytes], align: int, tail: bytes = b"") -> bytes:
    batch = encode_batch(bodies, first_seq=0, alignment=align)
    return bytes(HEADER_SIZE) + bytes(batch.data) + tail


def damage_then_compare(buf: bytearray, damage: list[tuple[int, int]], align: int, window: int,
                        max_len: int, cut: int) -> None:
    """Overwrite bytes past the header and cut the tail, then walk both ways:
    same records, same stop."""
    for pos, value in damage:
        if HEADER_SIZE + pos < len(buf):
            buf[HEADER_SIZE + pos] = value
    data = bytes(buf[:max(HEADER_SIZE, len(buf) - cut)])
    expected, expected_stop = reference_walk(data, HEADER_SIZE, len(data), align, 0, max_len)
    reasons = set()
    for few_first in (True, False):  # the plain first step and the vectorised one agree
        offsets, walk = walk_all(data, align, window, max_len, few_first)
        assert offsets == expected
        assert walk.position == expected_stop
        reasons.add(walk.reason)
    assert len(reasons) == 1


def test_walk_finds_every_record_and_stops_at_end() -> None:
    buf = journal_bytes([bytes([i]) * (i * 7) for i in range(200)], 8)
    offsets, walk = walk_all(buf, 8, window=4096)
    assert offsets == reference_walk(buf, HEADER_SIZE, len(buf), 8, 0, 2**20)[0]
    assert len(offsets) == 200 and walk.reason == END and walk.position == len(buf)


def test_walk_skips_impostor_headers_inside_bodies() -> None:
    inner = bytes(encode_batch([b"fake"] * 3, first_seq=1, alignment=8).data)
    bodies = [b"x" * 8, inner, inner, b"y", inner + inner]
    buf = journal_bytes(bodies, 8)
    offsets, walk = walk_all(buf, 8, window=1 << 20)
    assert len(offsets) == 5 and walk.reason == END


def test_walk_stops_at_zero_tail_and_at_garbage() -> None:
    buf = journal_bytes([b"a" * 40] * 10, 8, tail=bytes(4096))
    offsets, walk = walk_all(buf, 8, window=1 << 20)
    assert len(offsets) == 10 and walk.reason == INVALID
    garbage = journal_bytes([b"a" * 40] * 10, 8, tail=b"\xb7" * 64)
    assert len(walk_all(garbage, 8, window=1 << 20)[0]) == 10


def test_walk_stops_at_a_wrong_seq() -> None:
    first = bytes(encode_batch([b"a"] * 3, first_seq=0, alignment=8).data)
    again = bytes(encode_batch([b"b"] * 3, first_seq=0, alignment=8).data)  # seq restarts: stale data
    buf = bytes(HEADER_SIZE) + first + again
    offsets, walk = walk_all(buf, 8, window=1 << 20)
    assert len(offsets) == 3 and walk.reason == SEQ and walk.position == HEADER_SIZE + len(first)


def test_record_longer_than_the_window() -> None:
    buf = journal_bytes([b"z" * 10_000, b"q", b"w" * 5000], 64)
    offsets, walk = walk_all(buf, 64, window=128)
    assert len(offsets) == 3 and walk.reason == END


@settings(max_examples=300)
@given(
    lengths=st.lists(st.integers(0, 300), min_size=0, max_size=40),
    align=st.sampled_from([8, 16, 64]),
    window=st.sampled_from([64, 512, 4096, 1 << 20]),
    damage=st.lists(st.tuples(st.integers(0, 20_000), st.integers(0, 255)), max_size=4),
    impostors=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    max_len=st.sampled_from([50, 150, 2**20]),
    cut=st.sampled_from([0, 0, 1, 3, 7, 100]),
)
def test_vectorised_walk_equals_reference(lengths: list[int], align: int, window: int,
                                          damage: list[tuple[int, int]], impostors: bool, seed: int,
                                          max_len: int, cut: int) -> None:
    rng = np.random.default_rng(seed)
    fake = bytes(encode_batch([b"i" * 9] * 2, first_seq=int(rng.integers(0, 40)), alignment=align,
                              marker=Marker.RETIRED).data)
    bodies = [(fake if impostors and i % 3 == 0 else b"") + rng.bytes(n) for i, n in enumerate(lengths)]
    damage_then_compare(bytearray(journal_bytes(bodies, align, tail=rng.bytes(int(rng.integers(0, 64))))),
                        damage, align, window, max_len, cut)


@settings(max_examples=300)
@given(
    runs=st.lists(st.tuples(st.integers(0, 200), st.integers(1, 60)), min_size=1, max_size=6),
    align=st.sampled_from([8, 64]),
    window=st.sampled_from([256, 4096, 1 << 20]),
    damage=st.lists(st.tuples(st.integers(0, 40_000), st.integers(0, 255)), max_size=3),
    seed=st.integers(0, 2**32 - 1),
    max_len=st.sampled_from([50, 150, 2**20]),
    cut=st.sampled_from([0, 0, 1, 3, 7, 100]),
)
def test_galloping_over_equal_sized_runs_equals_reference(runs: list[tuple[int, int]], align: int, window: int,
                                                          damage: list[tuple[int, int]], seed: int,
                                                          max_len: int, cut: int) -> None:
    rng = np.random.default_rng(seed)
    bodies = [rng.bytes(length) for length, repeat in runs for _ in range(repeat)]
    damage_then_compare(bytearray(journal_bytes(bodies, align)), damage, align, window, max_len, cut)


def test_reserved_length_flags_end_the_chain_in_both_paths() -> None:
    for lengths in ([40] * 50, [i % 37 for i in range(50)]):  # galloping run, mixed sizes
        batch = encode_batch([bytes(n) for n in lengths], first_seq=0, alignment=8)
        buf = bytearray(bytes(HEADER_SIZE) + bytes(batch.data))
        victim = HEADER_SIZE + int(batch.offsets[30])
        buf[victim + 11] |= 0x10  # bit 28 of the length word
        offsets, walk = walk_all(bytes(buf), 8, window=1 << 20)
        assert len(offsets) == 30 and walk.position == victim and walk.reason == INVALID
