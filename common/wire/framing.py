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
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

import msgpack
import numpy as np

from .errors import BadFrame
from .part_views import Layout, PartViews

MAGIC: Final = b"SMWQ"
PROTOCOL_VERSION: Final = 1
PREAMBLE: Final = struct.Struct("<4sI")
FRAME_HEAD: Final = struct.Struct("<II")
MAX_HEADER_BYTES: Final = 1 << 20
PART_ALIGN: Final = 8
DEFAULT_MAX_FRAME_BYTES: Final = 256 << 20
DTYPES: Final = frozenset({"|u1", "|i1", "<u2", "<i2", "<u4", "<i4", "<u8", "<i8", "<f2", "<f4", "<f8"})
"""dtypes a part may have (numpy's ``dtype.str`` spelling)."""
MAX_PARTS: Final = 64
"""Most parts one frame may carry (the commands use at most eight)."""
MAX_PART_NAME: Final = 64
"""Longest part name, in characters (names are unique in a frame, at least one character)."""
MAX_RANK: Final = 8
"""Most dimensions a part may have (numpy itself stops at 64)."""
MAX_DIM: Final = 2**40
"""Every dimension of a part is below this (so a shape's product stays a plain integer check)."""

JOINED_FRAME_BYTES = 16 << 10
"""Frames up to this size are encoded as one buffer (see encode)."""
SMALL_PART_BYTES = 4 << 10
"""Parts up to this size are copied while encoding (larger ones are sent from their own memory)."""
PADDING: Final = [bytes(n) for n in range(PART_ALIGN)]
"""``PADDING[n]``: the n zero bytes that align a part (``n = -offset % PART_ALIGN``)."""
_DTYPE: Final = {code: np.dtype(code) for code in DTYPES}  # parsed once: decoding looks them up
_NO_PARTS: Final = PartViews(memoryview(b""), {})  # a frame without parts (read-only: one serves all)
_CODE: Final = {dtype: code for code, dtype in _DTYPE.items()}  # dtype.str, looked up (computing it costs more)
IOV_MAX: Final = 1024
"""Most buffers one sendmsg takes (Linux's limit)."""
TLS_COALESCE_BYTES: Final = 64 << 10
"""On TLS, buffers smaller than this are joined before sending (see send_buffers)."""
MAX_CACHED_SPECS: Final = 4096
"""Packed part specs kept (encode); the cache starts over past it."""
_SPECS: dict[tuple[str, str, tuple[int, ...]], bytes] = {}
# msgpack's markers for small maps and arrays (its spec: fixmap 0x80-0x8f, fixarray 0x90-0x9f, array 16 0xdc)
FIXMAP: Final = 0x80
FIXMAP_MAX: Final = 15
FIXARRAY: Final = 0x90
FIXARRAY_MAX: Final = 15
ARRAY16: Final = struct.Struct(">BH")
_PARTS_KEY: Final = msgpack.packb("parts")


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


@dataclasses.dataclass(slots=True, repr=False)
class Frame:
    """One decoded frame. ``parts`` are read-only views into the frame's body."""

    header: dict[str, Any]
    parts: Mapping[str, np.ndarray]
    size: int

    # written out: the generated one would run interpreted in the compiled build (shardmgr/build.py)
    def __init__(self, header: dict[str, Any], parts: Mapping[str, np.ndarray], size: int) -> None:
        self.header = header
        self.parts = parts
        self.size = size

    def __repr__(self) -> str:
        """As a dataclass's, but an argument ``token`` (the ``auth`` request's) shows as ``<hidden>``."""
        header = self.header
        args = header.get("args")
        if isinstance(args, dict) and "token" in args:
            header = {**header, "args": {**args, "token": "<hidden>"}}
        return f"Frame(header={header!r}, parts={self.parts!r}, size={self.size!r})"


def preamble() -> bytes:
    return PREAMBLE.pack(MAGIC, PROTOCOL_VERSION)


