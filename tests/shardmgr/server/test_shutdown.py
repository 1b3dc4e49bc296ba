"""A clean stop keeps every promise: real server processes, SIGTERM under load.

* Results written to a consumer before the stop are marked delivered before
  the queue closes, so a consumer that opens a new connection for every
  results call never sees one twice across restarts.
* Every request the server read is answered (ok, or ``unavailable``);
  requests it had not read yet end with ``unavailable``, never
  ``connection_lost`` (which means "may have applied").
* A stop ends within the shutdown timeout whatever clients do; a second
  signal exits at once.
"""

from __future__ import annotations

import collections
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from common.wire import framing
from common.wire.client import ConnectionLost, RpcClient
from common.wire.errors import Unavailable
from tests.shardmgr.server.serverproc import ServerProcess
from workq import QueueClient

WORKER = Path(__file__).parents[2] / "workq" / "worker_child.py"
SHUTDOWN_5S = ("--shutdown-timeout", "5")
WORKQ = "[workq]\nlease_s = 2.0\ndisconnect_grace_s = 1.0\nreconnect_window_s = 1.5\nsegment_bytes = 16777216\n"


@pytest.fixture()
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    config = tmp_path / "server.toml"
    config.write_text(WORKQ)
    proc = ServerProcess(tmp_path / "data", "--config", str(config)).start()
    yield proc
    proc.kill()


