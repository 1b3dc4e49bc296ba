"""Decoding the msgpack maps the store keeps in the header metadata of its
journals: a collection's ``collection``, a shard's ``journal`` and an
index's ``index.meta``.

Decoding is where bytes from the disk become values, so it is where
malformed bytes become :class:`~common.journal.errors.FormatError` naming
the file: callers then tell damage (FormatError) from their own bugs
(TypeError, KeyError, ...), which must never pass for damage.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack

from common.journal.errors import FormatError
from common.journal.header import METADATA_OFFSET

Schema = Mapping[str, type | tuple[type, ...]]
"""Required fields of a metadata map and the types their values must have."""


def decode(raw: bytes, path: Path, schema: Schema) -> dict[str, Any]:
    """The metadata map in ``raw`` (read from ``path``), with every field
    of ``schema`` present and of its type (a bool is not an int).
    FormatError if the bytes are not a msgpack map or a field is wrong."""
    try:
        meta = msgpack.unpackb(raw)
    except (ValueError, msgpack.UnpackException) as exc:  # every msgpack decoding error is one of these
        raise FormatError(path, METADATA_OFFSET, f"metadata is not msgpack: {exc or type(exc).__name__}") from exc
    if not isinstance(meta, dict):
        raise FormatError(path, METADATA_OFFSET, f"metadata is a msgpack {type(meta).__name__}, not a map")
    for name, kind in schema.items():
        value = meta.get(name)
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            expected = " or ".join(k.__name__ for k in kinds)
            raise FormatError(path, METADATA_OFFSET, f"metadata field {name!r} is {value!r}, expected {expected}")
    return meta
