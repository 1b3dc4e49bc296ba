"""Showing a verify report to a person: a progress bar and the findings.

The progress bar appears only on a terminal and only once a run has taken
more than a second. The findings, worst first, are a rich table on a
terminal and one line each elsewhere (shardmgr.cli.tables).
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from common.journal.check import Severity
from shardmgr.verification.report import Report

from . import tables

STYLES = {Severity.CORRUPT: "bold red", Severity.REPAIRABLE: "yellow", Severity.NOTE: "dim"}
VERDICTS = {0: "clean", 1: "only problems recovery repairs", 2: "DATA CORRUPTION", 3: "NOT EVERYTHING COULD BE CHECKED"}


class LateProgress:
    """A files-checked progress bar on stderr, shown after ``delay`` seconds
    if stderr is a terminal; ``advance`` is the verify run's on_file."""

    def __init__(self, total: int, enabled: bool, delay: float = 1.0, console: Console | None = None) -> None:
        self._console = console or Console(stderr=True)
        self._enabled = enabled and self._console.is_terminal
        self._started = time.monotonic()
        self._delay = delay
        self._done = 0
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._total = total

    def advance(self, path: Path, size: int) -> None:
        self._done += 1
        if not self._enabled:
            return
        if self._progress is None:
            if time.monotonic() - self._started < self._delay:
                return
            self._progress = Progress(TextColumn("verify"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=self._console, transient=True)
            self._progress.start()
            self._task = self._progress.add_task("files", total=self._total, completed=self._done)
        assert self._task is not None
        self._progress.update(self._task, completed=self._done)

    def expect(self, more: int) -> None:
        """``more`` units to check besides those counted at the start (a cluster's objects)."""
        self._total += more
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, total=self._total)

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def show(report: Report, console: Console | None = None) -> None:
    """The findings, worst first, then what --repair did and a one-line verdict.

    On a terminal the findings are a table with paths relative to the data
    directory; elsewhere one line per finding, tab-separated: severity, the
    path as the report holds it, offset, problem, expected, found (see
    shardmgr.cli.tables for escaping).
    """
    console = console or Console()
    root = Path(report.data_dir)
    if report.problems:
        words = [report.data_dir, f"--cluster {report.cluster}" if report.cluster else "",
                 "--deep" if report.deep else ""]
        table = Table(title=" ".join(["shardmgr verify", *(w for w in words if w)]))
        for column in ("severity", "file", "offset", "problem"):  # the short columns never wrap
            table.add_column(column, no_wrap=column != "file", overflow="fold")
        for column in ("expected", "found"):
            table.add_column(column, overflow="fold", ratio=1)
        rows = []
        for p in sorted(report.problems, key=lambda p: (-p.severity, p.path, p.offset or 0)):
            path = Path(p.path)
            local = report.data_dir and "://" not in p.path  # a cluster's findings name URLs: shown whole
            shown = str(path.relative_to(root)) if local and console.is_terminal and path.is_relative_to(root) \
                else p.path
            rows.append((Text(p.severity.name.lower(), STYLES[p.severity]), shown,
                         None if p.offset is None else str(p.offset), p.what, p.expected, p.found))
        tables.show(console, table, rows)
    for action in report.repaired:
        tables.say(console, f"repaired: {action}")
    counts = ", ".join(f"{report.count(s)} {s.name.lower()}" for s in reversed(Severity))
    units = ("objects" if not report.data_dir else "files and objects") if report.cluster else "files"
    tables.say(console, f"{VERDICTS[report.exit_code]}: {counts}; {report.files} {units}, "
                        f"{report.bytes_read / 1e9:.2f} GB read in {report.seconds:.2f} s (exit {report.exit_code})")
