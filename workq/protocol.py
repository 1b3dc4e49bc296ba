"""What crosses the wire between the queue and its clients, defined once.

The service (service.py) encodes with these functions and the clients
(client.py, worker.py) decode with them, so neither side imports the
other. docs/workq.md lists every command and its parts.

Items are named by a *handle*: (segment id, byte offset of its record),
packed into one unsigned 64-bit integer, which is what crosses the wire::

    bits 63..32  segment id (uint32, never reused by a broker)
    bits 31..0   record offset / 8 (records are 8-byte aligned; segments < 32 GiB)

Byte strings (payloads, results) travel as one concatenated ``data`` part
(uint8) plus a ``lengths`` part, never one part each.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final, NamedTuple

import numpy as np

from common.wire.errors import BadRequest
from common.wire.framing import PADDING, PART_ALIGN, Body, Packed, part_spec
from common.wire.part_views import PartViews, ints

OFFSET_UNIT: Final = 8
SMALL_BATCH = 8
"""Up to this many items, encodings use plain Python (numpy's per-call cost
exceeds the work), and a reply of one item is packed from ints into a
fixed layout (framing.Packed); the bytes are the same
(tests/workq/test_protocol.py)."""
#: Dtypes a ``lengths`` part may have.
LENGTH_DTYPES: Final = ("<u4", "<i4", "<u8", "<i8")
#: What ``complete`` answers per handle.
COMPLETED: Final = "completed"
DUPLICATE: Final = "duplicate"  # the item already had a result: this one was dropped


class Handle(NamedTuple):
    """An item's name: its segment and its record's byte offset."""

    segment: int
    offset: int

    @property
    def packed(self) -> int:
        return (self.segment << 32) | (self.offset // OFFSET_UNIT)

    @classmethod
    def unpack(cls, packed: int) -> Handle:
        return cls(packed >> 32, (packed & 0xFFFFFFFF) * OFFSET_UNIT)

    def __str__(self) -> str:
        return f"{self.segment}:{self.offset}"


def pack(segment: int | np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Packed handles (uint64) for records of one segment (or one segment each)."""
    if isinstance(segment, int) and len(offsets) <= SMALL_BATCH:  # one item: int arithmetic, one array
        return np.array([(segment << 32) | (offset // OFFSET_UNIT) for offset in offsets.tolist()], np.uint64)
    return (np.asarray(segment).astype(np.uint64) << np.uint64(32)) | (offsets.astype(np.uint64)
                                                                        // np.uint64(OFFSET_UNIT))


def pack_ints(segment: int, offsets: list[int]) -> list[int]:
    """:func:`pack` of one segment's record offsets, as plain ints."""
    if len(offsets) <= SMALL_BATCH:
        return [(segment << 32) | (offset // OFFSET_UNIT) for offset in offsets]
    return list(pack(segment, np.array(offsets, dtype=np.int64)).tolist())


def unpack(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(segment ids, offsets) as int64 arrays."""
    packed = np.asarray(packed, dtype=np.uint64)
    return ((packed >> np.uint64(32)).astype(np.int64),
            (packed & np.uint64(0xFFFFFFFF)).astype(np.int64) * OFFSET_UNIT)


def pack_handles(handles: Sequence[Handle] | Sequence[tuple[int, int]]) -> np.ndarray:
    """Packed handles (uint64) for a sequence of (segment, offset) pairs."""
    if not len(handles):
        return np.zeros(0, dtype=np.uint64)
    if len(handles) <= SMALL_BATCH:
        few = _packed_few(handles)
        if few is not None:
            return np.array(few, np.uint64)
    pairs = np.array(handles, dtype=np.int64).reshape(-1, 2)
    return pack(pairs[:, 0], pairs[:, 1])


def _packed_few(handles: Sequence[Handle] | Sequence[tuple[int, int]]) -> list[int] | None:
    """The packed handles of a few pairs of plain ints in range, by int
    arithmetic (numpy's look at a list of tuples costs a worker's one-item
    complete more than the rest of its request); None for anything else,
    which the general path packs (or refuses) as it always did."""
    packed: list[int] = []
    for pair in handles:
        if not isinstance(pair, tuple) or len(pair) != 2:
            return None
        segment, offset = pair
        if type(segment) is not int or type(offset) is not int or not (
                0 <= segment < 1 << 32 and 0 <= offset < (1 << 32) * OFFSET_UNIT):
            return None
        packed.append((segment << 32) | (offset // OFFSET_UNIT))
    return packed


LANE_MIN, LANE_MAX = -(1 << 63), (1 << 63) - 1
"""The range of an int lane (what msgpack and the segment metadata keep as an int)."""


class Key(NamedTuple):
    """What a segment holds: one model, one prompt shape, one length lane.

    A lane is a string or an int and keeps its type: it comes back (in
    :class:`Item`, over the wire, after a restart) as it was given. ``1``
    and ``"1"`` are different keys (their items never share a segment), but
    the same lane for filters: a worker's ``lanes`` match a key by
    :attr:`lane_name`, the lane's text. Keys sort with int lanes (by value)
    before string lanes."""

    model: str
    shape: str
    lane: str | int

    def __str__(self) -> str:
        return f"{self.model}/{self.shape}/{self.lane}"

    @property
    def lane_name(self) -> str:
        """The lane as text (``1`` and ``"1"`` both give ``"1"``): what lane filters compare."""
        return str(self.lane)

    @classmethod
    def of(cls, model: object, shape: object, lane: object) -> Key:
        """Build and check a key (ValueError naming the bad part). An int
        lane stays an int; a bool is refused."""
        return cls(_name("model", model), _name("shape", shape), _lane(lane))

    def _order(self) -> tuple[str, str, bool, str | int]:
        return self.model, self.shape, isinstance(self.lane, str), self.lane

    # a tuple's own ordering would compare an int lane with a str lane (TypeError)
    def __lt__(self, other: object) -> bool:
        return self._order() < other._order() if isinstance(other, Key) else NotImplemented

    def __le__(self, other: object) -> bool:
        return self._order() <= other._order() if isinstance(other, Key) else NotImplemented

    def __gt__(self, other: object) -> bool:
        return self._order() > other._order() if isinstance(other, Key) else NotImplemented

    def __ge__(self, other: object) -> bool:
        return self._order() >= other._order() if isinstance(other, Key) else NotImplemented


def _name(part: str, value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value.encode()) <= 128 or "\0" in value:
        raise ValueError(f"{part} must be a non-empty string of at most 128 bytes, got {value!r}")
    return value


def _lane(value: object) -> str | int:
    if isinstance(value, int) and not isinstance(value, bool):
        if not LANE_MIN <= value <= LANE_MAX:
            raise ValueError(f"lane must be a string or an integer in -2**63..2**63-1, got {value!r}")
        return value
    try:
        return _name("lane", value)
    except ValueError:
        raise ValueError(f"lane must be a non-empty string of at most 128 bytes or an integer, got {value!r}") from None


class Item(NamedTuple):
    """A leased task."""

    handle: Handle
    payload: bytes
    job: str
    key: Key
    position: int  # the task's index in its job, in enqueue order
    deliveries: int  # times it was handed out, this one included


class Result(NamedTuple):
    """A completed task's result."""

    handle: Handle
    payload: bytes
    position: int


@dataclasses.dataclass(slots=True)
class Leased:
    """Items one lease took from one segment for one job, as handed out."""

    key: Key
    job: str
    handles: list[int]  # packed (plain ints whatever the size: the response converts a batch once)
    positions: list[int]
    deliveries: list[int]
    payloads: list[memoryview]

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, key: Key, job: str, handles: list[int], positions: list[int], deliveries: list[int],
                 payloads: list[memoryview]) -> None:
        self.key = key
        self.job = job
        self.handles = handles
        self.positions = positions
        self.deliveries = deliveries
        self.payloads = payloads

    def items(self) -> list[Item]:
        return [Item(Handle.unpack(h), bytes(p), self.job, self.key, pos, d) for h, p, pos, d in
                zip(self.handles, self.payloads, self.positions, self.deliveries)]


Parts = dict[str, np.ndarray]


def split(data: np.ndarray, lengths: np.ndarray) -> list[memoryview]:
    """Byte strings sent as one concatenated part plus their lengths
    (BadRequest if the lengths do not add up; each is at most the data's
    size, so no sum wraps around)."""
    if lengths.ndim == 1 and len(lengths) <= SMALL_BATCH:
        return _split_few(data, lengths.tolist())
    if (lengths.ndim != 1 or (lengths < 0).any() or (lengths > data.nbytes).any()
            or int(lengths.sum()) != data.nbytes):
        raise BadRequest(f"lengths must be non-negative and sum to the {data.nbytes} data bytes")
    view = data.data.cast("B")
    ends = np.cumsum(lengths).tolist()
    return [view[a:b] for a, b in zip([0, *ends[:-1]], ends)]


def split_parts(parts: Mapping[str, np.ndarray]) -> list[memoryview]:
    """:func:`split` of the ``data`` and ``lengths`` parts; a few of them
    from a received frame without making an array (part_views.py)."""
    if isinstance(parts, PartViews) and _few_bytes(parts.shape("lengths")) and parts.code("data") == "|u1":
        return split_view(parts.view("data"), parts.ints("lengths"))
    return split(parts["data"], parts["lengths"])


def _few_bytes(lengths_shape: tuple[int, ...]) -> bool:
    return len(lengths_shape) == 1 and lengths_shape[0] <= SMALL_BATCH


def _split_few(data: np.ndarray, lengths: list[int]) -> list[memoryview]:
    """split for a few byte strings, with plain ints (numpy calls cost more than the work)."""
    return split_view(data.data.cast("B"), lengths)


def split_view(view: memoryview, lengths: list[int]) -> list[memoryview]:
    """Byte strings of the given lengths, one after another in ``view`` (BadRequest unless they fill it)."""
    if (lengths and min(lengths) < 0) or sum(lengths) != view.nbytes:  # then none exceeds the view
        raise BadRequest(f"lengths must be non-negative and sum to the {view.nbytes} data bytes")
    pieces = []
    start = 0
    for n in lengths:
        pieces.append(view[start:start + n])
        start += n
    return pieces


def joined(payloads: Sequence[memoryview | bytes]) -> Parts:
    """The inverse of split: the parts for a list of byte strings (copied:
    they may be views of files that change or close before the reply is sent)."""
    if len(payloads) == 1:
        return {"data": np.frombuffer(bytes(payloads[0]), dtype=np.uint8),
                "lengths": np.array([len(payloads[0])], dtype=np.uint32)}
    lengths = np.fromiter((len(p) for p in payloads), dtype=np.uint32, count=len(payloads))
    return {"data": np.frombuffer(b"".join(payloads), dtype=np.uint8), "lengths": lengths}


def encode_lease(batches: list[Leased]) -> tuple[dict[str, Any], Body]:
    """A lease response: per item, its batch's job and key by index."""
    if len(batches) == 1 and len(batches[0].handles) == 1 <= SMALL_BATCH:
        return _lease_header(batches[0]), _lease_one(batches[0])
    return _encode_lease_arrays(batches)


def _encode_lease_arrays(batches: list[Leased]) -> tuple[dict[str, Any], Parts]:
    if len(batches) == 1 and len(batches[0].handles) <= SMALL_BATCH:
        return _lease_header(batches[0]), _lease_few(batches[0])
    jobs = sorted({b.job for b in batches})
    keys = sorted({b.key for b in batches})
    job_index = {j: i for i, j in enumerate(jobs)}
    key_index = {k: i for i, k in enumerate(keys)}
    sizes = [len(b.handles) for b in batches]
    parts: Parts = {
        "handles": _column([b.handles for b in batches], np.uint64),
        "positions": _column([b.positions for b in batches], np.uint64),
        "deliveries": _column([b.deliveries for b in batches], np.uint32),
        "job_index": np.repeat(np.array([job_index[b.job] for b in batches], dtype=np.uint32), sizes),
        "key_index": np.repeat(np.array([key_index[b.key] for b in batches], dtype=np.uint32), sizes),
        **joined([p for b in batches for p in b.payloads]),
    }
    return {"jobs": jobs, "keys": [list(k) for k in keys]}, parts


def _column(lists: list[list[int]], dtype: type[np.unsignedinteger[Any]]) -> np.ndarray:
    """The batches' int lists as one array (one conversion: no nested loop in Python)."""
    if len(lists) == 1:
        return np.array(lists[0], dtype=dtype)
    return np.fromiter(itertools.chain.from_iterable(lists), dtype=dtype, count=sum(map(len, lists)))


def _lease_header(batch: Leased) -> dict[str, Any]:
    """The response fields of a lease of one batch: its job and key, index 0 for every item."""
    return {"jobs": [batch.job], "keys": [list(batch.key)]}


def _lease_few(batch: Leased) -> Parts:
    """The parts of a lease of one batch of a few items: the general encoding's, without the merging."""
    index = np.zeros(len(batch.handles), dtype=np.uint32)
    return {"handles": np.array(batch.handles, np.uint64), "positions": np.array(batch.positions, np.uint64),
            "deliveries": np.array(batch.deliveries, np.uint32), "job_index": index, "key_index": index,
            **joined(batch.payloads)}


# One leased item's body: the general encoding's bytes (tests/workq/test_protocol.py), packed from ints.
#   0  8  handles     <u8 (1,)
#   8  8  positions   <u8 (1,)
#  16  4  deliveries  <u4 (1,), then 4 bytes of padding
#  24  4  job_index   <u4 (1,) = 0, padding
#  32  4  key_index   <u4 (1,) = 0, padding
#  40  n  data        |u1 (n,), the payload, then padding to a multiple of 8
#   .  4  lengths     <u4 (1,) = n
_LEASED_ONE: Final = struct.Struct("<QQI4xI4xI4x")
_U32: Final = struct.Struct("<I")
_LEASE_SPECS: Final = [part_spec("handles", "<u8", (1,)), part_spec("positions", "<u8", (1,)),
                part_spec("deliveries", "<u4", (1,)), part_spec("job_index", "<u4", (1,)),
                part_spec("key_index", "<u4", (1,))]
_LENGTHS_SPEC: Final = part_spec("lengths", "<u4", (1,))


def _lease_one(batch: Leased) -> Packed:
    payload = batch.payloads[0]
    size = len(payload)
    head = _LEASED_ONE.pack(batch.handles[0], batch.positions[0], batch.deliveries[0], 0, 0)
    return Packed([*_LEASE_SPECS, part_spec("data", "|u1", (size,)), _LENGTHS_SPEC],
                  b"".join([head, payload, PADDING[-size % PART_ALIGN], _U32.pack(size)]))


def decode_lease(result: dict[str, Any], parts: Mapping[str, np.ndarray]) -> list[Item]:
    """The items of a lease response."""
    jobs = result["jobs"]
    keys = [Key(*k) for k in result["keys"]]
    payloads = split_parts(parts)
    return [Item(Handle.unpack(h), bytes(p), jobs[j], keys[k], pos, d) for h, p, j, k, pos, d in zip(
        ints(parts, "handles"), payloads, ints(parts, "job_index"), ints(parts, "key_index"),
        ints(parts, "positions"), ints(parts, "deliveries"))]


def encode_results(handles: np.ndarray, positions: np.ndarray,
                   payloads: Sequence[memoryview | bytes]) -> tuple[dict[str, Any], Parts]:
    """A results response."""
    return {"count": len(payloads)}, {"handles": handles.astype(np.uint64, copy=False),
                                      "positions": positions.astype(np.uint64, copy=False), **joined(payloads)}


def decode_results(parts: Mapping[str, np.ndarray]) -> list[Result]:
    """The results of a results response, in log order."""
    payloads = split_parts(parts)
    return [Result(Handle.unpack(h), bytes(p), pos)
            for h, p, pos in zip(ints(parts, "handles"), payloads, ints(parts, "positions"))]


_STATUS_SPEC: Final = part_spec("status", "|u1", (1,))
_STATUS_BYTES: Final = {COMPLETED: b"\x01", DUPLICATE: b"\x00"}


def encode_statuses(statuses: list[str]) -> tuple[dict[str, Any], Body]:
    """A complete response: one byte per handle, 1 for completed."""
    if len(statuses) == 1 <= SMALL_BATCH:
        return _statuses_header(statuses), Packed([_STATUS_SPEC], _STATUS_BYTES[statuses[0]])
    return _statuses_header(statuses), _status_array(statuses)


def _statuses_header(statuses: list[str]) -> dict[str, Any]:
    return {"completed": statuses.count(COMPLETED)}


def _status_array(statuses: list[str]) -> Parts:
    if len(statuses) <= SMALL_BATCH:
        return {"status": np.array([s == COMPLETED for s in statuses], dtype=np.uint8)}
    return {"status": np.fromiter((s == COMPLETED for s in statuses), dtype=np.uint8, count=len(statuses))}


def encode_statuses_and_lease(answer: tuple[list[str], list[Leased]]) -> tuple[dict[str, Any], Body]:
    """A complete response that leased too (``lease`` > 0): both
    responses' fields in one (their names do not overlap)."""
    statuses, batches = answer
    result = _statuses_header(statuses)
    if len(statuses) == 1 <= SMALL_BATCH and len(batches) == 1 and len(batches[0].handles) == 1:
        status = Packed([_STATUS_SPEC], _STATUS_BYTES[statuses[0]])
        return result | _lease_header(batches[0]), status.then(_lease_one(batches[0]))
    lease_result, lease_parts = _encode_lease_arrays(batches)
    return result | lease_result, _status_array(statuses) | lease_parts


def decode_statuses(parts: Mapping[str, np.ndarray]) -> list[str]:
    return [COMPLETED if s else DUPLICATE for s in ints(parts, "status")]
