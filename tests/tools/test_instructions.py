"""tools/instructions.py: callgrind's output read back, and a few ``ping``
windows counted on a real ``shardmgr serve`` (skipped without valgrind)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The tools import each other as top-level modules, as when run as scripts; appended, so nothing is shadowed.
sys.path.append(str(Path(__file__).resolve().parents[2] / "tools"))

import bench_rpc  # noqa: E402
import instructions  # noqa: E402

from shardmgr.build import describe  # noqa: E402

REASON = instructions.missing()


def test_the_count_is_the_totals_line_else_the_summary_line(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("version: 1\ncreator: callgrind-3.19.0\nsummary: 0\nfn=(1) f\n3 7\ntotals: 1234\n")
    (tmp_path / "b").write_text("version: 1\nsummary: 99\n")
    (tmp_path / "c").write_text("version: 1\n")
    assert instructions.totals(tmp_path / "a") == 1234
    assert instructions.totals(tmp_path / "b") == 99
    with pytest.raises(ValueError, match="no totals"):
        instructions.totals(tmp_path / "c")


@pytest.mark.skipif(REASON is not None, reason=f"counting instructions needs valgrind: {REASON}")
def test_a_ping_is_counted_on_both_sides_and_the_server_stops_cleanly(tmp_path: Path) -> None:
    out = tmp_path / "server"
    proc, (host, port) = bench_rpc.start_server(tmp_path / "data", "--flush-interval-ms",
                                                instructions.FLUSH_INTERVAL_MS, prefix=instructions.prefix(out))
    with instructions.Counted(proc, out) as server:
        window = instructions.count(server, "bench_rpc:ping_client", f"{host}:{port}", tmp_path, label="ping",
                                    what="ping", warmup=20, requests=100, idle_s=0.5)
    assert proc.returncode == 0  # SIGTERM: a clean stop
    # a pure-Python ping costs ~80k instructions on the server, ~50k in the client; compiled, fewer
    assert 10_000 < window.server_per_request < 1_000_000
    assert 5_000 < window.client_per_request < 1_000_000
    assert 0 < window.idle_share < 0.2  # the server's timers ran, and are a small part of the count
    assert instructions.report([window])["build"] == describe()
