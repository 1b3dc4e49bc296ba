"""The journal file header: identity, metadata and two checkpoint slots.

Layout of the first :data:`HEADER_SIZE` bytes (all integers little-endian)::

    offset  size  field
    0       8     magic            b"\\x89JOURNAL"
    8       2     format_version   1
    10      2     alignment        record start alignment in bytes
    12      4     kind             4 ASCII bytes chosen by the owner (b"WQSG", ...)
    16      4     metadata_length  bytes used in the metadata area
    20      4     max_record_bytes largest record body this journal accepts
    24      8     created_ns       creation time, ns since the epoch
    32      16    uuid             random identity of this journal
    48      12    reserved         zero
    60      4     header_crc       crc32c of bytes [0, 60) then [64, 2048)
    64      1984  metadata         owner's bytes, zero padded
    2048    64    checkpoint slot 0
    2112    448   zero
    2560    64    checkpoint slot 1
    2624    1472  zero

The identity block and metadata are written once, at creation, and never
change. Each checkpoint slot sits in its own 512-byte sector::

    0   8   generation   higher wins; slots are written alternately
    8   8   end          byte offset just past the last durable record
    16  8   count        records in [HEADER_SIZE, end)
    24  32  counters     4 x uint64: records per Marker (LIVE, RETIRED,
                         BURIED, DELIVERED) at the time of the checkpoint
    56  4   flags        bit 0: sealed (no record will ever be appended)
    60  4   crc          crc32c of bytes [0, 60) of the slot

A checkpoint is written only after an fdatasync made everything it
describes durable, and always into the slot not holding the newest valid
checkpoint, so a torn checkpoint write leaves the previous one intact.
"""

from __future__ import annotations

import dataclasses
import struct
import uuid as uuidlib
from typing import Final

import crc32c

from .errors import FormatError

HEADER_SIZE: Final = 4096
MAGIC: Final = b"\x89JOURNAL"
FORMAT_VERSION: Final = 1
IDENTITY: Final = struct.Struct("<8sHH4sIIQ16s12x")  # 60 bytes, then the crc
CRC_OFFSET: Final = 60
METADATA_OFFSET: Final = 64
METADATA_END: Final = 2048
MAX_METADATA: Final = METADATA_END - METADATA_OFFSET
SLOT_OFFSETS: Final = (2048, 2560)
SLOT: Final = struct.Struct("<QQQ4QI")  # 60 bytes, then the crc
SLOT_SIZE: Final = 64
FLAG_SEALED: Final = 1


