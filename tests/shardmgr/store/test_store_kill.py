"""SIGKILL a real server while a client appends durably, many times.

Every ref whose append was confirmed (durable=True) must come back with its
exact vector and id from get, and be found by search as its own nearest
neighbour, after all the kills and restarts.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import shardmgr
from common.journal.check import Severity
from common.wire.errors import Unavailable
from tests.shardmgr.server.serverproc import RepeatedKills, ServerProcess


def run_kills(tmp_path: Path, seconds: float, seed: int) -> None:
    """Durable appends under kills for ``seconds``, and then on until two kills
    landed and an append was confirmed, for at most 120 s more (a loaded
    machine restarts the server more slowly)."""
    rng = random.Random(seed)
    config = tmp_path / "server.toml"
    config.write_text("[store]\nseal_bytes = 262144\nextent_bytes = 1048576\n")
    server = ServerProcess(tmp_path / "data", "--config", str(config)).start()
    try:
        client = shardmgr.connect(server.address, retry_for=60.0, timeout=30.0)
        client.create_collection("c", 32, "l2")
        confirmed: dict[int, tuple[np.ndarray, int]] = {}
        started = time.monotonic()
        step = 0
        with RepeatedKills(server, rng) as kills:

            def done() -> bool:
                ran = time.monotonic() - started
                return ran >= seconds and (ran >= seconds + 120 or kills.count >= 2 and bool(confirmed))

            while not done():
                n = rng.randint(1, 300)
                vectors = np.random.default_rng(step).standard_normal((n, 32)).astype(np.float32)
                ids = np.arange(step * 1000, step * 1000 + n)
                step += 1
                try:
                    refs = client.append("c", vectors, ids, durable=True)
                except Unavailable:
                    continue  # cut off by a kill: this batch may or may not be stored, and nobody was told it is
                confirmed.update((int(r), (v, int(i))) for r, v, i in zip(refs, vectors, ids))
        assert kills.count >= 2 and confirmed
        refs = np.array(sorted(confirmed), dtype=np.int64)
        vectors = np.stack([confirmed[int(r)][0] for r in refs])
        ids = np.array([confirmed[int(r)][1] for r in refs])
        for start in range(0, len(refs), 200_000):  # within the per-call row limit
            part = slice(start, start + 200_000)
            np.testing.assert_array_equal(client.get("c", refs[part]), vectors[part])
            np.testing.assert_array_equal(client.ids("c", refs[part]), ids[part])
        sample = np.random.default_rng(seed).choice(len(refs), size=min(len(refs), 5000), replace=False)
        _, _, nearest = client.search("c", vectors[sample], k=1)
        assert (nearest[:, 0] == refs[sample]).all()
        client.close()
        server.signal(signal.SIGKILL)  # one last kill: what it leaves is only for recovery to repair
        server.wait()
        report = shardmgr.verify(tmp_path / "data", deep=True)
        assert report.exit_code <= 1, [p for p in report.problems if p.severity == Severity.CORRUPT]
    finally:
        server.kill()


def test_sigkill_during_durable_appends(tmp_path: Path) -> None:
    run_kills(tmp_path, seconds=4.0, seed=1)  # a kill every 0.2-0.7 s (the soak: 120 s)


@pytest.mark.soak
@pytest.mark.timeout(1800)
def test_sigkill_during_durable_appends_soak(tmp_path: Path) -> None:
    run_kills(tmp_path, seconds=120.0, seed=2)
