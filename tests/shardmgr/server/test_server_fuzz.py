"""Hundreds of malformed frames against a real server process (thousands under
the soak profile or FUZZ_EXAMPLES: README).

After each one the connection must end cleanly (or answer correctly), and a
separate, long-lived client must still get correct answers. At the end the
server must not have logged a single traceback, and its data directory must
be unchanged.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from common.wire import framing
from common.wire.client import RpcClient
from tests.profiles import examples

from .serverproc import ServerProcess

scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(),
                    st.text(max_size=20), st.binary(max_size=20))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
part_specs = st.lists(st.lists(st.one_of(st.text(max_size=5), st.sampled_from(sorted(framing.DTYPES)),
                                         st.lists(st.integers(-3, 2**41), max_size=3), scalars),
                               max_size=4), max_size=3)
headers = st.one_of(
    values,
    st.fixed_dictionaries({"id": values, "cmd": values}, optional={"args": values, "parts": part_specs}),
    st.fixed_dictionaries({"id": st.integers(0, 2**63 - 1), "cmd": st.sampled_from(["ping", "echo", "stats", "x"])},
                          optional={"args": values, "parts": part_specs}),
)


def frame(header: object, body: bytes, size_delta: int, header_delta: int) -> bytes:
    head = msgpack.packb(header)
    size = max(0, len(head) + len(body) + size_delta) % 2**32
    return struct.pack("<II", size, max(0, len(head) + header_delta) % 2**32) + head + body


malformed = st.one_of(
    st.binary(min_size=1, max_size=200),
    st.builds(frame, headers, st.binary(max_size=64), st.sampled_from([0, 0, 0, -1, 1, 2**31]),
              st.sampled_from([0, 0, -1, 1, 10**6])),
    st.builds(lambda h, cut: frame(h, b"", 0, 0)[:cut], headers, st.integers(1, 30)),
)


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, RpcClient]]:
    proc = ServerProcess(tmp_path_factory.mktemp("fuzz") / "data", "--max-frame-bytes", "65536").start()
    client = RpcClient(proc.address, timeout=10)
    yield proc, client
    client.close()
    proc.kill()


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "LOCK"}


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", examples(300))), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(payload=st.lists(malformed, min_size=1, max_size=3))
# one of each error class the last test counts, whatever the random draw reaches
@example(payload=[frame({"id": 1, "cmd": "ping", "args": 5}, b"", 0, 0)])  # bad_request: args not a map
@example(payload=[frame({"id": 2, "cmd": "x"}, b"", 0, 0)])  # unknown_command
@example(payload=[frame({"id": 3, "cmd": "ping"}, b"", 2**31, 0)])  # frame_too_large
@example(payload=[b"\x05\x00\x00\x00\x09\x00\x00\x00garbage"])  # bad_frame: header longer than the frame
def test_malformed_frames_never_hurt_the_server(fuzz_server: tuple[ServerProcess, RpcClient],
                                                payload: list[bytes]) -> None:
    proc, health = fuzz_server
    before = tree_digest(proc.data_dir)
    sock = socket.create_connection(("127.0.0.1", proc.port), timeout=10)
    try:
        sock.sendall(framing.preamble() + b"".join(payload)
                     + b"".join(bytes(b) for b in framing.encode({"id": 424242, "cmd": "ping"})))
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    except ConnectionResetError:
        data = b""
    finally:
        sock.close()
    assert data[:8] in (b"", framing.preamble())
    pos = 8
    while pos + 8 <= len(data):  # every reply is a well-formed frame
        size, header_size = struct.unpack_from("<II", data, pos)
        header = msgpack.unpackb(data[pos + 8:pos + 8 + header_size])
        assert isinstance(header, dict) and ("ok" in header or "error" in header)
        pos += 8 + size
    assert pos == len(data) or len(data) <= 8
    vec = np.arange(16, dtype=np.float32)
    reply = health.call("echo", {"k": 1}, {"v": vec})
    assert reply.result == {"k": 1} and np.array_equal(reply.parts["v"], vec)
    assert proc.alive()
    assert tree_digest(proc.data_dir) == before


def test_no_tracebacks_after_fuzzing(fuzz_server: tuple[ServerProcess, RpcClient]) -> None:
    proc, health = fuzz_server
    where = [i for i, line in enumerate(proc.log) if "Traceback" in line]
    assert not where, "\n".join(proc.log[max(0, where[0] - 3):where[0] + 30])
    counters = health.call("stats").result["server"]
    for code in ("bad_frame", "frame_too_large", "bad_request", "unknown_command"):  # the fuzzer reached each
        assert counters.get(f"errors_{code}_total", 0) > 0, counters