def parse_preamble(data: bytes) -> int:
    """The peer's protocol version; BadFrame if the bytes are not a preamble."""
    magic, version = PREAMBLE.unpack(data)
    if magic != MAGIC:
        raise BadFrame(f"not a shardmgr/workq connection: expected magic {MAGIC!r}, got {magic!r}")
    return int(version)


class Packed:
    """A frame body laid out already: its parts' packed specs (:func:`part_spec`), in order, and the body's bytes.

    For replies of a fixed layout built from plain integers and bytes (one
    leased item, one status), without an array to inspect: :func:`encode`
    sends ``body`` as it is. Its maker answers for ``body`` matching
    ``specs`` (each part's bytes little-endian, zero padding to PART_ALIGN
    before every part but the first, none after the last: what encoding the
    same parts as arrays gives); the receiver's decode checks it all the same.
    """

    __slots__ = ("specs", "body")

    def __init__(self, specs: list[bytes], body: bytes) -> None:
        self.specs = specs
        self.body = body

    def then(self, other: Packed) -> Packed:
        """This body's parts followed by ``other``'s (their names must differ)."""
        padding = PADDING[-len(self.body) % PART_ALIGN]
        return Packed(self.specs + other.specs, b"".join([self.body, padding, other.body]))


Body: TypeAlias = Mapping[str, np.ndarray] | Packed
"""What a frame carries after its header: arrays by name, or a body laid out already."""


def encode(header: Mapping[str, Any], parts: Body | None = None) -> list[bytes | memoryview]:
    """A frame as a list of buffers for ``socket.sendmsg``.

    A frame of at most JOINED_FRAME_BYTES is one buffer (one iovec to send:
    copying a few small arrays costs less than describing them); larger
    parts are not copied. Either way the bytes are the same.
    """
    if isinstance(parts, Packed):
        return _encode_packed(header, parts)
    if not parts:
        head = _packed_header(header)
        return [FRAME_HEAD.pack(len(head), len(head)) + head]
    if len(parts) > MAX_PARTS:
        raise ValueError(f"a frame carries at most {MAX_PARTS} parts, got {len(parts)}")
    specs: list[bytes] = []
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
        specs.append(_packed_spec(name, code, shape))
        pad = -size % PART_ALIGN
        if pad:
            datas.append(PADDING[pad])
        nbytes = array.nbytes
        datas.append(array.tobytes() if nbytes <= SMALL_PART_BYTES else _view(array))
        size += pad + nbytes
    head = _header_with_parts(header, specs)
    first = FRAME_HEAD.pack(len(head) + size, len(head)) + head
    if len(first) + size <= JOINED_FRAME_BYTES:
        return [b"".join([first, *datas])]
    return [first, *datas]


def _view(array: np.ndarray) -> memoryview:
    """A large part's bytes, not copied if it is C-contiguous (1-d first: empty arrays too;
    not ascontiguousarray: it makes a 0-d array 1-d)."""
    return np.asarray(array, order="C").reshape(-1).data.cast("B")


def _encode_packed(header: Mapping[str, Any], parts: Packed) -> list[bytes | memoryview]:
    if len(parts.specs) > MAX_PARTS:
        raise ValueError(f"a frame carries at most {MAX_PARTS} parts, got {len(parts.specs)}")
    head = _header_with_parts(header, parts.specs)
    size = len(parts.body)
    first = FRAME_HEAD.pack(len(head) + size, len(head)) + head
    if len(first) + size <= JOINED_FRAME_BYTES:
        return [first + parts.body]
    return [first, parts.body]


def part_spec(name: str, code: str, shape: tuple[int, ...]) -> bytes:
    """The packed spec of a part of dtype ``code`` (in DTYPES) and ``shape``, for :class:`Packed`
    (ValueError for a name, dtype or shape frames cannot carry)."""
    if code not in DTYPES or len(shape) > MAX_RANK or not 0 < len(name) <= MAX_PART_NAME:
        raise ValueError(f"part {name!r} of dtype {code!r} and shape {shape}: frames carry parts of a dtype in "
                         f"{sorted(DTYPES)}, of at most {MAX_RANK} dimensions, named by 1-{MAX_PART_NAME} characters")
    return _packed_spec(name, code, shape)


