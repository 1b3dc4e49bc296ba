from __future__ import annotations

import struct
from collections.abc import Callable
from unittest import mock

import crc32c
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.journal import record
from common.journal.errors import RecordNotFound, RecordTooLarge
from common.journal.header import HEADER_SIZE
from common.journal.marker import MARKER_TAG, MARKER_VALUES, Marker
from common.journal.record import (
    BATCH_CONTINUES,
    LENGTH_MASK,
    RECORD_HEADER_SIZE,
    SMALL_BATCH,
    check_record,
    encode_batch,
)


def test_marker_codewords_are_far_apart_and_tagged() -> None:
    values = [int(v) for v in MARKER_VALUES]
    assert 0 not in values
    for v in values:
        assert v >> 24 == MARKER_TAG
    for i, a in enumerate(values):
        for b in values[i + 1:]:
            assert bin(a ^ b).count("1") >= 12, (hex(a), hex(b))


def test_encode_batch_layout_is_byte_exact() -> None:
    batch = encode_batch([b"abc", b"", b"0123456789"], first_seq=7, alignment=8)
    assert batch.offsets.tolist() == [0, 24, 40]
    assert len(batch.data) == 40 + 32
    data = bytes(batch.data)
    marker, crc, length_word, seq = struct.unpack_from("<IIII", data, 0)
    assert marker == Marker.LIVE
    assert length_word == 3 | BATCH_CONTINUES
    assert seq == 7
    assert crc == crc32c.crc32c(data[8:16 + 3])
    assert data[16:19] == b"abc" and data[19:24] == bytes(5)
    _, _, length_word, seq = struct.unpack_from("<IIII", data, 40)
    assert length_word == 10 and seq == 9  # the last record closes the batch


def test_encode_fixed_width_array_matches_list_encoding() -> None:
    rows = np.arange(60, dtype=np.uint8).reshape(5, 12)
    as_array = encode_batch(rows, first_seq=0, alignment=16, marker=Marker.BURIED)
    as_list = encode_batch([r.tobytes() for r in rows], first_seq=0, alignment=16, marker=Marker.BURIED)
    assert bytes(as_array.data) == bytes(as_list.data)


def test_seq_wraps_modulo_2_32() -> None:
    batch = encode_batch([b"a", b"b"], first_seq=2**32 - 1, alignment=8)
    assert [struct.unpack_from("<I", batch.data, int(o) + 12)[0] for o in batch.offsets] == [2**32 - 1, 0]


def test_too_large_body_is_refused_naming_it() -> None:
    with pytest.raises(RecordTooLarge, match="body 1 of the batch has 11 bytes"):
        encode_batch([b"ok", b"x" * 11], first_seq=0, alignment=8, max_record_bytes=10)


def test_check_record_rejects_each_broken_rule() -> None:
    data = bytearray(encode_batch([b"hello world"], first_seq=0, alignment=8).data)
    end = len(data)
    assert check_record(data, 0, end, 8).length == 11
    with pytest.raises(RecordNotFound, match="aligned"):
        check_record(data, 4, end, 8)
    with pytest.raises(RecordNotFound, match="fit"):
        check_record(data, 0, RECORD_HEADER_SIZE + 5, 8)
    flipped = bytearray(data)
    flipped[20] ^= 1
    with pytest.raises(RecordNotFound, match="checksum mismatch"):
        check_record(flipped, 0, end, 8)
    bad_marker = bytearray(data)
    bad_marker[0] ^= 1
    with pytest.raises(RecordNotFound, match="not a valid marker"):
        check_record(bad_marker, 0, end, 8)
    assert LENGTH_MASK == 2**28 - 1


def test_prefix_is_placed_before_each_body() -> None:
    prefix = np.arange(30, dtype=np.uint8).reshape(3, 10)
    with_prefix = encode_batch([b"a", b"bb", b""], first_seq=0, alignment=8, prefix=prefix)
    joined = encode_batch([bytes(prefix[0]) + b"a", bytes(prefix[1]) + b"bb", bytes(prefix[2])],
                          first_seq=0, alignment=8)
    assert bytes(with_prefix.data) == bytes(joined.data)
    rows = np.full((3, 5), 7, dtype=np.uint8)
    assert bytes(encode_batch(rows, first_seq=0, alignment=8, prefix=prefix).data) == bytes(
        encode_batch([bytes(prefix[i]) + bytes(rows[i]) for i in range(3)], first_seq=0, alignment=8).data)


# ------------------------------------------------ small batches: plain-int paths

