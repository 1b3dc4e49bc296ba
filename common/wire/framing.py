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
import socket
import ssl
import struct
import time
from collections.abc import Mapping
from typing import Any, Protocol

import msgpack
import numpy as np

from .budget import ByteBudget
from .deadlines import READ_DEADLINES, Deadline
from .errors import BadFrame, FrameTimeout, FrameTooLarge

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

READ_BUFFER_BYTES = 16 << 10
"""Each reader's own buffer (resident for the connection's life): frames up
to this size are parsed out of it; larger ones get memory of their own."""
FIRST_STEP_BYTES = 8 << 20
"""A larger frame's memory starts at most this big and doubles as its bytes
arrive: frames up to this size are received with no copy."""
JOINED_FRAME_BYTES = 16 << 10
"""Frames up to this size are encoded as one buffer (see encode)."""
SMALL_PART_BYTES = 4 << 10
"""Parts up to this size are copied while encoding (larger ones are sent from their own memory)."""
_PADDING = [bytes(n) for n in range(PART_ALIGN)]
_DTYPE = {code: np.dtype(code) for code in DTYPES}  # parsed once: decoding looks them up
_CODE = {dtype: code for code, dtype in _DTYPE.items()}  # dtype.str, looked up (computing it costs more)
IOV_MAX = 1024
"""Most buffers one sendmsg takes (Linux's limit)."""
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
        sent = sock.sendmsg(views[:IOV_MAX])
        while sent:
            if sent >= len(views[0]):
                sent -= len(views[0])
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0


def send_some(sock: socket.socket, buffers: list[bytes | memoryview]) -> list[memoryview]:
    """One non-blocking ``sendmsg`` of the buffers (not TLS); returns what
    it did not send (empty: all of it). Never blocks; OSError other than
    "would block" is raised. Each buffer's ``len`` is its size in bytes
    (bytes, or byte-format memoryviews: what encode makes)."""
    try:
        sent = sock.sendmsg(buffers[:IOV_MAX], [], socket.MSG_DONTWAIT)
    except BlockingIOError:
        sent = 0
    if len(buffers) <= IOV_MAX and sent == sum(map(len, buffers)):
        return []
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while sent and views:
        if sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        else:
            views[0] = views[0][sent:]
            sent = 0
    return views


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
    """A frame as a list of buffers for ``socket.sendmsg``.

    A frame of at most JOINED_FRAME_BYTES is one buffer (one iovec to send:
    copying a few small arrays costs less than describing them); larger
    parts are not copied. Either way the bytes are the same.
    """
    if not parts:
        head = _packed_header(header)
        return [FRAME_HEAD.pack(len(head), len(head)) + head]
    if len(parts) > MAX_PARTS:
        raise ValueError(f"a frame carries at most {MAX_PARTS} parts, got {len(parts)}")
    specs = []
    datas: list[bytes | memoryview] = []
    size = 0
    for name, array in parts.items():
        if type(array) is not np.ndarray:
            array = np.asarray(array)
        shape = array.shape
        if len(shape) > MAX_RANK or not 0 < len(name) <= MAX_PART_NAME:
            raise ValueError(f"part {name!r} of shape {shape}: frames carry parts of at most "
                             f"{MAX_RANK} dimensions, named by 1-{MAX_PART_NAME} characters")
        code = _CODE.get(array.dtype)
        if code is None:
            array = _little_endian(name, array)
            code = array.dtype.str
        specs.append([name, code, list(shape)])
        pad = -size % PART_ALIGN
        if pad:
            datas.append(_PADDING[pad])
        nbytes = array.nbytes
        datas.append(array.tobytes() if nbytes <= SMALL_PART_BYTES else _view(array))
        size += pad + nbytes
    head = _packed_header({**header, "parts": specs})
    first = FRAME_HEAD.pack(len(head) + size, len(head)) + head
    if len(first) + size <= JOINED_FRAME_BYTES:
        return [b"".join([first, *datas])]
    return [first, *datas]


def _view(array: np.ndarray) -> memoryview:
    """A large part's bytes, not copied if it is C-contiguous (1-d first: empty arrays too;
    not ascontiguousarray: it makes a 0-d array 1-d)."""
    return np.asarray(array, order="C").reshape(-1).data.cast("B")


def _packed_header(header: Mapping[str, Any]) -> bytes:
    head: bytes = msgpack.packb(header)
    if len(head) > MAX_HEADER_BYTES:
        raise ValueError(f"frame header is {len(head)} bytes; the limit is {MAX_HEADER_BYTES}")
    return head


