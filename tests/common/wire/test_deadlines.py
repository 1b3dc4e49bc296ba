"""Read deadlines (common/wire/deadlines.py): past one, the socket's read
side is shut and a blocked recv returns; a disarmed one never fires."""

from __future__ import annotations

import socket
import time

from common.wire.deadlines import ReadDeadlines


def test_a_deadline_cuts_a_blocked_recv_short() -> None:
    deadlines = ReadDeadlines()
    ours, theirs = socket.socketpair()
    armed = deadlines.arm(ours, time.monotonic() + 0.2)
    assert ours.recv(10) == b""  # blocked until the deadline shut the read side
    assert armed.fired and not deadlines.disarm(armed)
    ours.sendall(b"x")  # only reading was shut: an error frame can still go out
    assert theirs.recv(1) == b"x"
    ours.close()
    theirs.close()


def test_disarmed_deadlines_never_fire_and_others_still_do() -> None:
    deadlines = ReadDeadlines()
    ours, theirs = socket.socketpair()
    for _ in range(500):  # many frames armed and finished in time
        assert deadlines.disarm(deadlines.arm(ours, time.monotonic() + 0.1))
    time.sleep(0.3)
    theirs.sendall(b"data")
    assert ours.recv(10) == b"data"  # none of them shut it
    other, peer = socket.socketpair()
    armed = deadlines.arm(other, time.monotonic() + 0.1)
    assert other.recv(10) == b"" and armed.fired
    for sock in (ours, theirs, other, peer):
        sock.close()
