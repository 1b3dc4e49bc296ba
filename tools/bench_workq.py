"""Work-queue benchmark: workq against real peers on the same machine, same workload.

Every server is started by this script on loopback, fresh for each run, with
its data directory on the disk under test ($BENCH_DIR, default the current
directory):

* workq (``shardmgr serve``), group commit (5 ms: enqueues and completions
  answered before the flush that makes them durable, as Redis ``everysec``
  answers before its fsync), ``workq-1s`` the same at a 1 s interval (Redis ``everysec``'s own:
  how much of a gap is the fsync rate; not the default), and with ``durable=True`` on every enqueue and
  completion (answered after it, as Redis ``always``); ``workq-pipelined`` (``enqueue_async``,
  ``complete_async``) and ``workq-one-trip`` (workers call
  ``complete_and_lease``: one round trip per item) are one item per call too;
* Redis 7 streams with a consumer group, ``appendonly yes`` with
  ``appendfsync everysec`` and ``always``, and ``redis pipelined``
  (``everysec``, the producer pipelining and each worker cycle one round trip);
* beanstalkd with its binlog and ``-f 5`` (fsync at most every 5 ms);
* NATS JetStream, file storage, work-queue retention (default sync).

Phases, for each batch size B (``--batch``, default 1 and 1000): one producer
enqueues N items of 512 bytes, B per call (the enqueue phase); then 2 worker
processes lease B items per call, store a 256-byte result per item and retire
it, while a consumer collects results until all N are in (the work phase).
B = 1 is one plain call per item, as a new user writes it. Each phase is
timed on its own from the moment every client is connected; end to end is
N over the sum of the two phase times. Server CPU per item (user + system
time of the server process, from /proc) is reported for each phase.

Concurrent producers (``--producers``, default 1, 8, 64): that many processes,
each with its own connection, enqueue one item per call for a few seconds:
workq ``durable=True`` and Redis ``always``, workq's group commit and Redis
``everysec``.

Ratios pair like with like only (tools/peer.py, ``Peer.pairing``): the same
durability (fsynced before the reply: workq ``durable=True``, Redis
``always``; or after it, within the system's interval: the others), and for
the enqueue figure the same producer (waiting for each reply, or pipelined:
``workq pipelined``, ``redis pipelined``), for the work figure the same round
trips per worker cycle (two; or one: ``workq pipelined``, ``workq one-trip``,
``redis pipelined``). A figure whose pair differs is shown as —.

Every configuration runs ``--runs`` times (default 3) in interleaved rounds;
printed: the median of each figure with its min-max over the runs, and
workq/peer ratios computed from the medians. Peer drivers: tools/peer_*.py.

Instructions (issue 24, ``--callgrind``, needs valgrind): server and client
instructions (callgrind Ir) per durable one-item enqueue, and per one-item
work cycle (lease, then a durable complete: two calls), and per one-item
cycle with a group-commit complete (the wall-clock pairing with Redis
``everysec``; at the counting flush interval its rounds are few and long,
where at 5 ms each covers a dozen items), on one ``shardmgr
serve``, counted after a warm-up (tools/instructions.py: how, and the flush
interval they are counted with); stable where seconds and CPU time are not.

Usage (from the tree to measure; ``shardmgr serve`` imports from the CWD):
  BENCH_DIR=/path/on/disk PYTHONPATH=. python tools/bench_workq.py [--json]
  python tools/bench_workq.py --runs 1 --items 20000 --items-b1 1000 --producers 1,8   # smoke run
  python tools/bench_workq.py --rss-items 10000000   # workq RSS with a 10M backlog
  python tools/bench_workq.py --callgrind --peers '' --producers ''   # instructions per call only
Needs redis-server, beanstalkd and nats-server on PATH (Debian packages) and
the Python clients redis and nats-py.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import instructions  # tools/instructions.py, beside this file
from emit import emit  # tools/emit.py, beside this file
from measure import PAYLOAD, RESULT, WORKERS, Phases, Producers, measure_phases, measure_producers
from peer import JOB
from peer_workq import Workq
from peers import PEERS, PRODUCER_PEERS
from provenance import commit
from rich.console import Console
from rich.table import Table
from rounds import Spread, interleave, ratio, summarise

import workq

BATCH_RSS = 1000
CALLGRIND_WARMUP = 200  # calls before counting: imports, first-call caches, the journals' first pages
GROUPED_ITEMS = 4000  # enqueued for the group-commit work window (warm-up and counted cycles within it)


def _ints(text: str) -> list[int]:
    """'1,1000' -> [1, 1000]; '' -> []."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}") from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"every value must be at least 1: {text!r}")
    return values