def _little_endian(name: str, array: np.ndarray) -> np.ndarray:
    """A big-endian part as little-endian (TypeError for a dtype frames cannot carry)."""
    dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == ">" else array.dtype
    if dtype.str not in DTYPES:
        raise TypeError(f"part {name!r} has dtype {array.dtype}, which frames cannot carry")
    return array.astype(dtype)


def dtype_code(dtype: np.dtype[Any]) -> str:
    """``dtype.str`` (looked up for the dtypes frames carry: computing it costs more)."""
    return _CODE.get(dtype) or dtype.str


def decode_parts(specs: Any, body: memoryview) -> dict[str, np.ndarray]:
    """Check ``parts`` specs against the body and return read-only array views."""
    if not isinstance(specs, list):
        raise BadFrame("header 'parts' must be a list of [name, dtype, shape]")
    if len(specs) > MAX_PARTS:
        raise BadFrame(f"a frame carries at most {MAX_PARTS} parts, got {len(specs)}")
    parts: dict[str, np.ndarray] = {}
    offset = 0
    for spec in specs:
        count = _spec_count(spec)
        name, dtype, shape = spec
        if name in parts:
            raise BadFrame(f"part name {name!r} appears twice in the frame's parts")
        offset += -offset % PART_ALIGN
        kind = _DTYPE[dtype]
        nbytes = count * kind.itemsize
        if offset + nbytes > len(body):
            raise BadFrame(f"part {name!r} ({nbytes} bytes at {offset}) runs past the {len(body)}-byte body")
        parts[name] = np.ndarray(tuple(shape), kind, body, offset)  # like frombuffer, a view (read-only if body is)
        offset += nbytes
    if offset != len(body):
        raise BadFrame(f"the body has {len(body)} bytes but its parts describe {offset}")
    return parts


