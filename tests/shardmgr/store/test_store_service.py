"""The vector store through a real ``shardmgr serve`` process, and its service component in-process."""

from __future__ import annotations

import errno
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import common.journal.syncer
import shardmgr
from common.journal import Flusher, FlushFailed
from common.wire.client import TimedOut
from common.wire.component import OnSent, Request
from common.wire.errors import BadRequest, DurabilityLost
from shardmgr.errors import BadName, BadVectors, CollectionConflict, RowDeleted, UnknownCollection, UnknownRef
from shardmgr.store.config import StoreConfig
from shardmgr.store.service import StoreService
from tests.shardmgr.server.serverproc import ServerProcess


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "data").start()
    yield proc
    proc.kill()


def test_append_search_get_over_the_wire(server: ServerProcess) -> None:
    with shardmgr.connect(server.address) as client:
        client.create_collection("docs", 24, "ip")
        assert client.collections() == ["docs"]
        data = np.random.default_rng(1).standard_normal((500, 24)).astype(np.float32)
        refs = client.append("docs", data, np.arange(500) + 7, durable=True)
        scores, ids, found = client.search("docs", data[:10], k=5)
        assert scores.shape == ids.shape == found.shape == (10, 5)
        np.testing.assert_allclose(scores[:, 0], np.sort(data[:10] @ data.T, axis=1)[:, -1], rtol=1e-5)
        np.testing.assert_array_equal(client.get("docs", refs[[3, 499]]), data[[3, 499]])
        np.testing.assert_array_equal(client.ids("docs", refs[:3]), [7, 8, 9])
        assert client.collection_info("docs")["rows"] == 500
        client.flush()


def test_call_timeouts_grow_with_the_request_and_can_be_set_per_call(server: ServerProcess) -> None:
    """A stopped server answers nothing: the client's 1 s then cuts a small
    search short, while a large one waits for its allowance (nq x dim). (1 s,
    not less: on a loaded machine the calls around the stalls must not time out.)"""
    def stalled_for(seconds: float) -> threading.Timer:
        server.signal(signal.SIGSTOP)
        stat = Path(f"/proc/{server.proc.pid}/stat")  # type: ignore[union-attr]
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "T":  # stopped for real: no reply can slip out
            time.sleep(0.001)
        resume = threading.Timer(seconds, server.signal, (signal.SIGCONT,))
        resume.start()
        return resume

    with shardmgr.connect(server.address, timeout=1.0) as client:
        client.create_collection("c", 64)
        data = np.random.default_rng(5).standard_normal((1000, 64)).astype(np.float32)
        refs = client.append("c", data, np.arange(1000))
        resume = stalled_for(2.5)
        try:
            started = time.monotonic()
            _, ids, _ = client.search("c", data, k=1)  # 64,000 query values: allowed 64 s more
            assert time.monotonic() - started >= 2.4
            np.testing.assert_array_equal(ids[:, 0], np.arange(1000))
            resume.join()
            resume = stalled_for(30.0)
            started = time.monotonic()
            with pytest.raises(TimedOut, match="no reply .* within 1.06"):  # 1 s + 64 values x 1 ms
                client.search("c", data[:1], k=1)
            assert time.monotonic() - started < 5
        finally:
            resume.cancel()
            server.signal(signal.SIGCONT)
        assert client.collections() == ["c"]  # reconnects
        resume = stalled_for(30.0)
        try:
            with pytest.raises(TimedOut):  # its own timeout, not the allowance of a large get
                client.get("c", refs, timeout=0.5)
        finally:
            resume.cancel()
            server.signal(signal.SIGCONT)
        assert client.collections() == ["c"]
        resume = stalled_for(2.0)
        try:
            np.testing.assert_array_equal(client.search("c", data[:1], k=1, timeout=None)[1], [[0]])
            assert client.rpc._sock is not None and client.rpc._sock.gettimeout() == 1.0  # the client's again
        finally:
            resume.cancel()
            server.signal(signal.SIGCONT)
        with pytest.raises(ValueError, match="timeout"):
            client.search("c", data[:1], timeout=-1.0)


def test_delete_over_the_wire(server: ServerProcess) -> None:
    with shardmgr.connect(server.address) as client:
        client.create_collection("c", 8)
        data = np.random.default_rng(3).standard_normal((100, 8)).astype(np.float32)
        refs = client.append("c", data, np.arange(100) % 10)
        assert client.delete("c", refs[:5], durable=True) == 5
        assert client.delete_ids("c", np.array([9], np.uint8), durable=True) == 10  # rows 9, 19, ..., 99
        assert client.delete("c", refs[[0, 9]]) == 0
        with pytest.raises(RowDeleted, match=str(int(refs[19]))):
            client.get("c", refs[[10, 19]])
        with pytest.raises(UnknownRef):
            client.delete("c", [int(refs[6]), int(refs[-1]) + 1])
        with pytest.raises(BadVectors, match="1-D"):
            client.delete_ids("c", np.zeros((2, 2), np.int64))
        _, ids, found = client.search("c", data[:10], k=3)
        assert not np.isin(found, refs[:5]).any() and not (ids == 9).any()
        info = client.collection_info("c")
        assert (info["rows"], info["deleted"]) == (85, 15)
        np.testing.assert_array_equal(client.get("c", refs[[5, 6]]), data[[5, 6]])


