"""The byte layer of the wire (common/wire/framing.py), without a socket
server: frames round-trip whatever the chunking of the stream, and bytes
that break the rules are refused with the documented error."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.wire import frame_reader, framing
from common.wire.budget import ByteBudget
from common.wire.errors import BadFrame, FrameTimeout, FrameTooLarge
from common.wire.frame_reader import FrameReader

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
    reader = FrameReader(Stream(data, chunks))
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
        FrameReader(Stream(data, []), max_frame_bytes=100).read()


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
        FrameReader(Stream(damage(head, body), [])).read()


def test_a_stream_cut_inside_a_frame_is_a_connection_error() -> None:
    data = frame_bytes({"id": 1, "cmd": "echo"}, {"x": np.arange(10, dtype="<u8")})
    with pytest.raises(ConnectionError):
        FrameReader(Stream(data[:-3], [])).read()


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
    frame = FrameReader(Stream(frame_bytes({"id": 1}, parts), [])).read()
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


def _reference_encode(header: dict[str, Any], parts: dict[str, np.ndarray]) -> bytes:
    """The frame encoding as first written (one view per part, nothing joined): encode must give its bytes."""
    buffers: list[bytes] = []
    specs, size = [], 0
    for name, array in parts.items():
        array = np.asarray(array, order="C")
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
        specs.append([name, dtype.str, list(array.shape)])
        pad = -size % framing.PART_ALIGN
        buffers.append(bytes(pad))
        data = array.astype(dtype, copy=False).reshape(-1).data.cast("B")
        buffers.append(bytes(data))
        size += pad + data.nbytes
    head = msgpack.packb({**header, "parts": specs} if parts else header)
    return struct.pack("<II", len(head) + size, len(head)) + head + b"".join(buffers)


def _layouts(array: np.ndarray, layout: int) -> np.ndarray:
    """The same values as big-endian, non-contiguous or reversed arrays."""
    if layout == 1 and array.dtype.itemsize > 1:
        return array.astype(array.dtype.newbyteorder(">"))
    if layout == 2 and array.ndim:
        return np.repeat(array, 2, axis=0)[::2]
    if layout == 3 and array.ndim > 1:
        return np.ascontiguousarray(array.T).T
    return array


@given(header=headers, parts=st.dictionaries(st.text(min_size=1, max_size=8),
                                             st.tuples(arrays, st.integers(0, 3)), max_size=5),
       joined=st.integers(0, 1 << 12), small=st.integers(0, 64))
def test_encode_gives_the_first_encoding_s_bytes_joined_or_not(header: dict[str, Any],
                                                               parts: dict[str, tuple[np.ndarray, int]],
                                                               joined: int, small: int) -> None:
    arrays_ = {name: _layouts(array, layout) for name, (array, layout) in parts.items()}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(framing, "JOINED_FRAME_BYTES", joined)
        patch.setattr(framing, "SMALL_PART_BYTES", small)
        buffers = framing.encode(header, arrays_)
    data = b"".join(bytes(b) for b in buffers)
    assert data == _reference_encode(header, arrays_)
    if len(data) <= joined:
        assert len(buffers) == 1


@given(keys=st.sampled_from([0, 1, 14, 15, 16, 40]), count=st.sampled_from([1, 15, 16, framing.MAX_PARTS]),
       shape=st.lists(st.integers(0, 3), max_size=3).map(tuple), with_parts_key=st.booleans())
def test_encode_packs_part_specs_once_and_gives_the_same_header_bytes_whatever_its_size(
        keys: int, count: int, shape: tuple[int, ...], with_parts_key: bool) -> None:
    """The header's map made one entry longer around specs packed once (framing._header_with_parts),
    across msgpack's size classes: maps of up to 15 entries and more, arrays of up to 15 specs and more,
    a header that already has a "parts" key (replaced, as {**header, "parts": ...} does)."""
    header: dict[str, Any] = {"id": 7, **{f"k{i}": i for i in range(keys)}}
    if with_parts_key:
        header["parts"] = "replaced"
    parts = {f"p{i}": np.zeros(shape, np.uint32) for i in range(count)}
    for _ in range(2):  # packed, then from the cache
        assert frame_bytes(header, parts) == _reference_encode(header, parts)


@given(parts=st.dictionaries(st.text(min_size=1, max_size=8), arrays, max_size=5), writable=st.booleans())
def test_decoded_parts_are_views_like_frombuffer_s(parts: dict[str, np.ndarray], writable: bool) -> None:
    data = frame_bytes({"id": 1}, parts)
    head_size = struct.unpack_from("<I", data, 4)[0]
    frame = bytearray(data[8:]) if writable else data[8:]
    header = msgpack.unpackb(bytes(frame[:head_size]))
    body = memoryview(frame)[head_size:]
    decoded = framing.decode_parts(header.get("parts", []), body)
    for name, array in parts.items():
        got = decoded[name]
        assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array)
        assert got.flags.writeable == writable and not got.flags.owndata


def test_small_frames_are_one_buffer_and_large_parts_are_not_copied() -> None:
    small = framing.encode({"id": 1}, {"a": np.arange(3, dtype="<u8"), "b": np.zeros(5, np.uint8)})
    assert len(small) == 1
    large = np.zeros(framing.JOINED_FRAME_BYTES, np.uint8)
    buffers = framing.encode({"id": 1}, {"a": np.arange(3, dtype="<u8"), "big": large})
    assert len(buffers) == 3 and np.shares_memory(np.asarray(buffers[-1]), large)


# ------------------------------------------------ memory budget and frame deadline


def test_large_frames_grow_as_they_arrive_and_round_trip() -> None:
    """Frames past the read buffer, and past the first step (they are then
    copied as their memory doubles), arrive intact however the stream is cut."""
    budget = ByteBudget(1 << 30)
    for n in (frame_reader.READ_BUFFER_BYTES + 1, 100_000, frame_reader.FIRST_STEP_BYTES * 2 + 12_345):
        body = np.random.default_rng(n).integers(0, 255, n, dtype=np.uint8)
        data = frame_bytes({"id": n}, {"b": body}) + frame_bytes({"id": 2})
        reader = FrameReader(Stream(data, [5000, 1 << 20, 7]), budget=budget)
        frame = reader.read()
        assert frame is not None and frame.header == {"id": n} and np.array_equal(frame.parts["b"], body)
        assert 0 < budget.used <= frame.size  # held until released
        reader.release()
        assert budget.used == 0
        frame = reader.read()
        assert frame is not None and frame.header == {"id": 2}
    assert budget.stats()["inflight_peak_bytes"] <= 2 * (frame_reader.FIRST_STEP_BYTES * 2 + 12_400)


def test_declared_but_unsent_bytes_are_not_charged() -> None:
    """A peer that declares a 200 MiB frame and sends 1 MiB of it holds one
    first step of the budget, not 200 MiB; when it goes away, nothing."""
    budget = ByteBudget(1 << 30)
    ours, theirs = socket.socketpair()
    header = msgpack.packb({"id": 1, "parts": [["b", "|u1", [200 << 20]]]})
    _send_soon(theirs, struct.pack("<II", len(header) + (200 << 20), len(header)) + header + bytes(1 << 20))
    reader = FrameReader(ours, budget=budget, frame_timeout_s=60)
    errors: list[BaseException] = []
    thread = threading.Thread(target=lambda: _catch(reader.read, errors))
    thread.start()
    _wait_for(lambda: budget.used > 0)
    assert budget.used == frame_reader.FIRST_STEP_BYTES
    theirs.close()
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], ConnectionError)
    assert budget.used == 0
    ours.close()


def test_a_frame_that_stalls_times_out_but_idle_time_between_frames_does_not() -> None:
    ours, theirs = socket.socketpair()
    reader = FrameReader(ours, frame_timeout_s=0.2)
    frames: list[framing.Frame | None] = []
    thread = threading.Thread(target=lambda: frames.append(reader.read()))
    thread.start()
    time.sleep(0.5)  # idle between frames, longer than frame_timeout_s
    theirs.sendall(frame_bytes({"id": 1}))
    thread.join(30)
    assert frames and frames[0] is not None and frames[0].header == {"id": 1}
    theirs.sendall(frame_bytes({"id": 2})[:5])  # part of a head, then nothing
    with pytest.raises(FrameTimeout, match="8-byte head did not arrive within frame_timeout_s=0.2 s"):
        reader.read()
    ours.close()
    theirs.close()


def test_a_large_frame_that_stalls_times_out_and_gives_its_budget_back() -> None:
    budget = ByteBudget(1 << 30)
    ours, theirs = socket.socketpair()
    data = frame_bytes({"id": 1}, {"b": np.zeros(1 << 20, np.uint8)})
    _send_soon(theirs, data[:len(data) // 2])
    reader = FrameReader(ours, budget=budget, frame_timeout_s=0.2)
    with pytest.raises(FrameTimeout, match=f"frame of {len(data) - 8} bytes did not arrive"):
        reader.read()
    assert budget.used == 0
    ours.close()
    theirs.close()


def test_a_frame_that_gets_no_budget_within_its_deadline_times_out() -> None:
    budget = ByteBudget(4 << 20)
    budget.acquire(4 << 20)  # every byte held by other connections
    ours, theirs = socket.socketpair()
    _send_soon(theirs, frame_bytes({"id": 1}, {"b": np.zeros(1 << 20, np.uint8)}))
    reader = FrameReader(ours, budget=budget, frame_timeout_s=0.2)
    with pytest.raises(FrameTimeout, match="no memory for a frame .* hold 4194304 of the 4194304 bytes"):
        reader.read()
    budget.release(4 << 20)
    assert budget.used == 0
    ours.close()
    theirs.close()


def _send_soon(sock: socket.socket, data: bytes) -> None:
    """Send from another thread: a socket pair holds less than ``data``."""

    def send() -> None:
        with contextlib.suppress(OSError):  # the reader closed its end
            sock.sendall(data)

    threading.Thread(target=send, daemon=True).start()


def _catch(call: Any, errors: list[BaseException]) -> None:
    try:
        call()
    except BaseException as exc:
        errors.append(exc)


def _wait_for(condition: Any) -> None:
    for _ in range(1000):
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached")


def test_a_header_map_with_a_key_that_is_not_a_string_is_refused() -> None:
    """msgpack's strict_map_key (its default since 1.0, which decode relies on)."""
    data = frame_bytes({"id": 1, "args": {7: "x"}})
    with pytest.raises(BadFrame, match="not valid msgpack"):
        FrameReader(Stream(data, [])).read()
