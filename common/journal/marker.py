"""Record state markers: the 4-byte word at the start of every record.

A marker is the only part of a record that may change after it is written,
by an aligned 4-byte in-place store. It lives outside the record checksum.

Codeword rules (format version 1):

* Zero is never a marker, so zero-filled preallocated space never parses.
* Every marker's most significant byte is :data:`MARKER_TAG` (``0xB7``). The
  recovery scan uses that byte to find candidate record starts with one
  strided byte comparison, before checking the full word.
* The low 24 bits of any two markers differ in at least 12 bits, so no
  single (or up to 11-) bit flip turns one valid marker into another; a
  damaged marker is detected as invalid instead of read as another state.

The journal layer gives the states no meaning beyond these names; the queue
and the shard store decide what each one means for them.
"""

from __future__ import annotations

import enum
from typing import Final

import numpy as np

MARKER_TAG: Final = 0xB7
"""Most significant byte shared by every valid marker (file byte offset +3)."""


class Marker(enum.IntEnum):
    """The valid record states. Values are little-endian uint32 on disk."""

    LIVE = 0xB73C5A96
    RETIRED = 0xB7C3A569
    BURIED = 0xB75A963C
    DELIVERED = 0xB7A569C3


MARKER_VALUES: Final = np.array([m.value for m in Marker], dtype=np.uint32)
"""All valid marker words, in :class:`Marker` order (the counters' order)."""

MARKER_INDEX: dict[int, int] = {int(m): i for i, m in enumerate(Marker)}
"""Marker word -> its position in :class:`Marker` (the counters' order)."""


def marker_index(words: np.ndarray) -> np.ndarray:
    """Map marker words to their position in :class:`Marker`, -1 if invalid."""
    words = np.asarray(words, dtype=np.uint32)
    index = np.full(words.shape, -1, dtype=np.int8)
    for i, value in enumerate(MARKER_VALUES):
        index[words == value] = i
    return index


def is_marker(words: np.ndarray) -> np.ndarray:
    """Boolean mask: which words are valid markers (four comparisons: cheaper
    than np.isin, which sorts)."""
    words = np.asarray(words, dtype=np.uint32)
    mask: np.ndarray = words == MARKER_VALUES[0]
    for value in MARKER_VALUES[1:]:
        mask |= words == value
    return mask
