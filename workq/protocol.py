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
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from common.wire.errors import BadRequest

OFFSET_UNIT = 8
SMALL_BATCH = 8
"""Up to this many items, encodings use plain Python (numpy's per-call cost
exceeds the work); the results are the same (tests/workq/test_protocol.py)."""
#: Dtypes a ``lengths`` part may have.
LENGTH_DTYPES = ("<u4", "<i4", "<u8", "<i8")
#: What ``complete`` answers per handle.
COMPLETED = "completed"
DUPLICATE = "duplicate"  # the item already had a result: this one was dropped


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
    handles: np.ndarray  # packed, uint64
    positions: np.ndarray  # uint64
    deliveries: np.ndarray  # uint32
    payloads: list[memoryview]

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, key: Key, job: str, handles: np.ndarray, positions: np.ndarray, deliveries: np.ndarray,
                 payloads: list[memoryview]) -> None:
        self.key = key
        self.job = job
        self.handles = handles
        self.positions = positions
        self.deliveries = deliveries
        self.payloads = payloads

    def items(self) -> list[Item]:
        return [Item(Handle.unpack(h), bytes(p), self.job, self.key, pos, d) for h, p, pos, d in
                zip(self.handles.tolist(), self.payloads, self.positions.tolist(), self.deliveries.tolist())]


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


def _split_few(data: np.ndarray, lengths: list[int]) -> list[memoryview]:
    """split for a few byte strings, with plain ints (numpy calls cost more than the work)."""
    if any(n < 0 or n > data.nbytes for n in lengths) or sum(lengths) != data.nbytes:
        raise BadRequest(f"lengths must be non-negative and sum to the {data.nbytes} data bytes")
    view = data.data.cast("B")
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


def encode_lease(batches: list[Leased]) -> tuple[dict[str, Any], Parts]:
    """A lease response: per item, its batch's job and key by index."""
    if len(batches) == 1 and len(batches[0].handles) <= SMALL_BATCH:
        return _encode_lease_few(batches[0])
    jobs = sorted({b.job for b in batches})
    keys = sorted({b.key for b in batches})
    job_index = {j: i for i, j in enumerate(jobs)}
    key_index = {k: i for i, k in enumerate(keys)}
    sizes = [len(b.handles) for b in batches]
    empty = np.zeros(0, dtype=np.uint64)
    parts: Parts = {
        "handles": np.concatenate([b.handles for b in batches]) if batches else empty,
        "positions": np.concatenate([b.positions for b in batches]).astype(np.uint64) if batches else empty,
        "deliveries": np.concatenate([b.deliveries for b in batches]) if batches else empty.astype(np.uint32),
        "job_index": np.repeat(np.array([job_index[b.job] for b in batches], dtype=np.uint32), sizes),
        "key_index": np.repeat(np.array([key_index[b.key] for b in batches], dtype=np.uint32), sizes),
        **joined([p for b in batches for p in b.payloads]),
    }
    return {"jobs": jobs, "keys": [list(k) for k in keys]}, parts


def _encode_lease_few(batch: Leased) -> tuple[dict[str, Any], Parts]:
    """encode_lease of one batch of a few items: the same response, without the merging."""
    index = np.zeros(len(batch.handles), dtype=np.uint32)  # one job, one key: index 0
    parts: Parts = {"handles": batch.handles.copy(), "positions": batch.positions.astype(np.uint64),
                    "deliveries": batch.deliveries.copy(), "job_index": index, "key_index": index,
                    **joined(batch.payloads)}
    return {"jobs": [batch.job], "keys": [list(batch.key)]}, parts


def decode_lease(result: dict[str, Any], parts: Parts) -> list[Item]:
    """The items of a lease response."""
    jobs = result["jobs"]
    keys = [Key(*k) for k in result["keys"]]
    payloads = split(parts["data"], parts["lengths"])
    return [Item(Handle.unpack(h), bytes(p), jobs[j], keys[k], pos, d) for h, p, j, k, pos, d in zip(
        parts["handles"].tolist(), payloads, parts["job_index"].tolist(), parts["key_index"].tolist(),
        parts["positions"].tolist(), parts["deliveries"].tolist())]


def encode_results(handles: np.ndarray, positions: np.ndarray,
                   payloads: Sequence[memoryview | bytes]) -> tuple[dict[str, Any], Parts]:
    """A results response."""
    return {"count": len(payloads)}, {"handles": handles.astype(np.uint64, copy=False),
                                      "positions": positions.astype(np.uint64, copy=False), **joined(payloads)}


def decode_results(parts: Parts) -> list[Result]:
    """The results of a results response, in log order."""
    payloads = split(parts["data"], parts["lengths"])
    return [Result(Handle.unpack(h), bytes(p), pos)
            for h, p, pos in zip(parts["handles"].tolist(), payloads, parts["positions"].tolist())]


def encode_statuses(statuses: list[str]) -> tuple[dict[str, Any], Parts]:
    """A complete response: one byte per handle, 1 for completed."""
    if len(statuses) <= SMALL_BATCH:
        flags = [s == COMPLETED for s in statuses]
        return {"completed": sum(flags)}, {"status": np.array(flags, dtype=np.uint8)}
    status = np.fromiter((s == COMPLETED for s in statuses), dtype=np.uint8, count=len(statuses))
    return {"completed": int(status.sum())}, {"status": status}


def encode_statuses_and_lease(answer: tuple[list[str], list[Leased]]) -> tuple[dict[str, Any], Parts]:
    """A complete response that leased too (``lease`` > 0): both
    responses' fields in one (their names do not overlap)."""
    statuses, batches = answer
    result, parts = encode_statuses(statuses)
    lease_result, lease_parts = encode_lease(batches)
    return result | lease_result, parts | lease_parts


def decode_statuses(parts: Parts) -> list[str]:
    return [COMPLETED if s else DUPLICATE for s in parts["status"].tolist()]
