"""verify beside a live server: read-only, takes no lock, and never calls
in-flight writes corruption; once the server stops, the directory is clean."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import numpy as np

import shardmgr
import workq
from common.journal.check import Severity
from tests.shardmgr.server.serverproc import ServerProcess


def test_verify_beside_a_live_server(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text("[store]\nseal_bytes = 65536\nextent_bytes = 65536\n"
                      "[workq]\nsegment_bytes = 65536\nidle_seal_s = 0.2\n")
    data = tmp_path / "data"
    server = ServerProcess(data, "--config", str(config)).start()
    try:
        stop = threading.Event()
        errors: list[BaseException] = []

        def write() -> None:
            rng = np.random.default_rng(3)
            try:
                with shardmgr.connect(server.address) as store, workq.connect(server.address) as queue, \
                        workq.Worker(server.address, "w") as worker:
                    store.create_collection("c", 16)
                    while not stop.is_set():
                        store.append("c", rng.standard_normal((200, 16), dtype=np.float32),
                                     np.arange(200, dtype=np.int64), durable=bool(rng.integers(2)))
                        queue.enqueue("job", "m", "s", 0, [b"task" * 100] * 20, durable=True)
                        leased = worker.lease(20)
                        worker.complete([i.handle for i in leased], [b"done"] * len(leased))
                        queue.results("job", max_items=50)
            except BaseException as exc:  # reported by the test thread
                errors.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        runs = 0
        try:
            deadline = time.monotonic() + 4.0
            while time.monotonic() < deadline:
                report = shardmgr.verify(data, deep=bool(runs % 2))
                runs += 1
                corrupt = [p for p in report.problems if p.severity == Severity.CORRUPT]
                assert corrupt == [], corrupt
        finally:
            stop.set()
            writer.join(timeout=60)
        assert not errors, errors
        assert runs >= 4 and server.alive()
        server.signal(signal.SIGTERM)
        assert server.wait() == 0
        report = shardmgr.verify(data, deep=True)
        assert report.exit_code == 0, report.problems
        assert report.files > 10
    finally:
        server.kill()  # a no-op once it exited; never left running by a failure
