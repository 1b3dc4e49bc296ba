"""Vector-store benchmark: every figure against a baseline measured in the same run.

Method. Every phase runs ``--runs`` times (default 3) in interleaved rounds
(tools/rounds.py): round r measures ours, then its baseline, then ours in
the next configuration, ..., before round r + 1 starts, so this machine's
drift (shared cores, a virtual disk whose speed varies by tens of percent)
lands on both sides alike. Printed: the median of each figure with its
min-max over the runs, and ratios of the medians (ours / baseline; higher
is better for us), never a median of per-run ratios nor a best run.

(a) ingest, for each ``--ingest`` data set (ROWSxDIM) and ``--batch`` size:
    float32 vectors + int64 ids, in MB/s of those bytes, against a raw
    ``os.writev`` of both arrays per batch to one new file:
    default appends (durable at the next group commit) with one ``flush()``
    at the end vs raw writes with one ``fdatasync`` at the end (ingest);
    ``durable=True`` (each append waits for its flush), from one writer and
    from ``--writers`` threads, vs raw writev + ``fdatasync`` per batch
    (durable ingest). The same two through ``shardmgr serve`` on loopback
    (StoreClient appends; the server started before the clock), unless
    ``--skip network``. A fresh store / file each run.
(b) search and get, for each ``--search`` data set: plain faiss
    ``IndexFlatL2`` over the same vectors in the same process vs the store
    embedded over one growing shard and over 8 sealed shards, and over the
    network (``shardmgr serve`` on loopback, one growing shard): exact
    search of a batch of 1000 queries (k=10) and of ``--single`` queries
    (default 20) one call each, in queries/s; get of 20 x 1000 random rows, in rows/s (faiss:
    ``reconstruct_batch``). Everything is built once per data set; each run
    warms up, then times each figure once.
(c) ``--hnsw``: recall of the optional HNSW index (one run);
(d) start-up with ``--startup-gib`` GiB of sealed shards plus one mid-build
    shard (embedded open, and ``shardmgr serve`` until ready; one run);
(e) the same ingest and search through LanceDB (PyPI ``lancedb``; one run).

Usage (``shardmgr serve`` imports from the CWD):
  PYTHONPATH=. python tools/bench_shards.py [--dir DIR] [--runs 3] [--json]
      [--ingest 100000x768,300000x128] [--batch 1000,10000] [--search 1000000x128,200000x768]
      [--single 20] [--skip append,search,network,startup,lancedb] [--startup-gib 10] [--hnsw]
DIR defaults to $BENCH_DIR, else the current directory.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from emit import emit  # tools/emit.py, beside this file
from rich.console import Console
from rich.table import Table
from rounds import Spread, interleave, ratio, summarise
from shard_extras import bench_hnsw, bench_lancedb, bench_startup, start_server
from shard_phases import QUERIES, Ingest, SearchSet, data, ingest_configs, measure_ingest

SEARCH_KEYS = ("batch_qps", "single_qps", "get_rows_s")


def _sets(text: str) -> list[tuple[int, int]]:
    """'1000000x128,200000x768' -> [(1000000, 128), (200000, 768)]; '' -> []."""
    try:
        sets = [(int(r), int(d)) for r, d in (s.lower().split("x") for s in text.split(",") if s.strip())]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROWSxDIM[,ROWSxDIM...], not {text!r}") from None
    if any(r < 1 or d < 1 for r, d in sets):
        raise argparse.ArgumentTypeError(f"rows and dim must be at least 1: {text!r}")
    return sets


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"every value must be at least 1: {text!r}")
    return values


def bench_ingest(directory: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every ingest configuration in interleaved rounds; one row per configuration."""
    configs = [c for rows, dim in args.ingest for batch in args.batch
               for c in ingest_configs(rows, dim, batch, args.writers, "network" not in args.skip)]
    vectors = {(rows, dim): data(rows, dim) for rows, dim in args.ingest}

    def measure(config: Ingest) -> dict[str, float]:
        return measure_ingest(config, directory, vectors[config.rows, config.dim])

    runs = interleave(configs, args.runs, measure)
    out: list[dict[str, Any]] = [{"rows": c.rows, "dim": c.dim, "batch": c.batch, "system": c.system, "mode": c.mode,
            "durable": c.durable, "writers": c.writers, "summary": summarise(r), "runs": r}
           for c, r in zip(configs, runs)]
    for row in out:  # the baseline of the same data set, batch size and durability
        if row["system"] != "raw":
            base = next(b for b in out if b["system"] == "raw" and all(
                b[k] == row[k] for k in ("rows", "dim", "batch", "durable")))
            row["ratio"] = ratio(row["summary"]["MBps"], base["summary"]["MBps"])
    return out


def bench_search(directory: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """For each data set, its systems in interleaved rounds; one row per system."""
    out: list[dict[str, Any]] = []
    for rows, dim in args.search:
        found = SearchSet(rows, dim, directory / f"search-{rows}x{dim}", args.single)
        try:
            found.open("network" not in args.skip, start_server)
            labels = found.labels()
            runs = interleave(labels, args.runs, found.measure, functools.partial(_label, f"{rows:,} x {dim}"))
        finally:
            found.close()
        summaries = dict(zip(labels, (summarise(r) for r in runs)))
        for label, r in zip(labels, runs):
            s = summaries[label]
            out.append({"rows": rows, "dim": dim, "system": label, "summary": s, "runs": r,
                        "ratio": {k: ratio(s[k], summaries["faiss"][k]) for k in SEARCH_KEYS}})
        if args.hnsw and dim == 128:
            out.append(bench_hnsw(directory, found.vectors[:200_000], found.queries))
    return out


def _label(data_set: str, system: str) -> str:
    return f"{data_set}: {system}"


def jsonable(results: dict[str, Any]) -> dict[str, Any]:
    """Spreads as dicts, for ``--json``."""
    def rows(section: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**r, "summary": {k: s.as_dict() for k, s in r["summary"].items()}} if "summary" in r else r
                for r in section]

    return {**results, "ingest": rows(results["ingest"]), "search": rows(results["search"])}


