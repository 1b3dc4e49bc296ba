"""Replies an owner thread makes during one batch of work leave together (shardmgr/server/sending.py)."""

from __future__ import annotations

import functools
import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from common.wire import framing
from common.wire.frame_reader import FrameReader
from common.wire.reply_batch import batched_replies
from shardmgr.server.config import ServerConfig
from shardmgr.server.connection import Connection


class CountingSocket(socket.socket):
    """A socket that notes the buffer count of each ``sendmsg`` (the send
    path's one syscall), seen whichever build calls it."""

    sends: list[int]

    def sendmsg(self, buffers: Any, *args: Any) -> int:  # type: ignore[override]
        buffers = list(buffers)
        self.sends.append(len(buffers))
        return super().sendmsg(buffers, *args)


@pytest.fixture
def pair() -> Iterator[tuple[Connection, socket.socket, list[int]]]:
    """A connection (no threads started: the test is a component's thread) and its peer's socket."""
    plain, theirs = socket.socketpair()
    ours = CountingSocket(plain.family, plain.type, fileno=plain.detach())
    ours.sends = []
    connection = Connection(ours, "peer", ServerConfig(), lambda request, principal: None, lambda c: None,
                            lambda code: None)
    connection.sending._handshaken = True
    yield connection, theirs, ours.sends
    ours.close()
    theirs.close()


def _frames(sock: socket.socket, count: int) -> list[framing.Frame]:
    reader = FrameReader(sock)
    frames = []
    for _ in range(count):
        frame = reader.read()
        assert frame is not None
        frames.append(frame)
    return frames


def test_replies_made_in_one_batch_leave_in_one_send(pair: tuple[Connection, socket.socket, list[int]]) -> None:
    connection, theirs, sends = pair
    written: list[int] = []
    connection.sending._pending = 3
    with batched_replies():
        for n in range(3):
            connection.respond({"id": n + 1, "ok": {"n": n}}, {"x": np.arange(n, dtype="<u8")},
                               functools.partial(written.append, n))
        assert sends == [] and written == []
    assert len(sends) == 1 and written == [0, 1, 2] and connection.sending._pending == 0
    frames = _frames(theirs, 3)
    assert [f.header["id"] for f in frames] == [1, 2, 3]
    assert [f.parts["x"].tolist() for f in frames] == [[], [0], [0, 1]]


def test_outside_a_batch_a_reply_leaves_at_once(pair: tuple[Connection, socket.socket, list[int]]) -> None:
    connection, theirs, sends = pair
    written: list[int] = []
    connection.sending._pending = 2
    connection.respond({"id": 1, "ok": {}}, None, lambda: written.append(1))
    assert len(sends) == 1 and written == [1]
    connection.respond({"id": 2, "ok": {}}, None, None)
    assert len(sends) == 2 and connection.bytes_out > 0
    assert [f.header for f in _frames(theirs, 2)] == [{"id": 1, "ok": {}}, {"id": 2, "ok": {}}]
