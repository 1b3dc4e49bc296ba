"""Rounds run by the thread that waits (Flusher.sync_here) or answers (leader.py)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest

from common.journal import Flusher, FlusherConfig, Journal, Ticket, leader


@pytest.fixture
def synced_on() -> Iterator[list[str]]:
    """The names of the threads that called fdatasync, in order."""
    names: list[str] = []
    real = os.fdatasync

    def recording(fd: int) -> None:
        names.append(threading.current_thread().name)
        real(fd)

    with mock.patch("os.fdatasync", recording):
        yield names


@pytest.fixture
def quiet() -> Iterator[Flusher]:
    """A flusher whose timed rounds never come within a test: only hurried rounds sync."""
    with Flusher(FlusherConfig(interval=3600)) as flusher:
        yield flusher


def in_thread(fn: Callable[[], object], name: str = "server-ish") -> None:
    """Run ``fn`` on a fresh thread (thread-local state starts empty) and re-raise what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    thread = threading.Thread(target=run, name=name)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()
    if errors:
        raise errors[0]


def _watch(ticket: Ticket) -> None:
    """Until ``ticket`` is durable, watched and not waited for (a wait would hurry it itself)."""
    deadline = time.monotonic() + 10
    while not ticket.durable and time.monotonic() < deadline:
        time.sleep(0.001)
    assert ticket.durable


def test_a_waiter_without_a_timeout_syncs_on_its_own_thread(tmp_path: Path, quiet: Flusher,
                                                            synced_on: list[str]) -> None:
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=quiet)
    _, ticket = journal.append(b"x")
    synced_on.clear()
    heard: list[str] = []
    quiet.add_listener(lambda: heard.append(threading.current_thread().name))
    journal.wait_durable(ticket)
    assert ticket.durable
    assert synced_on == [threading.current_thread().name]
    assert heard == [threading.current_thread().name]  # the listeners ran here too
    assert quiet.stats.here == 1
    journal.close()


def test_a_waiter_with_a_timeout_leaves_the_round_to_the_flusher(tmp_path: Path, quiet: Flusher,
                                                                 synced_on: list[str]) -> None:
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=quiet)
    _, ticket = journal.append(b"x")
    synced_on.clear()
    journal.wait_durable(ticket, timeout=5)  # a round here could outlast the timeout
    assert synced_on == ["journal-flusher"] and quiet.stats.here == 0
    journal.close()


def test_no_round_runs_here_while_one_runs_on_the_flusher_thread(tmp_path: Path, quiet: Flusher) -> None:
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=quiet)
    journal.append(b"x")
    entered, gate = threading.Event(), threading.Event()
    real = os.fdatasync

    def gated(fd: int) -> None:
        if threading.current_thread().name == "journal-flusher":
            entered.set()
            assert gate.wait(10)
        real(fd)

    with mock.patch("os.fdatasync", gated):
        quiet.hurry([journal])
        assert entered.wait(10)
        _, ticket = journal.append(b"y")  # after the round began: not covered by it
        assert not quiet.sync_here([journal])
        gate.set()
        journal.wait_durable(ticket, timeout=10)  # the flusher's next round covers it
    assert quiet.stats.here == 0
    journal.close()


def test_no_round_runs_here_once_the_flusher_stopped(tmp_path: Path, synced_on: list[str]) -> None:
    flusher = Flusher(FlusherConfig(interval=3600)).start()
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=flusher)
    _, ticket = journal.append(b"x")
    flusher.stop(flush=False)  # the disk is frozen from here (a power-cut test's stop)
    synced_on.clear()
    assert not flusher.sync_here([journal])
    assert not ticket.durable and synced_on == []
    journal.abandon()