def _crc(*parts: bytes | memoryview) -> int:
    value = 0
    for part in parts:
        value = crc32c.crc32c(part, value)
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class Identity:
    """The immutable part of the header."""

    kind: bytes
    alignment: int
    max_record_bytes: int
    metadata: bytes = b""
    created_ns: int = 0
    uuid: bytes = b"\0" * 16
    format_version: int = FORMAT_VERSION

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, kind: bytes, alignment: int, max_record_bytes: int, metadata: bytes = b"",
                 created_ns: int = 0, uuid: bytes = b"\0" * 16, format_version: int = FORMAT_VERSION) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "alignment", alignment)
        object.__setattr__(self, "max_record_bytes", max_record_bytes)
        object.__setattr__(self, "metadata", metadata)
        object.__setattr__(self, "created_ns", created_ns)
        object.__setattr__(self, "uuid", uuid)
        object.__setattr__(self, "format_version", format_version)

    def encode(self) -> bytearray:
        """The full HEADER_SIZE bytes with both checkpoint slots empty."""
        if len(self.kind) != 4 or not self.kind.isascii():
            raise ValueError(f"journal kind must be 4 ASCII bytes, got {self.kind!r}")
        if len(self.metadata) > MAX_METADATA:
            raise ValueError(f"journal metadata is {len(self.metadata)} bytes; the limit is {MAX_METADATA}")
        buf = bytearray(HEADER_SIZE)
        IDENTITY.pack_into(buf, 0, MAGIC, self.format_version, self.alignment, self.kind,
                           len(self.metadata), self.max_record_bytes, self.created_ns, self.uuid)
        buf[METADATA_OFFSET:METADATA_OFFSET + len(self.metadata)] = self.metadata
        view = memoryview(buf)
        struct.pack_into("<I", buf, CRC_OFFSET, _crc(view[:CRC_OFFSET], view[METADATA_OFFSET:METADATA_END]))
        return buf

    @classmethod
    def decode(cls, buf: bytes | memoryview, path: str = "") -> Identity:
        """Parse and check the identity block; raise FormatError if damaged."""
        if len(buf) < HEADER_SIZE:
            raise FormatError(path, len(buf), f"file is {len(buf)} bytes, shorter than the {HEADER_SIZE}-byte header")
        view = memoryview(buf)
        magic, version, alignment, kind, mlen, max_rec, created, uid = IDENTITY.unpack_from(view, 0)
        if magic != MAGIC:
            raise FormatError(path, 0, f"bad magic {magic!r}, expected {MAGIC!r}: not a journal")
        (stored,) = struct.unpack_from("<I", view, CRC_OFFSET)
        computed = _crc(view[:CRC_OFFSET], view[METADATA_OFFSET:METADATA_END])
        if stored != computed:
            raise FormatError(path, CRC_OFFSET,
                              f"header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")
        if version != FORMAT_VERSION:
            raise FormatError(path, 8, f"format version {version} is not supported (this build reads {FORMAT_VERSION})")
        if alignment < 8 or alignment & (alignment - 1) or alignment > 4096:
            raise FormatError(path, 10, f"alignment {alignment} is not a power of two in 8..4096")
        if mlen > MAX_METADATA:
            raise FormatError(path, 16, f"metadata length {mlen} exceeds {MAX_METADATA}")
        metadata = bytes(view[METADATA_OFFSET:METADATA_OFFSET + mlen])
        return cls(kind=kind, alignment=alignment, max_record_bytes=max_rec, metadata=metadata,
                   created_ns=created, uuid=uid, format_version=version)

    @property
    def uuid_str(self) -> str:
        return str(uuidlib.UUID(bytes=self.uuid))


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    """A durable statement: every record in [HEADER_SIZE, end) is on disk."""

    generation: int = 0
    end: int = HEADER_SIZE
    count: int = 0
    counters: tuple[int, int, int, int] = (0, 0, 0, 0)
    sealed: bool = False

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, generation: int = 0, end: int = HEADER_SIZE, count: int = 0,
                 counters: tuple[int, int, int, int] = (0, 0, 0, 0), sealed: bool = False) -> None:
        object.__setattr__(self, "generation", generation)
        object.__setattr__(self, "end", end)
        object.__setattr__(self, "count", count)
        object.__setattr__(self, "counters", counters)
        object.__setattr__(self, "sealed", sealed)

    def encode(self) -> bytes:
        body = SLOT.pack(self.generation, self.end, self.count, *self.counters,
                         FLAG_SEALED if self.sealed else 0)
        return body + struct.pack("<I", crc32c.crc32c(body))

    @classmethod
    def decode(cls, raw: bytes | memoryview) -> Checkpoint | None:
        """Parse one slot; None if it is empty or fails its checksum."""
        raw = memoryview(raw)[:SLOT_SIZE]
        (stored,) = struct.unpack_from("<I", raw, SLOT.size)
        if stored != crc32c.crc32c(raw[:SLOT.size]) or not any(raw):
            return None
        gen, end, count, c0, c1, c2, c3, flags = SLOT.unpack_from(raw, 0)
        if end < HEADER_SIZE:
            return None
        return cls(gen, end, count, (c0, c1, c2, c3), bool(flags & FLAG_SEALED))

    def same_state(self, other: Checkpoint) -> bool:
        """True if both describe the same records, counters and seal."""
        return (self.end, self.count, self.counters, self.sealed) == (
            other.end, other.count, other.counters, other.sealed)


def initial_header(identity: Identity) -> bytearray:
    """A new journal's header: the identity, and an empty checkpoint (generation 0) in slot 0."""
    buf = identity.encode()
    buf[SLOT_OFFSETS[0]:SLOT_OFFSETS[0] + SLOT_SIZE] = Checkpoint().encode()
    return buf


def read_checkpoints(header: bytes | memoryview) -> tuple[Checkpoint | None, Checkpoint | None]:
    """Both slots, each None when empty or damaged."""
    view = memoryview(header)
    return tuple(Checkpoint.decode(view[off:off + SLOT_SIZE]) for off in SLOT_OFFSETS)  # type: ignore[return-value]


def newest(slots: tuple[Checkpoint | None, Checkpoint | None]) -> tuple[int, Checkpoint]:
    """The newest valid checkpoint and its slot; an empty one if none is valid."""
    best = (0, Checkpoint(generation=-1))
    for i, slot in enumerate(slots):
        if slot is not None and slot.generation > best[1].generation:
            best = (i, slot)
    if best[1].generation < 0:
        return 0, Checkpoint()
    return best
