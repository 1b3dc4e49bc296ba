"""Wire framing: length-prefixed frames of a msgpack header plus a raw body.

The full protocol (commands, arguments, error codes) is in docs/protocol.md;
this module is the byte layer. Connection start, both directions::

    0  4  magic     b"SMWQ"
    4  4  version   uint32, PROTOCOL_VERSION

The client sends its preamble first; the server answers with its own. A
server that does not speak the client's version answers with its preamble,
sends an ``unsupported_version`` error frame and closes. Then frames flow::

    0   4  size         bytes after these 8 (header + body), <= the peer's max frame
    4   4  header_size  bytes of msgpack header, <= size and <= MAX_HEADER_BYTES
    8   h  header       a msgpack map (keys below)
    8+h b  body         the frame's arrays ("parts"), each starting at a multiple
                        of 8 bytes from the body start, zero padding between

Header keys. Requests: ``id`` (int, chosen by the client, echoed back),
``cmd`` (str), ``args`` (map, optional). Responses: ``id`` and either ``ok``
(map) or ``error`` (map with ``code`` and ``message``). Either may carry
``parts``: a list of ``[name, dtype, shape]`` describing the body's arrays in
order, so vectors, ids and payloads cross without per-element encoding.
All integers are little-endian.
"""

from __future__ import annotations

import dataclasses
import math
import ssl
import struct
from collections.abc import Mapping
from typing import Any, Protocol

import msgpack
import numpy as np

from .errors import BadFrame, FrameTooLarge

MAGIC = b"SMWQ"
PROTOCOL_VERSION = 1
PREAMBLE = struct.Struct("<4sI")
FRAME_HEAD = struct.Struct("<II")
MAX_HEADER_BYTES = 1 << 20
PART_ALIGN = 8
DEFAULT_MAX_FRAME_BYTES = 256 << 20
DTYPES = frozenset({"|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"})
"""dtypes a part may have (numpy's ``dtype.str`` spelling)."""
MAX_PARTS = 64
"""Most parts one frame may carry (the commands use at most eight)."""
MAX_PART_NAME = 64
"""Longest part name, in characters (names are unique in a frame, at least one character)."""
MAX_RANK = 8
"""Most dimensions a part may have (numpy itself stops at 64)."""
MAX_DIM = 2**40
"""Every dimension of a part is below this (so a shape's product stays a plain integer check)."""

_READ_CHUNK = 256 << 10
TLS_COALESCE_BYTES = 64 << 10
"""On TLS, buffers smaller than this are joined before sending (see send_buffers)."""


def send_buffers(sock: Any, buffers: list[bytes | memoryview]) -> None:
    """Write the buffers completely with ``sendmsg`` (handles partial sends).

    TLS sockets have no ``sendmsg``: there, runs of small buffers are joined
    (one TLS record and one syscall for many small frames) and large ones
    are sent as they are, without a copy (docs/benchmarks.md measures it).
    """
    if isinstance(sock, ssl.SSLSocket):
        _send_tls(sock, buffers)
        return
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        sent = sock.sendmsg(views[:1024])
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def _send_tls(sock: ssl.SSLSocket, buffers: list[bytes | memoryview]) -> None:
    pending: list[bytes | memoryview] = []
    pending_bytes = 0
    for buffer in buffers:
        if len(buffer) >= TLS_COALESCE_BYTES:
            if pending:
                sock.sendall(b"".join(pending))
                pending, pending_bytes = [], 0
            sock.sendall(buffer)
            continue
        pending.append(buffer)
        pending_bytes += len(buffer)
        if pending_bytes >= TLS_COALESCE_BYTES:
            sock.sendall(b"".join(pending))
            pending, pending_bytes = [], 0
    if pending:
        sock.sendall(b"".join(pending))


class Receiver(Protocol):
    def recv_into(self, buffer: memoryview, nbytes: int = ..., flags: int = ...) -> int: ...


@dataclasses.dataclass(slots=True)
class Frame:
    """One decoded frame. ``parts`` are read-only views into the frame's body."""

    header: dict[str, Any]
    parts: dict[str, np.ndarray]
    size: int