def stop(server: ServerProcess, timeout: float = 15.0) -> float:
    """SIGTERM; the seconds the stop took. Fails unless it exits 0 in time."""
    started = time.monotonic()
    server.signal(signal.SIGTERM)
    try:
        code = server.wait(timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError("SIGTERM did not stop the server in time:\n" + "\n".join(server.log[-30:])) from None
    assert code == 0, "\n".join(server.log[-30:])
    return time.monotonic() - started


def read_results(address: str, got: collections.Counter[int]) -> None:
    """One results call on a new connection; count every handle it returns (no client-side dedupe)."""
    try:
        with QueueClient(address, retry_for=0.5, timeout=10.0) as client:
            reply = client.rpc.call("workq.results", {"job": "job", "max_items": 200, "wait": 0.2})
    except Unavailable:
        return  # not applied (stopping, or not up yet): nothing was taken
    got.update(reply.parts["handles"].tolist())


def test_results_are_never_delivered_twice_across_clean_stops(server: ServerProcess) -> None:
    rng = random.Random(5)
    items = 600
    with QueueClient(server.address) as producer:
        handles = []
        for start in range(0, items, 300):
            batch = [f"task-{i:06d}".encode() * 2000 for i in range(start, start + 300)]  # 22 kB: slow replies
            handles += producer.enqueue("job", "m", "s", 1, batch, durable=True)
    workers = [subprocess.Popen([sys.executable, str(WORKER), server.address, f"w{i}", str(i)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for i in range(2)]
    got: collections.Counter[int] = collections.Counter()  # the main thread's, and the consumers' once joined

    def consume(stopped: threading.Event, mine: collections.Counter[int]) -> None:
        """Up to 20 results calls, until the server has stopped (calls after that could only fail).
        Each consumer counts in its own Counter: a shared one could lose an update, and with it the
        very double delivery this test looks for."""
        for _ in range(20):
            if stopped.is_set():
                return
            read_results(server.address, mine)

    try:
        deadline = time.monotonic() + 60
        while not got and time.monotonic() < deadline:  # the workers are up: every stop below has results to cut
            read_results(server.address, got)
        for _ in range(2):  # (pytest -m soak stops it 60 times under mixed load: test_stop_soak.py)
            deadline = time.monotonic() + rng.uniform(0.5, 1.5)
            while time.monotonic() < deadline:
                read_results(server.address, got)
            stopped = threading.Event()
            counts: list[collections.Counter[int]] = [collections.Counter() for _ in range(4)]
            consumers = [threading.Thread(target=consume, args=(stopped, mine)) for mine in counts]
            for consumer in consumers:
                consumer.start()  # consumers still calling while the server stops
            time.sleep(rng.uniform(0, 0.2))
            stop(server)
            stopped.set()
            for consumer in consumers:
                consumer.join(60)
                assert not consumer.is_alive(), "a consumer still calling after 60 s"
            for mine in counts:
                got.update(mine)
            server.start()
        deadline = time.monotonic() + 120
        while len(got) < items and time.monotonic() < deadline:
            read_results(server.address, got)
    finally:
        for proc in workers:
            proc.kill()
            proc.wait()
    twice = {h: n for h, n in got.items() if n > 1}
    assert not twice, f"{len(twice)} results observed more than once, e.g. {list(twice.items())[:5]}"
    assert set(got) == {h.packed for h in handles}


def test_requests_cut_by_a_stop_get_unavailable_not_connection_lost(server: ServerProcess) -> None:
    outcomes = {"ok": 0, "unavailable": 0}
    counting = threading.Lock()
    lost: list[BaseException] = []
    stopping = threading.Event()

    def client_loop(seed: int) -> None:
        rng = random.Random(seed)
        client = RpcClient(server.address, retry_for=0.2)
        try:
            while not stopping.is_set() or rng.random() < 0.9:
                ids = [client.send("echo", {"i": i}) for i in range(rng.randint(1, 50))]
                for request_id in ids:
                    client.receive(request_id)
                    with counting:
                        outcomes["ok"] += 1
        except ConnectionLost as exc:
            lost.append(exc)
        except Unavailable:
            with counting:
                outcomes["unavailable"] += 1
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    stopping.set()
    stop(server)
    for thread in threads:
        thread.join(30)
    assert not lost, f"{len(lost)} clients got connection_lost from a clean stop: {lost[:3]}"
    assert outcomes["ok"] > 0 and outcomes["unavailable"] > 0


def churn(address: tuple[str, int], until: threading.Event) -> None:
    """Open connections and drop them, some mid-handshake, some mid-frame, until told."""
    rng = random.Random()
    while not until.is_set():
        try:
            with socket.create_connection(address, timeout=1.0) as sock:
                choice = rng.random()
                if choice < 0.3:
                    continue
                sock.sendall(framing.preamble())
                if choice < 0.6:
                    sock.sendall(b"".join(framing.encode({"id": 1, "cmd": "ping"})))
                    sock.recv(64)
                else:
                    sock.sendall(b"".join(bytes(b) for b in framing.encode({"id": 1, "cmd": "echo"}))[:5])
        except OSError:
            time.sleep(0.01)


def stop_under_churn(tmp_path: Path, rounds: int) -> None:
    """Start a server, churn connections at it, SIGTERM it: ``rounds`` times."""
    for round_ in range(rounds):
        server = ServerProcess(tmp_path / f"data{round_}", *SHUTDOWN_5S).start()
        until = threading.Event()
        threads = [threading.Thread(target=churn, args=(("127.0.0.1", server.port), until)) for _ in range(6)]
        try:
            for thread in threads:
                thread.start()
            time.sleep(0.5)
            took = stop(server, timeout=15.0)
            assert took < 10.0, f"the stop took {took:.1f} s with a 5 s shutdown timeout"
        finally:
            until.set()
            for thread in threads:
                thread.join(10)
            server.kill()


def test_sigterm_stops_the_server_under_connection_churn(tmp_path: Path) -> None:
    stop_under_churn(tmp_path, rounds=3)


@pytest.mark.soak
def test_sigterm_stops_the_server_under_connection_churn_soak(tmp_path: Path) -> None:
    stop_under_churn(tmp_path, rounds=40)


def test_a_second_signal_exits_at_once(server: ServerProcess) -> None:
    with QueueClient(server.address) as client:
        client.enqueue("job", "m", "s", 1, [b"x"] * 10, durable=True)
    slow = RpcClient(server.address)  # asks for a big reply and never reads it: the stop waits for it
    slow.send("echo", {}, {"blob": np.zeros(64 << 20, np.uint8)})
    time.sleep(0.5)
    server.signal(signal.SIGTERM)
    time.sleep(0.5)
    assert server.alive()
    started = time.monotonic()
    server.signal(signal.SIGINT)
    code = server.wait(10)
    assert code != 0 and time.monotonic() - started < 5
    slow.close()
    server.start()  # what was durable is there
    with QueueClient(server.address) as client:
        assert client.job_status("job")["pending"] == 10


def test_a_client_that_closes_ends_its_waiting_call(server: ServerProcess) -> None:
    """A closed client's long results/lease wait ends with it: its connection is freed at once."""
    for _ in range(20):
        client = RpcClient(server.address)
        client.send("workq.results", {"job": "nothing", "wait": 600.0})
        client.call("workq.hello", {"worker": "w"})
        client.send("workq.lease", {"wait": 600.0})
        client.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with RpcClient(server.address) as probe:
            open_now = probe.call("stats").result["server"]["connections_open"]
        if open_now <= 1:
            break
        time.sleep(0.1)
    assert open_now <= 1, f"{open_now} connections still open after their clients closed"


def test_an_idle_client_carries_on_after_a_restart(server: ServerProcess) -> None:
    """A client idle across a clean stop finds the goaway on its next call
    and reconnects by itself: nothing was in flight, so nothing is lost."""
    client = RpcClient(server.address, retry_for=30)
    assert client.call("ping").result == {}
    stop(server)
    server.start()
    assert client.call("ping").result == {}
    client.close()


def test_a_stop_with_many_idle_clients_stays_within_its_timeout(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", *SHUTDOWN_5S).start()
    clients = [RpcClient(server.address) for _ in range(60)]
    try:
        for client in clients:
            client.call("ping")  # then idle: they never read the goaway
        took = stop(server)
        assert took < 5.0 + 2.0, f"a stop with 60 idle clients took {took:.1f} s (timeout 5 s)"
    finally:
        for client in clients:
            client.close()
        server.kill()