def show(results: dict[str, Any]) -> None:
    console = Console(width=max(Console().width, 120))  # a pipe gets 80 columns: too few for these tables
    spread = "median of {runs} interleaved runs [min–max]".format(**results["settings"])
    if results["ingest"]:
        table = Table(title=f"(a) ingest, MB/s of vectors + ids, {spread}; ratio of medians to the raw "
                            "writev baseline of the same durability")
        for col in ("data", "batch", "system", "mode", "MB/s", "ratio"):
            table.add_column(col, justify="right")
        for row in results["ingest"]:
            table.add_row(f"{row['rows']:,} x {row['dim']}", f"{row['batch']:,}", row["system"], row["mode"],
                          row["summary"]["MBps"].cell(), f"{row['ratio']:.2f}" if "ratio" in row else "")
        console.print(table)
    rows = [r for r in results["search"] if "summary" in r]
    if rows:
        table = Table(title=f"(b) exact search (k=10) and get, {spread}; ratio of medians to plain faiss "
                            "IndexFlatL2 in the same process")
        for col in ("data", "system", f"{QUERIES} queries, q/s", "x", "1 query per call, q/s", "x",
                    "get, rows/s", "x"):
            table.add_column(col, justify="right")
        for row in rows:
            s: dict[str, Spread] = row["summary"]
            cells = [(s[k].cell(), "" if row["system"] == "faiss" else f"{row['ratio'][k]:.2f}")
                     for k in SEARCH_KEYS]
            table.add_row(f"{row['rows']:,} x {row['dim']}", row["system"], *(c for pair in cells for c in pair))
        console.print(table)
    for row in results["search"]:
        if "recall_at_10" in row:
            console.print(f"(c) hnsw, {row['rows']:,} x {row['dim']}: recall@10 {row['recall_at_10']:.3f}, "
                          f"{row['hnsw_qps']:,.0f} q/s vs exact faiss {row['faiss_qps']:,.0f} q/s, "
                          f"built in {row['build_s']:.1f} s")
    _show_extras(console, results)


def _show_extras(console: Console, results: dict[str, Any]) -> None:
    if results.get("startup"):
        s = results["startup"]
        console.print(f"(d) start-up with {s['sealed_GiB']} GiB sealed + a mid-build shard ({s['shards']} shards, "
                      f"{s['rows']:,} rows): embedded open {s['embedded_open_s']:.3f} s, serve ready "
                      f"{s['serve_ready_s']:.3f} s")
    if results.get("lancedb"):
        s = results["lancedb"]
        console.print(f"(e) {s['rows']:,} x {s['dim']} in batches of 1000: ingest {s['ingest_rows_s']:,.0f} rows/s "
                      f"({s['ingest_ratio']:.1f} x LanceDB {s['lancedb_ingest_rows_s']:,.0f}), durable "
                      f"{s['durable_ingest_rows_s']:,.0f} ({s['durable_ingest_ratio']:.1f} x); search {s['qps']:,.0f} "
                      f"q/s ({s['search_ratio']:.1f} x LanceDB {s['lancedb_qps']:,.0f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("BENCH_DIR") or Path.cwd()))
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds (at least 3 for a median with "
                                                            "a spread)")
    parser.add_argument("--ingest", type=_sets, default=_sets("100000x768,300000x128"), help="ingest data sets")
    parser.add_argument("--batch", type=_ints, default=[1000], help="ingest batch sizes, rows per append")
    parser.add_argument("--writers", type=int, default=4, help="threads for the shared durable run (1 skips it)")
    parser.add_argument("--search", type=_sets, default=_sets("1000000x128,200000x768"), help="search data sets")
    parser.add_argument("--single", type=int, default=20, help="queries searched one call each, per run")
    parser.add_argument("--startup-gib", type=float, default=10.0, help="0 skips the start-up measurement")
    parser.add_argument("--hnsw", action="store_true", help="also build HNSW indexes and measure recall")
    parser.add_argument("--skip", default="",
                        help="comma-separated parts to skip: append,search,network,startup,lancedb")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if min(args.runs, args.writers, args.single) < 1:
        parser.error("--runs, --writers and --single must be at least 1")
    args.skip = set(args.skip.split(","))
    directory = Path(tempfile.mkdtemp(prefix="bench-shards-", dir=args.dir))
    results: dict[str, Any] = {"settings": {"date": time.strftime("%Y-%m-%d %H:%M"), "runs": args.runs,
                                            "dir": str(args.dir)}}
    try:
        results["ingest"] = [] if "append" in args.skip else bench_ingest(directory, args)
        results["search"] = [] if "search" in args.skip else bench_search(directory, args)
        results["startup"] = None if "startup" in args.skip or not args.startup_gib else bench_startup(
            directory, args.startup_gib)
        results["lancedb"] = None if "lancedb" in args.skip else bench_lancedb(directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    emit(jsonable(results) if args.json else results, args.json, show)


if __name__ == "__main__":
    main()