def preamble() -> bytes:
    return PREAMBLE.pack(MAGIC, PROTOCOL_VERSION)


def parse_preamble(data: bytes) -> int:
    """The peer's protocol version; BadFrame if the bytes are not a preamble."""
    magic, version = PREAMBLE.unpack(data)
    if magic != MAGIC:
        raise BadFrame(f"not a shardmgr/workq connection: expected magic {MAGIC!r}, got {magic!r}")
    return int(version)


def encode(header: Mapping[str, Any], parts: Mapping[str, np.ndarray] | None = None) -> list[bytes | memoryview]:
    """A frame as a list of buffers for ``socket.sendmsg`` (arrays are not copied)."""
    buffers: list[bytes | memoryview] = []
    size = 0
    if parts:
        specs = []
        if len(parts) > MAX_PARTS:
            raise ValueError(f"a frame carries at most {MAX_PARTS} parts, got {len(parts)}")
        for name, array in parts.items():
            array = np.asarray(array, order="C")  # not ascontiguousarray: it makes a 0-d array 1-d
            if array.ndim > MAX_RANK or not 0 < len(name) <= MAX_PART_NAME:
                raise ValueError(f"part {name!r} of shape {array.shape}: frames carry parts of at most "
                                 f"{MAX_RANK} dimensions, named by 1-{MAX_PART_NAME} characters")
            dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
            if dtype.str not in DTYPES:
                raise TypeError(f"part {name!r} has dtype {array.dtype}, which frames cannot carry")
            specs.append([name, dtype.str, list(array.shape)])
            pad = -size % PART_ALIGN
            if pad:
                buffers.append(bytes(pad))
            data = array.astype(dtype, copy=False).reshape(-1).data.cast("B")  # 1-d first: empty arrays too
            buffers.append(data)
            size += pad + data.nbytes
        header = {**header, "parts": specs}
    head = msgpack.packb(header)
    if len(head) > MAX_HEADER_BYTES:
        raise ValueError(f"frame header is {len(head)} bytes; the limit is {MAX_HEADER_BYTES}")
    return [FRAME_HEAD.pack(len(head) + size, len(head)) + head, *buffers]


