"""A received frame's parts (common/wire/part_views.py): the arrays, the ints
and the bytes it gives are those of the encoded arrays, and a request's plain
reads refuse what its array read refuses, with the same message."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.wire import framing, part_views
from common.wire.component import Request
from common.wire.errors import BadRequest
from common.wire.part_views import FEW_INTS, PartViews

INT_DTYPES = sorted(code for code in framing.DTYPES if code[1] in "ui")

int_arrays = st.builds(
    lambda dtype, shape, seed: np.random.default_rng(seed).integers(
        np.iinfo(dtype).min, np.iinfo(dtype).max, size=shape, dtype=np.dtype(dtype), endpoint=True),
    st.sampled_from(INT_DTYPES),
    st.one_of(st.just((1,)), st.lists(st.integers(0, FEW_INTS + 3), min_size=1, max_size=1).map(tuple),
              st.lists(st.integers(0, 4), max_size=3).map(tuple)),
    st.integers(0, 2**32 - 1))


def received(parts: dict[str, np.ndarray]) -> PartViews:
    """``parts`` encoded into a frame, then decoded as the server and the clients do."""
    data = b"".join(bytes(b) for b in framing.encode({"id": 1}, parts))
    head_size = struct.unpack_from("<I", data, 4)[0]
    frame = memoryview(data[8:])
    views = framing.decode_parts(msgpack.unpackb(bytes(frame[:head_size])).get("parts", []), frame[head_size:])
    assert isinstance(views, PartViews)
    return views


@given(parts=st.dictionaries(st.text(min_size=1, max_size=8), int_arrays, max_size=5))
def test_ints_views_and_arrays_are_the_encoded_arrays(parts: dict[str, np.ndarray]) -> None:
    views = received(parts)
    assert len(views) == len(parts) and list(views) == list(parts) and dict(views).keys() == parts.keys()
    for name, array in parts.items():
        assert name in views and views.code(name) == framing.dtype_code(array.dtype)
        assert views.shape(name) == array.shape
        assert views.ints(name) == array.ravel().tolist() == part_views.ints(parts, name)
        assert bytes(views.view(name)) == array.tobytes() == bytes(part_views.view(parts, name))
        got = views[name]
        assert got.dtype == array.dtype and got.shape == array.shape and np.array_equal(got, array)
        assert views[name] is got  # made once
    assert views.get("absent") is None and "absent" not in views


def test_a_part_that_is_not_of_integers_has_no_ints() -> None:
    views = received({"x": np.zeros(2, "<f4")})
    with pytest.raises(TypeError, match="'x' has dtype <f4, not integers"):
        views.ints("x")


class Nobody:
    def respond(self, header: dict[str, Any], parts: Any, on_sent: Any) -> None:
        raise AssertionError("not answered here")


def request(parts: dict[str, np.ndarray], received_frame: bool) -> Request:
    return Request(1, "cmd", {}, received(parts) if received_frame else parts, Nobody())


@pytest.mark.parametrize("received_frame", [True, False])
def test_a_requests_plain_reads_give_what_its_array_reads_give(received_frame: bool) -> None:
    handles, data = np.array([7, 2**63 + 5], "<u8"), np.frombuffer(b"payload", np.uint8)
    r = request({"handles": handles, "data": data}, received_frame)
    assert r.part_ints("handles", "<u8") == handles.tolist() == r.part("handles", "<u8").tolist()
    assert r.part_ints("handles", ("<u4", "<u8")) == handles.tolist()
    assert bytes(r.part_view("data")) == b"payload" == r.part("data", "|u1", 1).tobytes()


@pytest.mark.parametrize("received_frame", [True, False])
def test_a_requests_plain_reads_refuse_what_its_array_reads_refuse(received_frame: bool) -> None:
    r = request({"h": np.zeros((2, 2), "<u8"), "f": np.zeros(3, "<u4")}, received_frame)
    cases = [(lambda: r.part_ints("absent", "<u8"), lambda: r.part("absent", "<u8", 1)),
             (lambda: r.part_ints("h", "<u8"), lambda: r.part("h", "<u8", 1)),
             (lambda: r.part_ints("f", ("<u8", "<i8")), lambda: r.part("f", ("<u8", "<i8"), 1)),
             (lambda: r.part_view("f"), lambda: r.part("f", "|u1", 1)),
             (lambda: r.part_view("h"), lambda: r.part("h", "|u1", 1))]
    for plain, array in cases:
        with pytest.raises(BadRequest) as by_array:
            array()
        with pytest.raises(BadRequest, match=f"^{by_array.value.message}$".replace("(", r"\(").replace(")", r"\)")):
            plain()
