"""The wire encodings (workq/protocol.py): their few-item paths (arrays of
a few items, or one item's body packed from ints) put exactly the bytes on
the wire that the general (numpy) paths give, results and errors alike."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.wire import framing
from common.wire.errors import BadRequest
from workq import protocol
from workq.protocol import COMPLETED, DUPLICATE, Key, Leased


def _general(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with the few-item paths off."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(protocol, "SMALL_BATCH", -1)
        return _outcome(fn, *args)


def _outcome(fn: Any, *args: Any) -> Any:
    try:
        return ("ok", fn(*args))
    except BadRequest as exc:
        return ("error", str(exc))


def _wire(reply: tuple[dict[str, Any], framing.Body]) -> bytes:
    """The bytes of a response frame carrying ``reply``."""
    return b"".join(bytes(b) for b in framing.encode({"id": 7, "ok": reply[0]}, reply[1]))


def _received(reply: tuple[dict[str, Any], framing.Body]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """``reply`` as the client decodes it from the wire."""
    data = _wire(reply)
    _, header_size = framing.FRAME_HEAD.unpack_from(data)
    frame = framing.decode(memoryview(data)[framing.FRAME_HEAD.size:], header_size)
    return frame.header["ok"], frame.parts


def _same_parts(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert np.array_equal(a[name], b[name]), name


lengths_dtypes = st.sampled_from(protocol.LENGTH_DTYPES)


@given(sizes=st.lists(st.integers(0, 40), max_size=protocol.SMALL_BATCH), dtype=lengths_dtypes,
       damage=st.sampled_from([None, "negative", "huge", "short", "long", "wrap"]))
def test_split_of_a_few_matches_the_general_split(sizes: list[int], dtype: str, damage: str | None) -> None:
    data = np.arange(sum(sizes), dtype=np.uint64).astype(np.uint8)
    lengths = list(sizes)
    if damage == "negative" and lengths and dtype[1] == "i":
        lengths[0] = -1
    elif damage == "huge" and lengths:
        lengths[-1] = np.iinfo(dtype).max
    elif damage == "short" and data.nbytes:
        data = data[:-1]
    elif damage == "long":
        data = np.concatenate([data, np.zeros(1, np.uint8)])
    elif damage == "wrap" and dtype[2] == "8" and len(lengths) >= 2:
        lengths[:2] = [2**63, 2**63] if dtype[1] == "u" else [2**62] * 2  # sums that wrap (or not) to 0 or 2**63
        data = data[:0]
    array = np.array(lengths, dtype=dtype)
    few = _outcome(protocol.split, data, array)
    general = _general(protocol.split, data, array)
    if few[0] == "ok":
        assert general[0] == "ok" and [bytes(p) for p in few[1]] == [bytes(p) for p in general[1]]
        assert b"".join(bytes(p) for p in few[1]) == data.tobytes()
    else:
        assert general == few


def test_lengths_whose_sum_wraps_are_refused() -> None:
    """numpy sums wrap around: lengths past the data's size are refused before they are added."""
    for dtype, lengths in (("<u8", [2**63, 2**63]), ("<i8", [2**62] * 4), ("<u8", [2**63] * 20)):
        args = (np.zeros(0, np.uint8), np.array(lengths, dtype=dtype))
        assert _outcome(protocol.split, *args)[0] == "error"
        assert _general(protocol.split, *args)[0] == "error"


payload_lists = st.lists(st.binary(max_size=30), max_size=protocol.SMALL_BATCH + 2)


@given(payloads=payload_lists)
def test_joined_round_trips_and_one_payload_is_joined_like_many(payloads: list[bytes]) -> None:
    parts = protocol.joined([memoryview(p) for p in payloads])
    assert parts["lengths"].dtype == np.uint32 and parts["data"].dtype == np.uint8
    assert [bytes(p) for p in protocol.split(parts["data"], parts["lengths"])] == payloads
    general: dict[str, np.ndarray] = {"data": np.frombuffer(b"".join(payloads), dtype=np.uint8),
                                      "lengths": np.array([len(p) for p in payloads], dtype=np.uint32)}
    _same_parts(parts, general)


def _leased(count: int, job: str = "job", lane: str | int = 1, seed: int = 0) -> Leased:
    rng = np.random.default_rng(seed)
    return Leased(Key("m", "s", lane), job, rng.integers(0, 2**63, count, dtype=np.uint64).tolist(),
                  rng.integers(0, 2**40, count, dtype=np.uint64).tolist(),
                  rng.integers(1, 9, count, dtype=np.uint32).tolist(),
                  [memoryview(bytes(rng.integers(0, 255, int(n), dtype=np.uint8)))
                   for n in rng.integers(0, 20, count)])


