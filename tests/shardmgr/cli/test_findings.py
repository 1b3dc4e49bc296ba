"""What ``shardmgr verify`` prints: a table on a terminal, one whole line per
finding anywhere else (docs/verify.md "Output")."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from rich.console import Console

import shardmgr
from shardmgr.cli import main
from shardmgr.cli.findings import show

LONG = "embeddings-multilingual-e5-large-instruct-v2-with-a-name-longer-than-a-terminal"


@pytest.fixture
def damaged(tmp_path: Path) -> Path:
    """A data directory whose first sealed shard, under a long collection
    name, has a flipped bit in its rows (a corrupt finding for --deep)."""
    root = tmp_path / "data"
    with shardmgr.open(root, seal_bytes=4 * 64 * 8 * 4, extent_bytes=4096) as store:
        store.create_collection(LONG, 8, "l2")
        rng = np.random.default_rng(3)
        for b in range(6):
            store.append(LONG, rng.standard_normal((64, 8)).astype(np.float32), np.arange(64) + 64 * b, durable=True)
    with open(root / "shards" / LONG / "00000001" / "vectors", "r+b") as f:
        f.seek(5000)
        byte = f.read(1)[0]
        f.seek(5000)
        f.write(bytes([byte ^ 4]))
    return root


def piped(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m shardmgr ARGS`` with stdout a pipe and an 80-column width."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    return subprocess.run([sys.executable, "-m", "shardmgr", *args], capture_output=True, text=True, timeout=120,
                          env={**env, "COLUMNS": "80"})


def test_a_pipe_gets_one_whole_line_per_finding(damaged: Path) -> None:
    out = piped("verify", "--deep", str(damaged))
    assert out.returncode == 2, out.stderr
    path = damaged / "shards" / LONG / "00000001" / "vectors"
    assert out.stdout.splitlines() == [
        f"corrupt\t{path}\t4096\trows_checksum\trows 0..64 matching the batch's crc32c\tdifferent bytes",
        out.stdout.splitlines()[-1]]
    assert out.stdout.splitlines()[-1].startswith("DATA CORRUPTION: 1 corrupt, 0 repairable, 0 note; 8 files, ")
    report = json.loads(piped("verify", "--deep", "--json", str(damaged)).stdout)  # --json as it was
    assert [(p["path"], p["offset"], p["what"]) for p in report["problems"]] == [(str(path), 4096, "rows_checksum")]


def test_repair_actions_are_whole_lines(damaged: Path) -> None:
    out = piped("verify", "--deep", "--repair", str(damaged))
    assert out.returncode == 0, out.stderr
    [note, moved, recovered, verdict] = out.stdout.splitlines()
    assert note.startswith(f"note\t{damaged}/shards/{LONG}/quarantine/00000001-") and "\tquarantined\t" in note
    assert moved.startswith(f"repaired: moved shards/{LONG}/00000001 to shards/{LONG}/quarantine/00000001-")
    assert recovered == "repaired: ran the vector store's recovery" and verdict.startswith("clean: ")


def test_names_that_would_break_a_line_are_escaped(damaged: Path) -> None:
    os.close(os.open(os.fsencode(damaged) + b"/new\nline\tand\\ \xff", os.O_CREAT | os.O_WRONLY))
    result = CliRunner().invoke(main, ["verify", str(damaged)])  # CliRunner's stdout is not a terminal
    assert result.exit_code == 0, result.output
    [note, verdict] = result.output.splitlines()
    assert note.split("\t") == ["note", f"{damaged}/new\\nline\\tand\\\\ \\xff", "-", "unknown_file",
                                "LOCK, workq/, shards/, quarantine/, cluster-cache/",
                                "a file this service did not write"]
    assert verdict.startswith("clean: 0 corrupt, 0 repairable, 1 note;")


def test_a_terminal_keeps_the_table(damaged: Path) -> None:
    out = io.StringIO()
    show(shardmgr.verify(damaged, deep=True), Console(file=out, force_terminal=True, color_system=None, width=80))
    text = out.getvalue()
    assert "┃ severity ┃ file" in text and "│ corrupt  │ shards/embe" in text  # relative, folded in its column
    assert "\t" not in text and "rows_checksum" in text