def _spec_count(spec: Any) -> int:
    """The number of elements a part spec describes; BadFrame if it is malformed."""
    if (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str) and 0 < len(spec[0]) <= MAX_PART_NAME
            and isinstance(spec[1], str) and spec[1] in DTYPES and isinstance(spec[2], list)
            and len(spec[2]) <= MAX_RANK):
        count = 1
        for dim in spec[2]:
            if not isinstance(dim, int) or isinstance(dim, bool) or not 0 <= dim < MAX_DIM:
                break
            count *= dim
        else:
            return count
    raise BadFrame(f"bad part spec {_clipped(spec)}: expected [name of 1-{MAX_PART_NAME} characters, "
                   f"dtype in {sorted(DTYPES)}, at most {MAX_RANK} dims each in 0..2**40-1]")


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

    A frame that fits the reader's own buffer (READ_BUFFER_BYTES) is parsed
    out of it, so many pipelined requests cost one recv, and copied into
    memory of its own. A larger frame is received straight into its own
    memory, allocated as its bytes arrive: at first ``min(size,
    FIRST_STEP_BYTES)``, doubled whenever it is full, so bytes a peer
    declares and never sends cost (almost) nothing.

    With a ``budget`` (shared by all connections), that memory is charged to
    it from allocation until :meth:`release` (while growing, old and new are
    both charged), waiting in turn when the budget is spent. With
    ``frame_timeout_s``, a frame must arrive whole, waits included, within
    that many seconds of its first byte, or FrameTimeout is raised; between
    frames the reader waits for ever. A recv inside a frame is cut short by
    shutting the socket's read side at the deadline (deadlines.py), so
    ``sock`` must then be a real socket (plain or TLS).

    Not thread-safe: one reader per connection, used by one thread.
    """

    def __init__(self, sock: Receiver, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES, *,
                 budget: ByteBudget | None = None, frame_timeout_s: float | None = None) -> None:
        self._sock = sock
        self._max = max_frame_bytes
        self._budget = budget
        self._timeout = frame_timeout_s
        self._buf = bytearray(READ_BUFFER_BYTES)
        self._view = memoryview(self._buf)
        self._start = self._end = 0
        self._deadline: float | None = None  # set while a frame is arriving (with frame_timeout_s)
        self._size = 0  # the arriving frame's size, once its head is read (for error messages)
        self._armed: Deadline | None = None  # the arriving frame's deadline, once a recv needed it
        self._charged = 0  # budget bytes held for the frame being read or the last one read

    def read_exact(self, n: int) -> bytes | None:
        """``n`` bytes, or None on a clean end of stream before the first byte."""
        if not self._fill(n):
            return None
        data = bytes(self._view[self._start:self._start + n])
        self._start += n
        return data

    def read(self) -> Frame | None:
        """The next frame; None if the peer closed cleanly between frames.

        Raises FrameTooLarge or BadFrame for bytes that break the rules,
        FrameTimeout past the frame's deadline, and ConnectionError if the
        stream ends inside a frame. Releases the previous frame's budget first.
        """
        if self._charged:
            self.release()
        if self._start == self._end:
            self._start = self._end = 0
            got = self._recv(self._view)  # between frames: no deadline
            if got == 0:
                return None
            self._end = got
        if self._timeout is not None:
            self._deadline = time.monotonic() + self._timeout
        try:
            frame = self._read_frame()
            if self._armed is not None and not READ_DEADLINES.disarm(self._armed):
                raise self._too_slow()  # it arrived as the read side was being shut
        except BaseException:
            if self._armed is not None:
                READ_DEADLINES.disarm(self._armed)
            self.release()
            self._deadline, self._size, self._armed = None, 0, None
            raise
        self._deadline, self._size, self._armed = None, 0, None
        return frame

    def release(self) -> None:
        """Give back the budget the last frame held: call once the frame has
        been handed on (or the connection ends). Idempotent."""
        if self._charged:
            assert self._budget is not None
            self._budget.release(self._charged)
            self._charged = 0

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

    def _read_frame(self) -> Frame:
        self._fill(FRAME_HEAD.size)  # some bytes are buffered: an end of stream raises
        size, header_size = FRAME_HEAD.unpack_from(self._buf, self._start)
        if size > self._max:
            raise FrameTooLarge(f"frame of {size} bytes exceeds the limit of {self._max}")
        if header_size > size or header_size > MAX_HEADER_BYTES or header_size == 0:
            raise BadFrame(f"frame header size {header_size} is invalid for a frame of {size} bytes")
        self._start += FRAME_HEAD.size
        self._size = size
        if size <= len(self._buf):
            self._fill(size)
            data = memoryview(bytes(self._view[self._start:self._start + size]))
            self._start += size
        else:
            data = self._read_large(size)
        return decode(data, header_size)

    def _read_large(self, size: int) -> memoryview:
        capacity = min(size, FIRST_STEP_BYTES)
        self._charge(capacity)
        view = np.empty(capacity, dtype=np.uint8).data  # no zero-fill: every byte is received
        have = min(size, self._end - self._start)
        view[:have] = self._view[self._start:self._start + have]
        self._start += have
        while have < size:
            if have == len(view):
                view = self._grow(view, have, size)
            got = self._recv(view[have:])
            if got == 0:
                raise ConnectionError("connection closed inside a frame")
            have += got
        return view

    def _grow(self, old: memoryview, have: int, size: int) -> memoryview:
        """Double a large frame's memory (at most to ``size``), keeping ``have`` bytes."""
        capacity = min(size, 2 * len(old))
        self._charge(capacity)  # the old memory stays charged until it is copied
        view = np.empty(capacity, dtype=np.uint8).data
        view[:have] = old[:have]
        self._budget_release(len(old))
        return view

    def _charge(self, n: int) -> None:
        if self._budget is None:
            return
        if not self._budget.acquire(n, self._deadline):
            raise FrameTimeout(f"no memory for a frame of {self._size} bytes within frame_timeout_s="
                               f"{self._timeout:g} s: frames being received hold {self._budget.used} of the "
                               f"{self._budget.limit} bytes allowed (max_inflight_bytes)")
        self._charged += n

    def _budget_release(self, n: int) -> None:
        if self._budget is not None:
            self._budget.release(n)
            self._charged -= n

    def _fill(self, n: int) -> bool:
        """Buffer at least ``n`` unread bytes; False on EOF before any of them."""
        while self._end - self._start < n:
            if self._start and len(self._buf) - self._start < n:
                left = self._end - self._start
                self._view[:left] = self._view[self._start:self._end]
                self._start, self._end = 0, left
            got = self._recv(self._view[self._end:])
            if got == 0:
                if self._end == self._start:
                    return False
                raise ConnectionError("connection closed inside a frame")
            self._end += got
        return True

    def _recv(self, view: memoryview) -> int:
        """One ``recv_into``; while a frame is arriving, cut short at its deadline."""
        if self._deadline is None:
            return self._sock.recv_into(view)
        if self._armed is None:
            if not isinstance(self._sock, socket.socket):
                raise TypeError("frame_timeout_s needs a real socket")
            self._armed = READ_DEADLINES.arm(self._sock, self._deadline)
        try:
            got = self._sock.recv_into(view)
        except OSError as exc:  # a TLS socket reports the shut read side as an error
            if self._armed.fired:
                raise self._too_slow() from exc
            raise
        if not got and self._armed.fired:
            raise self._too_slow()
        return got

    def _too_slow(self) -> FrameTimeout:
        what = f"a frame of {self._size} bytes" if self._size else "a frame's 8-byte head"
        return FrameTimeout(f"{what} did not arrive within frame_timeout_s={self._timeout:g} s")