def test_wire_errors_are_typed_and_change_nothing(server: ServerProcess) -> None:
    with shardmgr.connect(server.address) as client:
        client.create_collection("c", 4)
        refs = client.append("c", np.ones((2, 4), np.float32), [1, 2])
        with pytest.raises(CollectionConflict):
            client.create_collection("c", 8)
        for bad in ("../c", "abc\n", "a\x01"):
            with pytest.raises(BadName, match="collection name must be") as raised:
                client.create_collection(bad, 4)
            assert isinstance(raised.value, BadRequest) and not isinstance(raised.value, BadVectors)
        assert client.collections() == ["c"]
        with pytest.raises(UnknownCollection):
            client.search("nope", np.ones((1, 4), np.float32))
        with pytest.raises(BadVectors, match="shape"):
            client.append("c", np.ones((2, 3), np.float32), [1, 2])
        with pytest.raises(BadVectors, match="NaN"):
            client.append("c", np.array([[np.nan, 0, 0, 0]], np.float32), [1])
        with pytest.raises(BadVectors, match="floating point"):  # the same errors as embedded
            client.append("c", np.ones((2, 4), np.int32), [1, 2])
        with pytest.raises(BadVectors, match="ids must be integers"):
            client.append("c", np.ones((2, 4), np.float32), [1.0, 2.0])
        with pytest.raises(UnknownRef):
            client.get("c", [refs[-1] + 1])
        with pytest.raises(BadVectors, match="integer"):  # never truncated to another row's ref
            client.get("c", np.array([refs[-1] + 0.5]))
        with pytest.raises(BadVectors, match="k must be"):
            client.search("c", np.ones((1, 4), np.float32), k=-1)
        with pytest.raises(BadRequest, match="'k'"):
            client.search("c", np.ones((1, 4), np.float32), k=2.5)
        assert client.collection_info("c")["rows"] == 2
        one = client.append("c", np.ones(4, np.float32), [3])  # a single vector, as embedded takes it
        _, _, nearest = client.search("c", np.ones(4, np.float32), k=np.int64(3))
        assert nearest.shape == (1, 3) and len(one) == 1
        assert client.collection_info("c")["rows"] == 3


class Answers:
    """A responder keeping what the service answered."""

    def __init__(self) -> None:
        self.headers: list[dict[str, Any]] = []

    def respond(self, header: dict[str, Any], parts: dict[str, np.ndarray] | None, on_sent: OnSent | None) -> None:
        self.headers.append(header)


class PublicStore:
    """Only the Store's public append: all the service may call to append."""

    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls: list[tuple[str, bool]] = []

    def append(self, name: str, vectors: Any, ids: Any, durable: bool = False) -> np.ndarray:
        self.calls.append((name, durable))
        if self.error is not None:
            raise self.error
        return np.arange(len(ids), dtype=np.int64)


def append_request(answers: Answers, durable: bool) -> Request:
    return Request(1, "shardmgr.append", {"name": "c", "durable": durable},
                   {"vectors": np.ones((2, 4), np.float32), "ids": np.arange(2)}, answers)


@pytest.mark.parametrize("durable", [False, True])
def test_append_goes_through_the_public_store_api(tmp_path: Path, flusher: Flusher, durable: bool) -> None:
    service = StoreService(tmp_path, StoreConfig(), flusher)
    service.store = PublicStore()  # type: ignore[assignment]
    answers = Answers()
    service.handle(append_request(answers, durable))
    assert service.store.calls == [("c", durable)]  # type: ignore[attr-defined]
    assert answers.headers == [{"id": 1, "ok": {"rows": 2}}]


def test_a_lost_flush_is_durability_lost_on_the_wire(tmp_path: Path, flusher: Flusher) -> None:
    service = StoreService(tmp_path, StoreConfig(), flusher)
    service.store = PublicStore(FlushFailed("fdatasync failed: EIO"))  # type: ignore[assignment]
    with pytest.raises(DurabilityLost, match="EIO"):
        service.handle(append_request(Answers(), durable=True))


def test_a_real_failed_fdatasync_fails_a_durable_append(tmp_path: Path, flusher: Flusher,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    service = StoreService(tmp_path, StoreConfig(), flusher)
    service.recover()
    service.start()
    try:
        service.store.create_collection("c", 4)
        service.handle(append_request(Answers(), durable=True))  # creates the shard while the disk works

        def failing(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(common.journal.syncer.os, "fdatasync", failing)
        answers = Answers()
        with pytest.raises(DurabilityLost, match="Input/output error"):
            service.handle(append_request(answers, durable=True))
        assert answers.headers == []  # never confirmed
    finally:
        monkeypatch.undo()
        service.stop()


@pytest.mark.parametrize("cmd, parts", [("shardmgr.search_shards", {"queries": np.ones((1, 4), np.float32),
                                                                   "exclude": np.zeros(0, np.int64)}),
                                        ("shardmgr.get_shards", {"refs": np.zeros(1, np.int64)})])
def test_the_cluster_commands_are_refused_by_a_single_node_and_change_nothing(
        tmp_path: Path, flusher: Flusher, cmd: str, parts: dict[str, np.ndarray]) -> None:
    service = StoreService(tmp_path, StoreConfig(), flusher)
    service.recover()
    service.start()
    try:
        service.store.create_collection("c", 4)
        service.handle(append_request(Answers(), durable=True))
        answers = Answers()
        with pytest.raises(BadRequest, match="cluster command"):
            service.handle(Request(2, cmd, {"name": "c", "shards": [1]}, parts, answers))
        assert answers.headers == [] and service.store.collection_info("c")["rows"] == 2
    finally:
        service.stop()