@given(counts=st.lists(st.integers(0, protocol.SMALL_BATCH + 2), max_size=3), seed=st.integers(0, 1000))
def test_encode_lease_of_a_few_matches_the_general_encoding(counts: list[int], seed: int) -> None:
    batches = [_leased(n, f"job{i % 2}", lane=i, seed=seed + i) for i, n in enumerate(counts)]
    few = protocol.encode_lease(batches)
    general = _general(protocol.encode_lease, batches)[1]
    assert few[0] == general[0] and _wire(few) == _wire(general)
    _same_parts(_received(few)[1], general[1])
    items = protocol.decode_lease(*_received(few))
    assert [i.handle.packed for i in items] == [h for b in batches for h in b.handles]


@given(statuses=st.lists(st.sampled_from([COMPLETED, DUPLICATE]), max_size=protocol.SMALL_BATCH + 2))
def test_encode_statuses_of_a_few_matches_the_general_encoding(statuses: list[str]) -> None:
    few = protocol.encode_statuses(statuses)
    general = _general(protocol.encode_statuses, statuses)[1]
    assert few[0] == general[0] and type(few[0]["completed"]) is int and _wire(few) == _wire(general)
    _same_parts(_received(few)[1], general[1])
    assert protocol.decode_statuses(_received(few)[1]) == statuses


@given(statuses=st.lists(st.sampled_from([COMPLETED, DUPLICATE]), min_size=1, max_size=protocol.SMALL_BATCH + 2),
       counts=st.lists(st.integers(0, 3), min_size=1, max_size=2), seed=st.integers(0, 1000))
def test_encode_statuses_and_lease_matches_the_general_encoding(statuses: list[str], counts: list[int],
                                                                 seed: int) -> None:
    """A complete that leased: one status and one item packed from ints, or any other mix as arrays."""
    batches = [_leased(n, f"job{i}", lane=i, seed=seed + i) for i, n in enumerate(counts)]
    few = protocol.encode_statuses_and_lease((statuses, batches))
    general = _general(protocol.encode_statuses_and_lease, (statuses, batches))[1]
    assert few[0] == general[0] and _wire(few) == _wire(general)
    result, parts = _received(few)
    assert protocol.decode_statuses(parts) == statuses
    assert [i.payload for i in protocol.decode_lease(result, parts)] == [bytes(p) for b in batches for p in b.payloads]


def test_a_packed_body_is_refused_with_too_many_parts() -> None:
    spec = framing.part_spec("p", "|u1", (0,))
    with pytest.raises(ValueError, match="at most"):
        framing.encode({"id": 1}, framing.Packed([spec] * (framing.MAX_PARTS + 1), b""))
    for name, code, shape in (("", "|u1", (1,)), ("p", "<c8", (1,)), ("p", "|u1", (1,) * (framing.MAX_RANK + 1))):
        with pytest.raises(ValueError, match="frames carry"):
            framing.part_spec(name, code, shape)


@given(segment=st.integers(0, (1 << 32) - 1),
       offsets=st.lists(st.integers(0, (1 << 32) - 1).map(lambda u: u * protocol.OFFSET_UNIT),
                        max_size=protocol.SMALL_BATCH + 2))
def test_pack_of_a_few_matches_the_general_pack(segment: int, offsets: list[int]) -> None:
    column = np.array(offsets, dtype=np.int64)
    few, general = _outcome(protocol.pack, segment, column), _general(protocol.pack, segment, column)
    assert few[1].dtype == general[1].dtype == np.uint64
    assert few[1].tolist() == general[1].tolist()
    assert protocol.unpack(few[1])[1].tolist() == offsets


pairs = st.one_of(
    st.tuples(st.integers(0, (1 << 32) - 1), st.integers(0, (1 << 35) - 1)),  # in range (any offset: floored)
    st.tuples(st.integers(-(1 << 40), 1 << 40), st.integers(-(1 << 40), 1 << 40)),  # some out of range
    st.builds(lambda s, o: protocol.Handle(s, o), st.integers(0, (1 << 32) - 1),
              st.integers(0, (1 << 32) - 1).map(lambda u: u * protocol.OFFSET_UNIT)))


@given(handles=st.lists(pairs, max_size=protocol.SMALL_BATCH + 2))
def test_pack_handles_of_a_few_matches_the_general_pack(handles: list[tuple[int, int]]) -> None:
    def outcome(general: bool) -> tuple[str, Any]:
        try:
            packed = _general(protocol.pack_handles, handles) if general else \
                _outcome(protocol.pack_handles, handles)
        except (OverflowError, ValueError, TypeError) as exc:  # what numpy says of what it cannot pack
            return "raised", type(exc)
        return packed[0], packed[1].tolist() if packed[0] == "ok" else packed[1]

    few, general = outcome(False), outcome(True)
    assert few == general
    if few[0] == "ok":
        assert protocol.pack_handles(handles).dtype == np.uint64
