from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from common.journal import Flusher, Journal
from shardmgr.cli import main


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
    assert listed == {"journal", "queue", "serve", "stats", "token", "verify"}
    gone = subprocess.run([sys.executable, "-m", "shardmgr", "demo"], capture_output=True, text=True, timeout=120)
    assert gone.returncode == 2 and "No such command 'demo'" in gone.stderr  # a real console script
