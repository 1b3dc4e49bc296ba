"""The clean-close marker: proof that a growing shard lost nothing.

A shard still being written when the store closes is flushed whole, then
gets ``<shard>/closed``: a journal (kind ``SMCL``) with no records whose
checksummed metadata is ``{uuid, rows, end}``: the shard's uuid, its row
count and its journal's end at that moment. The next open replays the shard
as after a crash; if the marker is there and names exactly what the replay
found, no acknowledged append can have been lost since (a crash loses only
writes made after the last flush, and a clean close flushed everything), so
the shard stays growing and takes the next appends: short sessions do not
leave a shard each. Any other outcome seals the shard, as after a crash.

The marker is removed, durably, before the reopened shard takes an append
(by that first append: a session that appends nothing, an offline snapshot
say, leaves it, so even a crash then changes nothing), so a crash later in
a session that appended leaves no marker behind and the shard is sealed at
the next open (refs handed out for appends the crash lost can then never
name other rows).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import msgpack

from common.journal import Journal
from common.journal.errors import FormatError
from common.journal.filesystem import fsync_dir

from . import layout, metadata

log = logging.getLogger(__name__)

KIND = b"SMCL"


class Closed(NamedTuple):
    uuid: bytes
    rows: int
    end: int


def write(directory: Path, closed: Closed) -> None:
    """Record a clean close (the shard must be durable up to ``closed.end``)."""
    meta = msgpack.packb({"uuid": closed.uuid, "rows": closed.rows, "end": closed.end})
    Journal.write_empty(directory / layout.CLOSED, kind=KIND, metadata=meta)  # atomic and durable, directory included


def read(directory: Path) -> Closed | None:
    """The marker, or None if there is none or it is unreadable (then the
    shard is treated as after a crash: sealed; nothing is lost by that)."""
    path = directory / layout.CLOSED
    if not path.exists():
        return None
    try:
        with Journal.open(path, kind=KIND, writable=False) as journal:
            meta = metadata.decode(journal.metadata, path, {"uuid": bytes, "rows": int, "end": int})
    except FormatError as exc:
        log.warning("%s: unusable clean-close marker (%s); the shard is sealed", path, exc)
        return None
    return Closed(bytes(meta["uuid"]), meta["rows"], meta["end"])


def remove(directory: Path) -> None:
    """Remove the marker durably (nothing if there is none)."""
    path = directory / layout.CLOSED
    if path.exists():
        path.unlink()
        fsync_dir(directory)
