"""SIGKILL a real process while it appends and flushes; everything it saw
confirmed durable must be intact after recovery, across many lives."""

from __future__ import annotations

import os
import random
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.journal import Flusher, Journal, Marker

from .journal_child import CONFIG, bodies_for

CHILD = Path(__file__).with_name("journal_child.py")


def run_life(path: Path, seed: int, life: int, seconds: float) -> list[str]:
    """Start the child, SIGKILL it after ``seconds``, return every line it printed."""
    proc = subprocess.Popen([sys.executable, str(CHILD), str(path), str(seed), str(life)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    chunks: list[bytes] = []
    deadline = time.monotonic() + seconds
    started = False
    while time.monotonic() < deadline or not started:
        if time.monotonic() > deadline + 20:
            break  # the child never produced output: fail below with its stderr
        for _key, _ in sel.select(timeout=0.01):
            data = os.read(proc.stdout.fileno(), 1 << 16)
            if data:
                chunks.append(data)
                started = True
        if proc.poll() is not None:
            break
    proc.send_signal(signal.SIGKILL)
    rest, err = proc.communicate(timeout=30)
    chunks.append(rest)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    return b"".join(chunks).decode().splitlines()


def check(path: Path, seed: int, confirmed: dict[int, bytes], retired: set[int]) -> None:
    with Flusher() as flusher:
        journal = Journal.open(path, kind=b"KILL", flusher=flusher, config=CONFIG)
        for offset, body in confirmed.items():
            assert journal.read(offset) == body, f"confirmed record at {offset} damaged"
        if retired:
            assert (journal.markers(sorted(retired)) == Marker.RETIRED).all()
        journal.close()


def kill_many(tmp_path: Path, lives: int, seed: int) -> None:
    path = tmp_path / "kill.journal"
    rng = random.Random(seed)
    confirmed: dict[int, bytes] = {}
    retired: set[int] = set()
    for life in range(lives):
        before = set(confirmed)
        for line in run_life(path, seed, life, rng.uniform(0.05, 0.6)):
            kind, *fields = line.split()
            if kind == "A":
                _, batch, first, count = map(int, fields)
                bodies = bodies_for(seed, life, batch)
                assert len(bodies) == count
                offset = first
                for body in bodies:
                    confirmed[offset] = body
                    offset += (16 + len(body) + 7) // 8 * 8
            else:
                retired.add(int(fields[0]))
        # this life's records, and a sample of older ones (all of them at the end)
        older = rng.sample(sorted(before), min(len(before), 500))
        check(path, seed, {o: b for o, b in confirmed.items() if o not in before or o in older}, retired)
    check(path, seed, confirmed, retired)
    assert len(confirmed) > lives  # the children really did confirm work


def test_sigkill_during_appends_loses_nothing_confirmed(tmp_path: Path) -> None:
    kill_many(tmp_path, lives=8, seed=1)


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_sigkill_soak(tmp_path: Path) -> None:
    kill_many(tmp_path, lives=150, seed=2)
