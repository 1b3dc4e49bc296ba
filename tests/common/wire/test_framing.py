"""The byte layer of the wire (common/wire/framing.py), without a socket
server: frames round-trip whatever the chunking of the stream, and bytes
that break the rules are refused with the documented error."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.wire import framing
from common.wire.errors import BadFrame, FrameTooLarge

DTYPES = sorted(framing.DTYPES)


class Stream:
    """A socket's receiving side that hands out ``data`` in chunks of the given sizes."""

    def __init__(self, data: bytes, chunks: list[int]) -> None:
        self._data = memoryview(data)
        self._chunks = chunks or [len(data) or 1]
        self._turn = 0

    def recv_into(self, buffer: Any) -> int:
        size = self._chunks[self._turn % len(self._chunks)]
        self._turn += 1
        n = min(size, len(buffer), len(self._data))
        buffer[:n] = self._data[:n]
        self._data = self._data[n:]
        return n


def frame_bytes(header: dict[str, Any], parts: dict[str, np.ndarray] | None = None) -> bytes:
    return b"".join(bytes(b) for b in framing.encode(header, parts))


arrays = st.builds(
    lambda dtype, shape, seed: np.random.default_rng(seed).integers(0, 255, size=shape).astype(dtype),
    st.sampled_from(DTYPES), st.lists(st.integers(0, 5), max_size=3).map(tuple), st.integers(0, 2**32 - 1))
int64s = st.integers(-2**63, 2**63 - 1)
headers = st.fixed_dictionaries({"id": st.integers(0, 2**62), "cmd": st.text(max_size=20)},
                                optional={"args": st.dictionaries(st.text(max_size=8), int64s, max_size=4)})


@given(frames=st.lists(st.tuples(headers, st.dictionaries(st.text(min_size=1, max_size=8), arrays, max_size=4)),
                       min_size=1, max_size=5),
       chunks=st.lists(st.integers(1, 300), max_size=6))
def test_frames_round_trip_however_the_stream_is_cut(frames: list[tuple[dict[str, Any], dict[str, np.ndarray]]],
                                                      chunks: list[int]) -> None:
    data = b"".join(frame_bytes(h, p) for h, p in frames)
    reader = framing.FrameReader(Stream(data, chunks))
    for header, parts in frames:
        frame = reader.read()
        assert frame is not None and frame.header == header
        assert list(frame.parts) == list(parts)
        for name, array in parts.items():
            assert frame.parts[name].dtype == array.dtype
            assert np.array_equal(frame.parts[name], array)
    assert reader.read() is None  # a clean end between frames


def test_a_frame_larger_than_the_limit_is_refused_before_its_body() -> None:
    data = frame_bytes({"id": 1, "cmd": "echo"}, {"x": np.zeros(1000, np.uint8)})
    with pytest.raises(FrameTooLarge):
        framing.FrameReader(Stream(data, []), max_frame_bytes=100).read()


@pytest.mark.parametrize("damage, error", [
    (lambda head, body: struct.pack("<II", len(head) + len(body), 0) + head + body, BadFrame),  # header size 0
    (lambda head, body: struct.pack("<II", 4, 9) + b"\x81\xa1x\x01", BadFrame),  # header larger than the frame
    (lambda head, body: struct.pack("<II", 3, 3) + b"\xc1\xc1\xc1", BadFrame),  # not msgpack
    (lambda head, body: struct.pack("<II", 2, 2) + b"\x92\x01", BadFrame),  # msgpack, not a map
    (lambda head, body: struct.pack("<II", len(head) + len(body) - 8, len(head)) + head + body[:-8],
     BadFrame),  # a part runs past the body
    (lambda head, body: struct.pack("<II", len(head) + len(body) + 8, len(head)) + head + body + bytes(8),
     BadFrame),  # body bytes no part describes
])
def test_broken_frames_are_refused(damage: Any, error: type[Exception]) -> None:
    head = msgpack.packb({"id": 1, "cmd": "echo", "parts": [["x", "<u8", [2]]]})
    body = np.arange(2, dtype="<u8").tobytes()
    with pytest.raises(error):
        framing.FrameReader(Stream(damage(head, body), [])).read()


def test_a_stream_cut_inside_a_frame_is_a_connection_error() -> None:
    data = frame_bytes({"id": 1, "cmd": "echo"}, {"x": np.arange(10, dtype="<u8")})
    with pytest.raises(ConnectionError):
        framing.FrameReader(Stream(data[:-3], [])).read()


def test_part_specs_are_checked() -> None:
    body = memoryview(bytes(16))
    for bad in (["x", "<u8", [2]], [["x", "object", [1]]], [["x", "<u8", [-1]]], [["x", "<u8", [True]]], "parts"):
        with pytest.raises(BadFrame):
            framing.decode_parts(bad, body)
    assert framing.decode_parts([["x", "<u8", [2]]], body)["x"].tolist() == [0, 0]


def test_a_preamble_from_another_protocol_is_refused() -> None:
    assert framing.parse_preamble(framing.preamble()) == framing.PROTOCOL_VERSION
    with pytest.raises(BadFrame, match="magic"):
        framing.parse_preamble(b"HTTP/1.1")


def test_empty_and_zero_dimensional_arrays_keep_their_shape() -> None:
    parts = {"empty": np.zeros((0, 768), "<f4"), "scalar": np.array(7, "<i8"), "none": np.zeros(0, "<u8")}
    frame = framing.FrameReader(Stream(frame_bytes({"id": 1}, parts), [])).read()
    assert frame is not None
    assert {k: (v.shape, v.dtype.str) for k, v in frame.parts.items()} == \
        {k: (v.shape, v.dtype.str) for k, v in parts.items()}
    assert int(frame.parts["scalar"]) == 7


@pytest.mark.parametrize("specs, body, problem", [
    ([["a", "<u8", [1]], ["a", "<u8", [1]]], bytes(16), "appears twice"),
    ([["x", "|u1", [1] * (framing.MAX_RANK + 1)]], bytes(1), "at most 8 dims"),
    ([["x", "|u1", [1] * 100]], bytes(1), "at most 8 dims"),  # numpy stops at 64: this was a ValueError
    ([[f"p{i}", "|u1", [0]] for i in range(framing.MAX_PARTS + 1)], b"", "at most 64 parts"),
    ([["", "|u1", [0]]], b"", "name of 1-64"),
    ([["x" * (framing.MAX_PART_NAME + 1), "|u1", [0]]], b"", "name of 1-64"),
])
def test_part_limits_are_refused_as_bad_frames(specs: list[Any], body: bytes, problem: str) -> None:
    with pytest.raises(BadFrame, match=problem):
        framing.decode_parts(specs, memoryview(body))


def test_the_limits_themselves_are_accepted_and_encode_refuses_what_decode_would() -> None:
    specs = [[f"p{i}", "|u1", [1] * framing.MAX_RANK] for i in range(framing.MAX_PARTS)]
    parts = framing.decode_parts(specs, memoryview(b"".join(b"\x07" + bytes(7) for _ in specs)[:-7]))
    assert len(parts) == framing.MAX_PARTS and parts["p0"].ndim == framing.MAX_RANK
    with pytest.raises(ValueError, match="at most 8 dimensions"):
        framing.encode({"id": 1}, {"x": np.zeros([1] * (framing.MAX_RANK + 1), np.uint8)})
    with pytest.raises(ValueError, match="at most 64 parts"):
        framing.encode({"id": 1}, {f"p{i}": np.zeros(1, np.uint8) for i in range(framing.MAX_PARTS + 1)})
