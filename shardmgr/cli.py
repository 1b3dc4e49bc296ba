"""The ``shardmgr`` command line (click). Each command is a thin layer over the library."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from common import CorruptJournal, Flusher, FlusherConfig, FormatError, Journal, Marker

from . import __version__

EXIT_OK = 0
EXIT_DAMAGED = 2  # the file is not a journal, or its durable data is damaged

DEFAULT_FLUSH_MS = FlusherConfig().interval * 1e3


@click.group()
@click.version_option(__version__, prog_name="shardmgr")
def main() -> None:
    """Vector shards and a durable work queue on one append-only journal layer."""


@main.group()
def journal() -> None:
    """Inspect journal files."""


@journal.command("inspect")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def inspect(path: Path, as_json: bool) -> None:
    """Show a journal's header, newest checkpoint and what recovery would do.

    Opens the file read-only and changes nothing. Exit status 0 if the
    journal is readable (a torn tail is reported, not an error), 2 if it is
    not a journal or its durable data is damaged.
    """
    try:
        j = Journal.open(path, writable=False)
    except (FormatError, CorruptJournal) as exc:
        if as_json:
            click.echo(json.dumps({"path": str(path), "error": str(exc), "offset": exc.offset}))
        else:
            click.echo(f"error: {exc}", err=True)
        raise SystemExit(EXIT_DAMAGED) from None
    with j:
        info = {
            "path": str(path), "kind": j.kind.decode(), "uuid": j.identity.uuid_str,
            "format_version": j.identity.format_version, "alignment": j.alignment,
            "max_record_bytes": j.identity.max_record_bytes, "metadata_bytes": len(j.metadata),
            "records": j.count, "end": j.end, "sealed": j.sealed,
            "counters": {m.name.lower(): n for m, n in j.counters.items()},
            "recovery": _recovery_dict(j),
        }
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    table = Table(title=str(path), show_header=False)
    for key, value in info.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        table.add_row(key, str(value))
    Console().print(table)


def _recovery_dict(j: Journal) -> dict[str, object]:
    if j.recovery is None:
        return {"scanned": False}
    report = dataclasses.asdict(j.recovery)
    report["checkpoint"] = {"generation": j.recovery.checkpoint.generation, "end": j.recovery.checkpoint.end}
    report["seconds"] = round(report["seconds"], 6)
    report["clean"] = j.recovery.clean
    return report


@main.command()
@click.option("--data", "data_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("data"),
              show_default=True, help="Data directory (created if missing).")
@click.option("--records", type=click.IntRange(1, 10_000_000), default=100_000, show_default=True,
              help="Records to append.")
@click.option("--record-bytes", type=click.IntRange(0, 1 << 20), default=512, show_default=True)
@click.option("--flush-interval-ms", type=click.FloatRange(0.1, 10_000), default=DEFAULT_FLUSH_MS,
              show_default=True, help="Group-commit interval.")
def demo(data_dir: Path, records: int, record_bytes: int, flush_interval_ms: float) -> None:
    """Append records to a journal durably, reopen it, and report timings.

    A short, real exercise of the journal layer on a local data directory.
    """
    import numpy as np

    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / f"demo-{os.getpid()}-{time.time_ns()}.journal"
    rows = np.random.default_rng().integers(0, 256, size=(min(records, 4096), record_bytes), dtype=np.uint8)
    console = Console()
    with Flusher(FlusherConfig(interval=flush_interval_ms / 1e3)) as flusher:
        started = time.perf_counter()
        j = Journal.create(path, kind=b"DEMO", flusher=flusher)
        ticket, left = None, records
        while left:
            _, ticket = j.append_batch(rows[: min(left, len(rows))])
            left -= min(left, len(rows))
        assert ticket is not None
        j.wait_durable(ticket)
        appended = time.perf_counter() - started
        j.close()
        started = time.perf_counter()
        j = Journal.open(path, kind=b"DEMO", flusher=flusher)
        reopened = time.perf_counter() - started
        assert j.count == records and j.counters[Marker.LIVE] == records
        j.close()
    size = path.stat().st_size
    console.print(f"appended {records:,} records of {record_bytes} B to {path} and made them durable in "
                  f"{appended:.3f} s ({records * record_bytes / appended / 1e6:,.0f} MB/s of bodies)")
    console.print(f"reopened and recovered {size / 1e6:,.1f} MB in {reopened * 1e3:.1f} ms")