def _packed_spec(name: str, code: str, shape: tuple[int, ...]) -> bytes:
    """The msgpack of one part spec ``[name, dtype, shape]``, packed once per
    distinct spec (a reply of one item packs the same few again and again)."""
    key = (name, code, shape)
    packed = _SPECS.get(key)
    if packed is None:
        packed = msgpack.packb([name, code, list(shape)])
        if len(_SPECS) >= MAX_CACHED_SPECS:
            _SPECS.clear()
        _SPECS[key] = packed
    return packed


def _header_with_parts(header: Mapping[str, Any], specs: list[bytes]) -> bytes:
    """The msgpack of ``{**header, "parts": specs}`` (specs packed already):
    msgpack is made of its elements' bytes, so the header's own map gets one
    more entry and the packed specs are joined after it; the same bytes as
    packing the whole, with the specs packed once (_packed_spec)."""
    if len(header) >= FIXMAP_MAX or "parts" in header:
        return _packed_header({**header, "parts": [msgpack.unpackb(spec) for spec in specs]})
    base: bytes = msgpack.Packer().pack(header)  # not packb: a Python wrapper of this, run on every frame
    count = len(specs)
    listed = bytes((FIXARRAY | count,)) if count <= FIXARRAY_MAX else ARRAY16.pack(0xDC, count)
    head = b"".join([bytes((FIXMAP | (len(header) + 1),)), base[1:], _PARTS_KEY, listed, *specs])
    if len(head) > MAX_HEADER_BYTES:
        raise ValueError(f"frame header is {len(head)} bytes; the limit is {MAX_HEADER_BYTES}")
    return head


def _packed_header(header: Mapping[str, Any]) -> bytes:
    head: bytes = msgpack.Packer().pack(header)  # as in _header_with_parts
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


def decode_parts(specs: Any, body: memoryview) -> PartViews:
    """Check ``parts`` specs against the body and return their views (read-only if the body is)."""
    if not isinstance(specs, list):
        raise BadFrame("header 'parts' must be a list of [name, dtype, shape]")
    if len(specs) > MAX_PARTS:
        raise BadFrame(f"a frame carries at most {MAX_PARTS} parts, got {len(specs)}")
    layouts: dict[str, Layout] = {}
    offset = 0
    for spec in specs:
        count = _spec_count(spec)
        name, dtype, shape = spec
        if name in layouts:
            raise BadFrame(f"part name {name!r} appears twice in the frame's parts")
        offset += -offset % PART_ALIGN
        kind = _DTYPE[dtype]
        nbytes = count * kind.itemsize
        if offset + nbytes > len(body):
            raise BadFrame(f"part {name!r} ({nbytes} bytes at {offset}) runs past the {len(body)}-byte body")
        layouts[name] = (kind, dtype, tuple(shape), offset, count)
        offset += nbytes
    if offset != len(body):
        raise BadFrame(f"the body has {len(body)} bytes but its parts describe {offset}")
    return PartViews(body, layouts)


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
        # msgpack >= 1.0's defaults: str keys and values decoded (raw=False), map keys only str or bytes
        # (strict_map_key); passing them again costs a keyword parse per frame
        header = msgpack.unpackb(frame[:header_size])
    except Exception as exc:  # msgpack raises several types for malformed input
        raise BadFrame(f"frame header is not valid msgpack: {exc}") from exc
    if not isinstance(header, dict):
        raise BadFrame(f"frame header must be a map, got {type(header).__name__}")
    body = frame[header_size:]
    specs = header.pop("parts", None)
    parts = decode_parts(specs, body) if specs is not None else _NO_PARTS
    if specs is None and len(body):
        raise BadFrame(f"the frame has a {len(body)}-byte body but no 'parts' describing it")
    return Frame(header, parts, len(frame) + FRAME_HEAD.size)