def test_stop_waits_for_a_round_under_way_here(tmp_path: Path) -> None:
    flusher = Flusher(FlusherConfig(interval=3600)).start()
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=flusher)
    _, ticket = journal.append(b"x")
    entered, gate = threading.Event(), threading.Event()
    real = os.fdatasync

    def gated(fd: int) -> None:
        if threading.current_thread().name == "waiter":
            entered.set()
            assert gate.wait(10)
        real(fd)

    with mock.patch("os.fdatasync", gated):
        waiter = threading.Thread(target=journal.wait_durable, args=(ticket,), name="waiter")
        waiter.start()
        assert entered.wait(10)
        stopper = threading.Thread(target=flusher.stop, kwargs={"flush": False})
        stopper.start()
        stopper.join(0.3)
        assert stopper.is_alive(), "stop returned while a round still ran on the waiter's thread"
        gate.set()
        stopper.join(10)
        waiter.join(10)
    assert not stopper.is_alive() and not waiter.is_alive() and ticket.durable
    journal.close()


def test_a_window_keeps_its_waits_until_it_leads(tmp_path: Path, quiet: Flusher,
                                                         synced_on: list[str]) -> None:
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=quiet)

    def serving() -> None:
        leader.begin()
        _, ticket = journal.append(b"x")
        synced_on.clear()
        leader.hurry(quiet, [journal])
        leader.hurry(quiet, [journal])  # asked twice: synced once
        assert not ticket.durable and synced_on == []  # nothing syncs before the request's end
        assert leader.lead()
        assert ticket.durable and synced_on == ["server-ish"]
        assert not leader.lead()  # nothing left
        _, later = journal.append(b"y")  # after the window closed (a sent reply's callback, a close)
        leader.hurry(quiet, [journal])
        _watch(later)  # hurried to the flusher thread at once, not kept for a window that may never come
        assert synced_on[-1] == "journal-flusher"

    in_thread(serving)
    journal.close()


def test_a_window_hands_off_while_requests_are_buffered(tmp_path: Path, quiet: Flusher,
                                                                synced_on: list[str]) -> None:
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=quiet)

    def serving() -> None:
        leader.begin()
        _, ticket = journal.append(b"x")
        synced_on.clear()
        leader.hurry(quiet, [journal])
        assert leader.hand_off()
        journal.wait_durable(ticket, timeout=10)
        assert synced_on == ["journal-flusher"]

    in_thread(serving)
    journal.close()


def test_hurry_outside_a_window_wakes_the_flusher(tmp_path: Path, quiet: Flusher,
                                                                 synced_on: list[str]) -> None:
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=quiet)

    def plain() -> None:
        _, ticket = journal.append(b"x")
        synced_on.clear()
        leader.hurry(quiet, [journal])
        journal.wait_durable(ticket, timeout=10)
        assert synced_on == ["journal-flusher"]
        assert not leader.lead()

    in_thread(plain)
    journal.close()


def test_a_leading_block_syncs_its_waits_at_its_end_and_only_then(tmp_path: Path, quiet: Flusher,
                                                                  synced_on: list[str]) -> None:
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=quiet)

    def caller() -> None:
        with leader.leading():
            _, ticket = journal.append(b"x")
            synced_on.clear()
            leader.hurry(quiet, [journal])
            assert not ticket.durable
        assert ticket.durable and synced_on == ["server-ish"]
        _, later = journal.append(b"y")  # after the block: hurried to the flusher thread as before
        leader.hurry(quiet, [journal])
        journal.wait_durable(later, timeout=10)
        assert synced_on[-1] == "journal-flusher"

    in_thread(caller)
    journal.close()


def test_what_a_led_rounds_listeners_hurry_goes_to_the_flusher_at_once(tmp_path: Path, quiet: Flusher,
                                                                         synced_on: list[str]) -> None:
    first = Journal.create(tmp_path / "a", kind=b"TEST", flusher=quiet)
    second = Journal.create(tmp_path / "b", kind=b"TEST", flusher=quiet)
    _, later = second.append(b"next")
    asked: list[bool] = []

    def continuation() -> None:  # a continuation's next write, hurried from the round's listener
        if not asked:
            asked.append(True)
            leader.hurry(quiet, [second])

    quiet.add_listener(continuation)

    def serving() -> None:
        leader.begin()
        _, ticket = first.append(b"x")
        leader.hurry(quiet, [first])
        assert leader.lead() and ticket.durable
        _watch(later)  # not left for a next request that never comes
        assert synced_on[-1] == "journal-flusher"
        assert not leader.lead()

    in_thread(serving)
    first.close()
    second.close()
