from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from common.journal import Flusher, Journal
from shardmgr.cli import main
from tests.shardmgr.server.serverproc import ServerProcess
from workq import QueueClient


def test_inspect_reports_header_and_recovery(tmp_path: Path) -> None:
    with Flusher() as flusher:
        j = Journal.create(tmp_path / "x.journal", kind=b"TEST", flusher=flusher)
        j.append_batch([b"a", b"bb"])
        j.close()
    with open(tmp_path / "x.journal", "ab") as f:
        f.write(b"torn tail bytes!")
    before = (tmp_path / "x.journal").read_bytes()
    result = CliRunner().invoke(main, ["journal", "inspect", "--json", str(tmp_path / "x.journal")])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["kind"] == "TEST" and info["records"] == 2
    assert info["recovery"]["tail_dirty"] is True and info["recovery"]["clean"] is False
    assert (tmp_path / "x.journal").read_bytes() == before  # inspect changes nothing


def test_inspect_exits_2_for_a_file_that_is_not_a_journal(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"\0" * 5000)
    result = CliRunner().invoke(main, ["journal", "inspect", "--json", str(tmp_path / "junk")])
    assert result.exit_code == 2
    assert "bad magic" in json.loads(result.output)["error"]


def test_the_commands_are_the_documented_ones() -> None:
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    listed = {line.split()[0] for line in result.output.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == {"cluster", "journal", "queue", "serve", "snapshot", "stats", "token", "verify"}
    gone = subprocess.run([sys.executable, "-m", "shardmgr", "demo"], capture_output=True, text=True, timeout=120)
    assert gone.returncode == 2 and "No such command 'demo'" in gone.stderr  # a real console script


def piped(*args: str) -> str:
    """The stdout of ``python -m shardmgr ARGS`` written to a pipe, 80 columns wide."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    out = subprocess.run([sys.executable, "-m", "shardmgr", *args], capture_output=True, text=True, timeout=120,
                         env={**env, "COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_stats_through_a_pipe_are_whole_lines(tmp_path: Path) -> None:
    model, shape = "meta-llama/Llama-3.1-70B-Instruct-a-model-name-wider-than-a-column", "sha256:" + "0123456789" * 6
    server = ServerProcess(tmp_path / "data").start()
    try:
        with QueueClient(server.address) as client:
            client.enqueue("a-job-whose-name-is-long-too", model, shape, 3, [b"x" * 5000])
        port = str(server.port)
        queue = piped("queue", "stats", "--port", port).splitlines()
        segment_bytes = json.loads(piped("queue", "stats", "--port", port, "--json"))["totals"]["segment_bytes"]
        assert segment_bytes > 5000 and f"totals\tsegment_bytes\t{segment_bytes}" in queue  # no "5,…"
        [key] = [line.split("\t") for line in queue if line.startswith("key\t")]
        assert len(key) == 12 and key[:7] == ["key", model, shape, "3", "1", "0", "0"] and key[8] == "1", key
        assert "(a-job-whose-name-is-long-too, pending or leased, " in key[11]
        counters = json.loads(piped("stats", "--port", port, "--json"))
        fields = [line.split("\t") for line in piped("stats", "--port", port).splitlines()]
        lines = {(component, name): value for component, name, value in fields}
        assert set(lines) == {(component, name) for component, values in counters.items() for name in values}
        assert lines["workq", "pending"] == "1" and lines["flusher", "failures_total"] == "0"
    finally:
        server.kill()


def test_inspect_through_a_pipe_is_one_line_per_field(tmp_path: Path) -> None:
    path = tmp_path / ("a-journal-with-a-long-name-" * 4 + ".journal")
    with Flusher() as flusher:
        Journal.create(path, kind=b"TEST", flusher=flusher).close()
    lines = dict(line.split("\t") for line in piped("journal", "inspect", str(path)).splitlines())
    assert lines["path"] == str(path) and lines["kind"] == "TEST" and lines["records"] == "0"


def test_a_timeout_that_is_not_a_finite_number_of_seconds_is_a_usage_error() -> None:
    for bad in ("-1", "nan", "inf"):  # nan and inf used to retry connecting forever
        result = CliRunner().invoke(main, ["stats", "--port", "1", "--timeout", bad])
        assert result.exit_code == 2 and "--timeout" in result.output, result.output
