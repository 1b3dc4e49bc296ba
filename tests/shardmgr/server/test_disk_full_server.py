"""A full disk under a real server: vector appends and enqueues both answer
``disk_full`` (vector appends used to answer ``internal`` with a traceback),
the connection stays open, nothing acknowledged is lost, and after space is
freed a restarted server takes a small append without a 64 MiB extent free.
Each component logs one line per episode (the file, the bytes needed, the
bytes free; and one when writes succeed again) and counts every refusal in
``stats`` (it used to log nothing at any level)."""

from __future__ import annotations

import re
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


def test_a_full_disk_is_logged_once_an_episode_with_its_file_and_counted(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text("[workq]\ndisk_floor_bytes = 0\nreconnect_window_s = 0.0\n")
    with small_disk(tmp_path / "disk", 40) as disk:
        server = ServerProcess(disk / "data", "--config", str(config)).start()
        try:
            with shardmgr.connect(server.address) as store, workq.connect(server.address) as queue:
                store.create_collection("c", DIM)
                store.append("c", rows(16, 0), np.arange(16), durable=True)
                queue.enqueue("j", "m", "s", 1, [b"before"], durable=True)
                for episode in (1, 2):
                    fill(disk / "ballast", leave=0)
                    for n in range(3):
                        with pytest.raises(DiskFull):
                            store.append("c", rows(1024, n), np.arange(1024), durable=True)
                        with pytest.raises(DiskFull):
                            queue.enqueue("j2", "m", "s", 1, [b"x" * 100_000] * 20)
                    counters = store.rpc.call("stats").result
                    for component in ("shardmgr", "workq"):
                        assert counters[component]["disk_full_total"] == 3 * episode, counters[component]
                        assert counters[component]["disk_full"] == 1
                    # the lines reach the log reader after the replies do: waited for, then counted exactly
                    full = server.wait_log_count("disk full:", 2 * episode)
                    assert len(full) == 2 * episode, "\n".join(full)  # one per component and episode
                    for line in full[-2:]:
                        assert re.search(r"ERROR .*: disk full: a write to \S*/disk/data/\S* needing [0-9]+ bytes was "
                                         r"refused \(No space left on device; [0-9]+ bytes free\)", line), line
                    (disk / "ballast").unlink()
                    store.append("c", rows(1, 99), [99], durable=True)  # the episode ends
                    queue.enqueue("j", "m", "s", 1, [b"after"], durable=True)
                    again = server.wait_log_count("disk space again", 2 * episode)
                    assert len(again) == 2 * episode and all("after 3 refused" in line for line in again[-2:]), again
                    counters = store.rpc.call("stats").result
                    assert counters["shardmgr"]["disk_full"] == 0 and counters["workq"]["disk_full"] == 0
        finally:
            server.kill()
