"""Handles and keys: how items are named.

A handle names an item by (segment id, byte offset of its record). It
packs into one unsigned 64-bit integer, which is what crosses the wire::

    bits 63..32  segment id (uint32, never reused by a broker)
    bits 31..0   record offset / 8 (records are 8-byte aligned; segments < 32 GiB)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

OFFSET_UNIT = 8


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


def pack(segment: int, offsets: np.ndarray) -> np.ndarray:
    """Packed handles (uint64) for records of one segment."""
    return (np.uint64(segment) << np.uint64(32)) | (offsets.astype(np.uint64) // np.uint64(OFFSET_UNIT))


def unpack(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(segment ids, offsets) as int64 arrays."""
    packed = np.asarray(packed, dtype=np.uint64)
    return ((packed >> np.uint64(32)).astype(np.int64),
            (packed & np.uint64(0xFFFFFFFF)).astype(np.int64) * OFFSET_UNIT)


class Key(NamedTuple):
    """What a segment holds: one model, one prompt shape, one length lane."""

    model: str
    shape: str
    lane: str

    def __str__(self) -> str:
        return f"{self.model}/{self.shape}/{self.lane}"

    @classmethod
    def of(cls, model: object, shape: object, lane: object) -> Key:
        """Build and check a key (ValueError naming the bad part)."""
        parts = []
        for name, value in (("model", model), ("shape", shape), ("lane", lane)):
            if isinstance(value, int) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, str) or not 0 < len(value.encode()) <= 128 or "\0" in value:
                raise ValueError(f"{name} must be a non-empty string of at most 128 bytes, got {value!r}")
            parts.append(value)
        return cls(*parts)