def decode_parts(specs: Any, body: memoryview) -> dict[str, np.ndarray]:
    """Check ``parts`` specs against the body and return read-only array views."""
    if not isinstance(specs, list):
        raise BadFrame("header 'parts' must be a list of [name, dtype, shape]")
    if len(specs) > MAX_PARTS:
        raise BadFrame(f"a frame carries at most {MAX_PARTS} parts, got {len(specs)}")
    parts: dict[str, np.ndarray] = {}
    offset = 0
    for spec in specs:
        if (not isinstance(spec, list) or len(spec) != 3 or not isinstance(spec[0], str)
                or not 0 < len(spec[0]) <= MAX_PART_NAME or not isinstance(spec[1], str) or spec[1] not in DTYPES
                or not isinstance(spec[2], list) or len(spec[2]) > MAX_RANK
                or not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < MAX_DIM for d in spec[2])):
            raise BadFrame(f"bad part spec {_clipped(spec)}: expected [name of 1-{MAX_PART_NAME} characters, "
                           f"dtype in {sorted(DTYPES)}, at most {MAX_RANK} dims each in 0..2**40-1]")
        name, dtype, shape = spec
        if name in parts:
            raise BadFrame(f"part name {name!r} appears twice in the frame's parts")
        offset += -offset % PART_ALIGN
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if offset + nbytes > len(body):
            raise BadFrame(f"part {name!r} ({nbytes} bytes at {offset}) runs past the {len(body)}-byte body")
        array = np.frombuffer(body, dtype=dtype, count=nbytes // np.dtype(dtype).itemsize, offset=offset)
        parts[name] = array.reshape(shape)
        offset += nbytes
    if offset != len(body):
        raise BadFrame(f"the body has {len(body)} bytes but its parts describe {offset}")
    return parts


def _clipped(spec: Any) -> str:
    """A part spec for an error message, cut short (a spec may be as large as the header)."""
    text = repr(spec)
    return text if len(text) <= 200 else text[:200] + "..."


def decode(frame: memoryview, header_size: int) -> Frame:
    """Decode a frame's header and parts (``frame`` excludes the 8-byte head)."""
    try:
        header = msgpack.unpackb(frame[:header_size], raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for malformed input
        raise BadFrame(f"frame header is not valid msgpack: {exc}") from exc
    if not isinstance(header, dict):
        raise BadFrame(f"frame header must be a map, got {type(header).__name__}")
    body = frame[header_size:]
    specs = header.pop("parts", None)
    parts = decode_parts(specs, body) if specs is not None else {}
    if specs is None and len(body):
        raise BadFrame(f"the frame has a {len(body)}-byte body but no 'parts' describing it")
    return Frame(header, parts, len(frame) + FRAME_HEAD.size)


class FrameReader:
    """Reads whole frames from a blocking socket, buffering small ones.

    Small frames are parsed out of one shared read buffer (so many pipelined
    requests cost one recv) and copied into their own memory; a frame larger
    than the buffer is received straight into its own bytearray. Not
    thread-safe: one reader per connection.
    """

    def __init__(self, sock: Receiver, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._sock = sock
        self._max = max_frame_bytes
        self._buf = bytearray(_READ_CHUNK)
        self._view = memoryview(self._buf)
        self._start = self._end = 0

    def read_exact(self, n: int) -> bytes | None:
        """``n`` bytes, or None on a clean end of stream before the first byte."""
        if not self._fill(n):
            return None
        data = bytes(self._view[self._start:self._start + n])
        self._start += n
        return data

    def read(self) -> Frame | None:
        """The next frame; None if the peer closed cleanly between frames.

        Raises FrameTooLarge or BadFrame for bytes that break the rules, and
        ConnectionError if the stream ends inside a frame.
        """
        if not self._fill(FRAME_HEAD.size):
            return None
        size, header_size = FRAME_HEAD.unpack_from(self._buf, self._start)
        if size > self._max:
            raise FrameTooLarge(f"frame of {size} bytes exceeds the limit of {self._max}")
        if header_size > size or header_size > MAX_HEADER_BYTES or header_size == 0:
            raise BadFrame(f"frame header size {header_size} is invalid for a frame of {size} bytes")
        self._start += FRAME_HEAD.size
        if size <= len(self._buf):
            if not self._fill(size):
                raise ConnectionError("connection closed inside a frame")
            data = memoryview(bytes(self._view[self._start:self._start + size]))
            self._start += size
        else:
            data = self._read_large(size)
        return decode(data, header_size)

    @property
    def max_frame_bytes(self) -> int:
        """Frames larger than this are refused (FrameTooLarge); may be changed between frames."""
        return self._max

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        self._max = value

    def frame_buffered(self) -> bool:
        """True if a whole frame is already buffered (the next read won't block)."""
        have = self._end - self._start
        return have >= FRAME_HEAD.size and have >= FRAME_HEAD.size + FRAME_HEAD.unpack_from(self._buf, self._start)[0]

    def _read_large(self, size: int) -> memoryview:
        view = np.empty(size, dtype=np.uint8).data  # no zero-fill: every byte is received
        have = min(size, self._end - self._start)
        view[:have] = self._view[self._start:self._start + have]
        self._start += have
        while have < size:
            got = self._sock.recv_into(view[have:])
            if got == 0:
                raise ConnectionError("connection closed inside a frame")
            have += got
        return view

    def _fill(self, n: int) -> bool:
        """Buffer at least ``n`` unread bytes; False on EOF before any of them."""
        while self._end - self._start < n:
            if self._start and len(self._buf) - self._start < n:
                left = self._end - self._start
                self._view[:left] = self._view[self._start:self._end]
                self._start, self._end = 0, left
            got = self._sock.recv_into(self._view[self._end:])
            if got == 0:
                if self._end == self._start:
                    return False
                raise ConnectionError("connection closed inside a frame")
            self._end += got
        return True