def _names(text: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in PEERS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown peer(s) {', '.join(unknown)}: choose from {', '.join(PEERS)}")
    return names


def _summaries(configs: list[Any], runs: list[list[dict[str, float]]]) -> list[dict[str, Any]]:
    return [{**vars(c), "system": PEERS[c.peer].name, "summary": summarise(r), "runs": r}
            for c, r in zip(configs, runs)]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every configuration in interleaved rounds; medians, spreads and ratios."""
    phases = [Phases(name, b, args.items_b1 if b == 1 else args.items) for b in args.batch for name in args.peers]
    producers = [Producers(name, n, args.producer_seconds) for name in args.producer_peers for n in args.producers]
    configs: list[Phases | Producers] = [*phases, *producers]

    def measure(config: Phases | Producers) -> dict[str, float]:
        return measure_phases(config) if isinstance(config, Phases) else measure_producers(config)

    runs = interleave(configs, args.runs, measure)
    settings = {"tree": commit(), "date": time.strftime("%Y-%m-%d %H:%M"), "runs": args.runs,
                "payload_B": PAYLOAD, "result_B": RESULT, "workers": WORKERS, "producer_seconds": args.producer_seconds}
    return {"settings": settings,
            "phases": _summaries(phases, runs[: len(phases)]),
            "producers": _summaries(producers, runs[len(phases):])}


PHASE_KEYS = ("enqueue_per_s", "work_per_s", "end_to_end_per_s")


def ratios(rows: list[dict[str, Any]], match: str, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    """workq / peer from the medians, like with like only: for every workq mode and every other
    peer measured with the same ``match`` (batch, or producer count), the ratio of each figure in
    ``keys`` whose pairing (tools/peer.py: durability, pipelining, worker round trips) is the
    same on both sides, else None; pairs with no comparable figure are left out."""
    out = []
    for value in sorted({r[match] for r in rows}):
        group = [r for r in rows if r[match] == value]
        for mine in (r for r in group if r["peer"].startswith("workq")):
            for theirs in (r for r in group if not r["peer"].startswith("workq")):
                figures = {k: ratio(mine["summary"][k], theirs["summary"][k])
                           if PEERS[mine["peer"]].pairing(k) == PEERS[theirs["peer"]].pairing(k) else None
                           for k in keys}
                if any(f is not None for f in figures.values()):
                    out.append({match: value, "workq": mine["system"], "peer": theirs["system"],
                                "pairing": PEERS[theirs["peer"]].driven(), **figures})
    return out


def jsonable(results: dict[str, Any]) -> dict[str, Any]:
    """Spreads as dicts, plus the ratios of the medians, for ``--json``."""
    def rows(section: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**r, "summary": {k: s.as_dict() for k, s in r["summary"].items()}} for r in section]

    return {**results, "phases": rows(results["phases"]), "producers": rows(results["producers"]),
            "ratios_of_medians": ratios(results["phases"], "batch", PHASE_KEYS),
            "producer_ratios_of_medians": ratios(results["producers"], "producers", ("enqueue_per_s",))}


def enqueue_one(address: str) -> Callable[[], object]:
    """The counted producer's call (tools/instructions.py): one durable one-item enqueue, as ``workq durable``."""
    client = workq.connect(address)
    return functools.partial(client.enqueue, JOB, "m", "s", 1, [os.urandom(PAYLOAD)], durable=True)


def lease_complete_one(address: str, durable: bool = True) -> Callable[[], object]:
    """The counted worker's cycle: lease one item, complete it durably (``workq durable``'s worker at B = 1)."""
    worker = workq.Worker(address, "w0", models=["m"])
    result = os.urandom(RESULT)

    def cycle() -> None:
        items = worker.lease(1, wait=1.0)
        if not items:  # the enqueue windows leave exactly one item per cycle
            raise RuntimeError("nothing to lease")
        worker.complete(items[0].handle, result, durable=durable)

    return cycle


def lease_complete_grouped(address: str) -> Callable[[], object]:
    """The same cycle with a group-commit complete (``workq``'s worker at B = 1, the wall-clock pairing
    with Redis ``everysec``); its items come from an uncounted batch enqueue made here first."""
    with workq.connect(address) as client:
        for _ in range(GROUPED_ITEMS // 1000):
            client.enqueue(JOB, "m", "s", 1, [os.urandom(PAYLOAD)] * 1000)
    return lease_complete_one(address, durable=False)


def run_callgrind(requests: int) -> dict[str, Any]:
    """Server and client instructions per durable one-item enqueue, then per one-item lease + durable
    complete of those items, on one ``shardmgr serve`` under callgrind."""
    base = Path(tempfile.mkdtemp(prefix="bench-callgrind-", dir=os.environ.get("BENCH_DIR", os.getcwd())))
    try:
        driver, out = Workq(), base / "server"
        driver.start(base, instructions.prefix(out), ("--flush-interval-ms", instructions.FLUSH_INTERVAL_MS))
        with instructions.Counted(driver.proc, out) as server:
            windows = [instructions.count(server, "bench_workq:enqueue_one", driver.address, base, label="enqueue",
                                          what="one-item durable enqueue", warmup=CALLGRIND_WARMUP,
                                          requests=requests),
                       instructions.count(server, "bench_workq:lease_complete_one", driver.address, base,
                                          label="work", what="one item: lease + durable complete",
                                          warmup=CALLGRIND_WARMUP, requests=requests, calls=2),
                       instructions.count(server, "bench_workq:lease_complete_grouped", driver.address, base,
                                          label="grouped", what="one item: lease + group-commit complete",
                                          warmup=CALLGRIND_WARMUP, requests=min(requests, GROUPED_ITEMS // 2),
                                          calls=2)]
    finally:
        if os.environ.get("KEEP_CALLGRIND"):
            print("callgrind files kept in", base)
        else:
            shutil.rmtree(base, ignore_errors=True)
    return instructions.report(windows)


def show(results: dict[str, Any]) -> None:
    console = Console(width=max(Console().width, 120))  # a pipe gets 80 columns: too few for these tables
    spread = "median of {runs} interleaved runs [min–max]".format(**results["settings"])
    for batch in sorted({r["batch"] for r in results["phases"]}):
        rows = [r for r in results["phases"] if r["batch"] == batch]
        _phase_table(console, rows, batch, spread)
    if results["phases"]:
        _memory_table(console, results["phases"], results["settings"]["runs"])
    if results["producers"]:
        _producer_table(console, results["producers"], spread, results["settings"]["producer_seconds"])
    if "instructions" in results:
        instructions.show(results["instructions"], "workq, one item per call, one connection")


def _phase_table(console: Console, rows: list[dict[str, Any]], batch: int, spread: str) -> None:
    items = rows[0]["items"]
    table = Table(title=f"B={batch}: {items:,} items of {PAYLOAD} B, {WORKERS} workers, results of {RESULT} B; "
                        f"items/s and server CPU µs/item, {spread}; driven as: ack before or after the fsync, "
                        "producer waits for each reply or pipelines, worker round trips per cycle")
    for col in ("system", "driven as", "enqueue/s", "work/s", "end-to-end/s", "CPU µs/item enqueue",
                "CPU µs/item work"):
        table.add_column(col, justify="right")
    for row in rows:
        s: dict[str, Spread] = row["summary"]
        table.add_row(row["system"], PEERS[row["peer"]].driven(), *(s[k].cell() for k in PHASE_KEYS),
                      *(s[k].cell("{:,.1f}") for k in ("enqueue_cpu_us", "work_cpu_us")))
        if s.get("leftover") and s["leftover"].high:
            console.print(f"[red]{row['system']} B={batch}: {s['leftover'].high:.0f} inputs left in the queue[/red]")
    console.print(table)
    table = Table(title=f"B={batch}: workq / peer, ratios of the medians (higher is better for workq), like with "
                        "like only: equal durability, and for enqueue equal pipelining, for work equal round "
                        "trips per cycle (— where they differ)")
    for col in ("workq", "peer", "paired as", "enqueue", "work", "end-to-end"):
        table.add_column(col, justify="right")
    for pair in ratios(rows, "batch", PHASE_KEYS):
        table.add_row(pair["workq"], pair["peer"], pair["pairing"], *(_figure(pair[k]) for k in PHASE_KEYS))
    if table.row_count:
        console.print(table)


def _figure(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _memory_table(console: Console, rows: list[dict[str, Any]], runs: int) -> None:
    table = Table(title=f"server memory and disk, medians of {runs} runs (RSS counts mapped file pages; "
                        "anon = RSS less file-backed pages)")
    for col in ("system", "B", "RSS after enqueue", "RSS peak", "anon peak", "disk after enqueue"):
        table.add_column(col, justify="right")
    for row in rows:
        s = row["summary"]
        table.add_row(row["system"], str(row["batch"]), *(f"{s[k].median:,.0f} MB" for k in (
            "rss_after_enqueue_MB", "rss_peak_MB", "anon_peak_MB", "disk_after_enqueue_MB")))
    console.print(table)


def _producer_table(console: Console, rows: list[dict[str, Any]], spread: str, seconds: float) -> None:
    table = Table(title=f"concurrent single-item producers, one connection and process each, {seconds:g} s; {spread}")
    for col in ("system", "producers", "enqueues/s", "server CPU µs/item", "producers' CPU µs/item"):
        table.add_column(col, justify="right")
    for row in rows:
        s = row["summary"]
        table.add_row(row["system"], str(row["producers"]), s["enqueue_per_s"].cell(),
                      s["enqueue_cpu_us"].cell("{:,.1f}"), s["client_cpu_us"].cell("{:,.1f}"))
    console.print(table)
    table = Table(title="concurrent producers: workq / peer enqueues/s, ratios of the medians, equal durability only")
    for col in ("producers", "workq", "peer", "paired as", "ratio"):
        table.add_column(col, justify="right")
    for pair in ratios(rows, "producers", ("enqueue_per_s",)):
        table.add_row(str(pair["producers"]), pair["workq"], pair["peer"], pair["pairing"],
                      _figure(pair["enqueue_per_s"]))
    if table.row_count:
        console.print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=_ints, default=[1, 1000], help="batch sizes B (default 1,1000)")
    parser.add_argument("--items", type=int, default=200_000, help="items per run for B > 1")
    parser.add_argument("--items-b1", type=int, default=5_000, help="items per run for B = 1")
    parser.add_argument("--runs", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--peers", type=_names, default=list(PEERS), help=f"phase runs, from {','.join(PEERS)}")
    parser.add_argument("--producers", type=_ints, default=[1, 8, 64], help="concurrent producer counts ('' skips)")
    parser.add_argument("--producer-peers", type=_names, default=list(PRODUCER_PEERS))
    parser.add_argument("--producer-seconds", type=float, default=3.0, help="how long each producer enqueues")
    parser.add_argument("--rss-items", type=int, default=0, help="only measure workq's RSS with this backlog")
    parser.add_argument("--callgrind", action="store_true",
                        help="also count workq's instructions per call under valgrind (tools/instructions.py)")
    parser.add_argument("--callgrind-items", type=int, default=1000, help="counted enqueues, then work items")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.rss_items:
        from peer_workq import backlog_rss

        print(json.dumps(backlog_rss(args.rss_items, BATCH_RSS, PAYLOAD), indent=2))
        return
    if min(args.items, args.items_b1, args.runs) < 1 or args.producer_seconds <= 0:
        parser.error("--items, --items-b1 and --runs must be at least 1, --producer-seconds positive")
    if args.callgrind and (reason := instructions.missing()):
        parser.error(f"--callgrind: {reason}")
    results = run(args)
    if args.callgrind:
        results["instructions"] = run_callgrind(args.callgrind_items)
    emit(jsonable(results) if args.json else results, args.json, show)


if __name__ == "__main__":
    main()
