"""A received frame's parts: checked layouts over its body, arrays made on demand.

framing.decode checks every part's spec against the body (names, dtypes,
shapes, alignment, sizes) and hands back a :class:`PartViews`: a read-only
mapping of part names to numpy arrays viewing the body, each array made the
first time it is asked for. A one-item request or reply has five to eight
parts, and a numpy array costs more to make than the item's own work, so a
reader that wants plain values asks for them instead: :meth:`PartViews.ints`
(an integer part as Python ints, read with one ``struct`` call) and
:meth:`PartViews.view` (a part's bytes as a memoryview). Both read the same
bytes the array would.

Threads: a PartViews is read by the thread that handles its frame.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping
from typing import Final

import numpy as np

#: (dtype, its wire code, shape, offset, count): where one part lies in the body; checked by framing.decode_parts
Layout = tuple[np.dtype, str, tuple[int, ...], int, int]
#: struct codes of the integer dtypes frames carry, by wire code (all little-endian or one byte)
_INT_CODES: Final = {"|u1": "B", "<u2": "H", "<u4": "I", "<u8": "Q", "|i1": "b", "<i2": "h", "<i4": "i", "<i8": "q"}
#: one element of each: the common case (a one-item request's handle, length, status) as one call
_ONE_INT: Final = {code: struct.Struct("<" + char) for code, char in _INT_CODES.items()}
#: above this many elements ``ints`` goes through the array (its tolist beats a long struct format)
FEW_INTS: Final = 64


class PartViews(Mapping[str, np.ndarray]):
    """A frame's parts by name (module docstring); what a dict of arrays offers, and plain reads."""

    def __init__(self, body: memoryview, layouts: dict[str, Layout]) -> None:
        self._body = body
        self._layouts = layouts
        self._arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        array = self._arrays.get(name)
        if array is None:
            dtype, _, shape, offset, _ = self._layouts[name]
            array = self._arrays[name] = np.ndarray(shape, dtype, self._body, offset)  # a view, as frombuffer
        return array

    def get(self, name: str, default: np.ndarray | None = None) -> np.ndarray | None:  # type: ignore[override]
        return self[name] if name in self._layouts else default

    def __contains__(self, name: object) -> bool:
        return name in self._layouts

    def __iter__(self) -> Iterator[str]:
        return iter(self._layouts)

    def __len__(self) -> int:
        return len(self._layouts)

    def __repr__(self) -> str:
        return f"PartViews({ {name: self[name] for name in self._layouts}!r})"

    def code(self, name: str) -> str:
        """The part's dtype as the wire spells it (``"<u8"``; KeyError if there is no such part)."""
        return self._layouts[name][1]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._layouts[name][2]

    def ints(self, name: str) -> list[int]:
        """An integer part's elements as Python ints, in order (flattened);
        TypeError for a part that is not of integers."""
        _, code, _, offset, count = self._layouts[name]
        one = _ONE_INT.get(code)
        if one is None:
            raise TypeError(f"part {name!r} has dtype {code}, not integers")
        if count == 1:
            return [one.unpack_from(self._body, offset)[0]]
        if count > FEW_INTS:
            return list(self[name].ravel().tolist())
        return list(struct.unpack_from(f"<{count}{_INT_CODES[code]}", self._body, offset))

    def view(self, name: str) -> memoryview:
        """The part's bytes (a read-only view of the body when it is read-only)."""
        dtype, _, _, offset, count = self._layouts[name]
        return self._body[offset:offset + count * dtype.itemsize]


def ints(parts: Mapping[str, np.ndarray], name: str) -> list[int]:
    """``parts[name]`` as Python ints, flattened: :meth:`PartViews.ints` for a received frame's parts."""
    if isinstance(parts, PartViews):
        return parts.ints(name)
    return list(parts[name].ravel().tolist())


def view(parts: Mapping[str, np.ndarray], name: str) -> memoryview:
    """The bytes of ``parts[name]``: :meth:`PartViews.view` for a received frame's parts."""
    if isinstance(parts, PartViews):
        return parts.view(name)
    return array_bytes(parts[name])


def array_bytes(array: np.ndarray) -> memoryview:
    """An array's bytes, in order, as a one-dimensional memoryview (through a
    uint8 view: memoryview.cast refuses empty shapes)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
