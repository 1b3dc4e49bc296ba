from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from common.journal import Flusher, FlusherConfig, Journal, JournalClosed, syncer
from common.journal.header import HEADER_SIZE, newest, read_checkpoints


def test_flush_now_covers_every_earlier_write(tmp_path: Path) -> None:
    with Flusher(FlusherConfig(interval=3600)) as flusher:
        journals = [Journal.create(tmp_path / f"j{i}", kind=b"TEST", flusher=flusher) for i in range(3)]
        tickets = [j.append(b"x" * 100)[1] for j in journals]
        assert not any(t.durable for t in tickets)
        flusher.flush_now(timeout=5)
        assert all(t.durable for t in tickets)
        for j in journals:
            j.close()


def test_waiters_in_many_threads_are_released_by_rounds(tmp_path: Path, flusher: Flusher) -> None:
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=flusher)
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            for _ in range(50):
                _, ticket = journal.append(b"y" * 64)  # appends serialise on the journal lock
                journal.wait_durable(ticket, timeout=5)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and journal.count == 200
    assert flusher.stats.rounds > 1 and flusher.stats.syncs >= 1
    journal.close()


def test_wait_times_out_while_the_flush_is_slower(tmp_path: Path) -> None:
    from unittest import mock

    real = os.fdatasync

    def slow(fd: int) -> None:
        time.sleep(0.3)
        real(fd)

    with Flusher(FlusherConfig(interval=3600)) as flusher:
        journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=flusher)
        _, ticket = journal.append(b"z")
        with mock.patch("os.fdatasync", slow):
            with pytest.raises(TimeoutError):
                journal.wait_durable(ticket, timeout=0.05)
            journal.wait_durable(ticket, timeout=10)  # the round it asked for completes
        journal.close()


def test_a_waiter_does_not_wait_for_the_interval(tmp_path: Path) -> None:
    with Flusher(FlusherConfig(interval=3600)) as flusher:
        journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=flusher)
        started = time.monotonic()
        for _ in range(20):
            _, ticket = journal.append(b"w")
            journal.wait_durable(ticket, timeout=30)
        assert time.monotonic() - started < 30  # each wait started a round at once
        journal.close()


def test_stop_without_flush_leaves_writes_unconfirmed(tmp_path: Path) -> None:
    flusher = Flusher(FlusherConfig(interval=3600)).start()
    journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=flusher)
    _, ticket = journal.append(b"z")
    flusher.stop(flush=False)
    with pytest.raises(JournalClosed, match="flusher"):
        journal.wait_durable(ticket, timeout=1)
    with pytest.raises(JournalClosed):
        flusher.flush_now()
    journal.abandon()


def test_a_checkpoint_alone_waits_for_a_later_write_or_the_lag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(syncer, "CHECKPOINT_LAG_S", 3600.0)
    with Flusher(FlusherConfig(interval=3600)) as flusher:
        journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=flusher)
        journal.append(b"x" * 100)
        flusher.flush_now(timeout=5)  # syncs the record, then writes a checkpoint for it
        syncs = flusher.stats.syncs
        flusher.flush_now(timeout=5)
        flusher.flush_now(timeout=5)
        assert flusher.stats.syncs == syncs  # no fdatasync for the checkpoint alone
        assert newest(read_checkpoints(os.pread(journal._syncer._fd, HEADER_SIZE, 0)))[1].count == 1  # written
        _, ticket = journal.append(b"y" * 100)
        flusher.flush_now(timeout=5)  # one fdatasync: the new record and the checkpoint before it
        assert ticket.durable and flusher.stats.syncs == syncs + 1
        monkeypatch.setattr(syncer, "CHECKPOINT_LAG_S", 0.0)
        flusher.flush_now(timeout=5)  # the lag is over: the checkpoint of both records is synced
        assert flusher.stats.syncs == syncs + 2
        flusher.flush_now(timeout=5)
        assert flusher.stats.syncs == syncs + 2  # and then nothing is left to sync
        assert newest(read_checkpoints(os.pread(journal._syncer._fd, HEADER_SIZE, 0)))[1].count == 2
        journal.close()


def test_close_and_seal_sync_a_lagging_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(syncer, "CHECKPOINT_LAG_S", 3600.0)
    with Flusher(FlusherConfig(interval=3600)) as flusher:
        journal = Journal.create(tmp_path / "j", kind=b"TEST", flusher=flusher)
        journal.append(b"x" * 100)
        flusher.flush_now(timeout=5)
        syncs = []
        real = os.fdatasync
        monkeypatch.setattr(os, "fdatasync", lambda fd: (syncs.append(fd), real(fd))[1])
        journal.seal()
        journal.close()
        assert syncs  # the checkpoint (and the seal's) were made durable, lag or not
    again = Journal.open(tmp_path / "j", kind=b"TEST", writable=False, recount=False)
    assert again.sealed and again.count == 1
    again.close()