bodies_strategy = st.lists(st.binary(max_size=40), min_size=1, max_size=SMALL_BATCH)


@settings(max_examples=200, deadline=None)
@given(bodies=bodies_strategy, first_seq=st.integers(0, 2**32 + 5), alignment=st.sampled_from([8, 16, 64]),
       width=st.integers(0, 24), marker=st.sampled_from(list(Marker)))
def test_small_batches_encode_exactly_as_the_vectorised_path(bodies: list[bytes], first_seq: int, alignment: int,
                                                             width: int, marker: Marker) -> None:
    prefix = np.arange(len(bodies) * width, dtype=np.uint8).reshape(len(bodies), width) if width else None
    few = record._encode_few(bodies, first_seq, alignment, LENGTH_MASK, marker, prefix)
    many = record._encode_many(bodies, first_seq, alignment, LENGTH_MASK, marker, prefix)
    assert bytes(few.data) == bytes(many.data)
    if prefix is not None:  # the same rows given as bytes, on both paths
        rows = prefix.tobytes()
        few_rows = record._encode_few(bodies, first_seq, alignment, LENGTH_MASK, marker, rows)
        assert bytes(few_rows.data) == bytes(many.data)
        big, k = bodies * (SMALL_BATCH + 1), SMALL_BATCH + 1
        tiled = record._encode_many(big, first_seq, alignment, LENGTH_MASK, marker, np.concatenate([prefix] * k))
        assert bytes(encode_batch(big, first_seq=first_seq, alignment=alignment, marker=marker,
                                  prefix=rows * k).data) == bytes(tiled.data)
    assert few.offsets.tolist() == many.offsets.tolist() and few.markers.tolist() == many.markers.tolist()
    assert few.offsets.dtype == many.offsets.dtype and few.markers.dtype == many.markers.dtype
    plain = record._encode_many(bodies, first_seq, alignment, LENGTH_MASK, marker, None).offsets.tolist()
    for at in (0, 4096, 2**40):  # offsets counted from where the batch will be written, on both paths
        few_at = encode_batch(bodies, first_seq=first_seq, alignment=alignment, marker=marker, start=at)
        many_at = encode_batch(bodies * (SMALL_BATCH + 1), first_seq=first_seq, alignment=alignment, marker=marker,
                               start=at)
        assert few_at.offsets.tolist() == [at + o for o in plain]
        assert many_at.offsets[:len(bodies)].tolist() == few_at.offsets.tolist()


def test_small_batches_refuse_what_the_vectorised_path_refuses() -> None:
    for encode in (record._encode_few, record._encode_many):
        with pytest.raises(RecordTooLarge, match="body 1 of the batch has 11 bytes; the limit is 10"):
            encode([b"ok", b"x" * 11], 0, 8, 10, Marker.LIVE, None)
        with pytest.raises(ValueError, match="prefix must be uint8"):
            encode([b"a"], 0, 8, LENGTH_MASK, Marker.LIVE, np.zeros((2, 3), dtype=np.uint8))
    for bodies in ([b"a", b"b"], [b"a", b"b"] * SMALL_BATCH):  # a bytes prefix, on the few and the vectorised path
        with pytest.raises(ValueError, match="rows of equal width"):
            encode_batch(bodies, first_seq=0, alignment=8, prefix=b"xyz")


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_locating_a_few_offsets_agrees_with_the_vectorised_check(data: st.DataObject) -> None:
    batch = encode_batch([b"x" * n for n in data.draw(st.lists(st.integers(0, 30), min_size=1, max_size=12))],
                         first_seq=0, alignment=8)
    image = np.zeros(HEADER_SIZE + len(batch.data) + 64, dtype=np.uint8)
    image[HEADER_SIZE:HEADER_SIZE + len(batch.data)] = np.frombuffer(bytes(batch.data), dtype=np.uint8)
    words, end = image.view("<u4"), HEADER_SIZE + len(batch.data)
    starts = (batch.offsets + HEADER_SIZE).tolist()
    anywhere = st.integers(0, len(image)) | st.sampled_from(starts)
    offsets = data.draw(st.lists(anywhere, min_size=1, max_size=SMALL_BATCH))

    def outcome(locate: Callable[[], object]) -> object:
        try:
            return np.asarray(locate()).tolist()
        except RecordNotFound as exc:
            return str(exc)

    def vectorised() -> object:
        with mock.patch.object(record, "SMALL_BATCH", 0):
            return record.locate_records(words, offsets, end, 8)[1]

    assert outcome(lambda: record.locate_few(words.data, offsets, end, 8)) == outcome(vectorised)
