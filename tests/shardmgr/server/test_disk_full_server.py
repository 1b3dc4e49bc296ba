"""A full disk under a real server: vector appends and enqueues both answer
``disk_full`` (vector appends used to answer ``internal`` with a traceback),
the connection stays open, nothing acknowledged is lost, and after space is
freed a restarted server takes a small append without a 64 MiB extent free."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import shardmgr
import workq
from common.wire.errors import DiskFull
from tests.shardmgr.small_disk import fill, small_disk

from .serverproc import ServerProcess

DIM = 256


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def test_disk_full_is_one_code_for_vectors_and_queue_and_a_restart_recovers(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text("[workq]\ndisk_floor_bytes = 0\nreconnect_window_s = 0.0\n")  # the disk itself says full
    with small_disk(tmp_path / "disk", 100) as disk:
        server = ServerProcess(disk / "data", "--config", str(config)).start()
        try:
            with shardmgr.connect(server.address) as store, workq.connect(server.address) as queue:
                store.create_collection("c", DIM)
                [kept] = queue.enqueue("j", "m", "s", 1, [b"before"], durable=True)
                acked = [store.append("c", rows(1024, 0), np.arange(1024), durable=True)]
                fill(disk / "ballast", leave=1 << 20)
                with pytest.raises(DiskFull, match="nothing was stored") as raised:
                    for n in range(1, 200):
                        acked.append(store.append("c", rows(1024, n), np.arange(1024) + 1024 * n, durable=True))
                assert raised.value.code == "disk_full"
                assert store.collection_info("c")["rows"] == 1024 * len(acked)  # the connection stays open
                fill(disk / "ballast2", leave=0)
                with pytest.raises(DiskFull) as raised:
                    queue.enqueue("j2", "m", "s", 1, [b"x" * 100_000] * 20)
                assert raised.value.code == "disk_full"
                assert queue.job_status("j")["pending"] == 1
            assert not [line for line in server.log if "Traceback" in line], "\n".join(server.log)
            server.kill()
            for ballast in ("ballast", "ballast2"):
                (disk / ballast).unlink()
            server.start()  # the growing shard is sealed on replay: the next append needs a new shard
            fill(disk / "ballast", leave=24 << 20)  # less than one 64 MiB extent
            with shardmgr.connect(server.address) as store, workq.connect(server.address) as queue:
                more = store.append("c", rows(1, 999), [999], durable=True)
                np.testing.assert_array_equal(store.ids("c", more), [999])
                for n in (0, len(acked) - 1):
                    np.testing.assert_array_equal(store.get("c", acked[n]), rows(1024, n))
                assert queue.enqueue("j", "m", "s", 1, [b"after"], durable=True)[0] != kept
                assert queue.job_status("j")["pending"] == 2
        finally:
            server.kill()
