"""Recall and queries/s per index kind: recall is measured, not assumed (issue 13 §2).

Method. For each data set and each index string at a few search parameter
settings: recall@10 against exact search (faiss IndexFlat over every row)
and queries/s for a batch of ``--queries`` queries and for one query per
call (up to ``--single`` calls or ``--single-s`` seconds per run), for
    ours     the store embedded; each index string is a collection of one
             sealed shard (recall_systems.py), so the shard/merge layer is
             measured over exactly one index;
    faiss    the same index string built by faiss on the same rows (trained
             on the same even sample), searched in process;
    network  ``shardmgr serve`` over a copy of the store, on loopback.
Every setting and system runs ``--runs`` times in interleaved rounds
(tools/rounds.py; odd rounds backwards, so the store and faiss take turns
going first); cells are the median [min-max]; a ratio to faiss is taken
per round (the two ran next to each other) and shown as the median of
those [min-max]. Recall is deterministic per setting and system (printed
once).

Per setting (issue 24): ``--kinds`` picks the index strings of (a) and (b)
(flat, hnsw, ivf, sq8, pq), ``--probes`` and ``--ef`` their nprobe and
efSearch settings, ``--batches`` how many batches one run times (a batch
of 1,000 at nprobe 1 takes ~10 ms), ``--single 0`` skips the one-query
calls. The batch comparison of issue 24:
  PYTHONPATH=. python tools/bench_recall.py --sets debian --kinds ivf,hnsw --probes 1,16,64 --ef 128 \
      --batches 20 --single 0 --no-network --runs 7

Data sets: (a) ``debian``: wordllama 256-d embeddings of the Debian package
descriptions (examples/embedtext.py; cached under DIR), 1,000 held out as
queries, metric ip; (b) ``random``: Gaussian ``--random`` ROWSxDIM, metric
l2; (c) ``large``: ``--large`` ROWSxDIM rows in one store at the
default seal_bytes (several shards), IVF vs exact (flat) over the same
store (recall_large.py); ``--large-kind clustered`` (default: a Gaussian
mixture in a 48-d latent space, recall_data.py) or ``gaussian``. IVF lists: the power of two nearest 4·sqrt(rows
per shard); PQ: 8 dimensions per code byte.

Usage (``shardmgr serve`` imports from the CWD):
  PYTHONPATH=. python tools/bench_recall.py [--dir DIR] [--runs 3] [--sets debian,random,large]
      [--random 100000x768] [--large 5000000x128] [--plot docs/recall.png] [--json|--markdown] [--smoke]
      [--kinds flat,hnsw,ivf,sq8,pq] [--probes 1,8,32,128] [--ef 16,64,256] [--batches 1] [--single 200]
  PYTHONPATH=. python tools/bench_recall.py --load a.json [--load b.json] [--plot P]   (tables/plot again)
DIR defaults to $BENCH_DIR, else the current directory. ``--smoke`` runs tiny
sizes in about a minute; the defaults took 26 minutes here (2 shared cores).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from emit import emit  # tools/emit.py, beside this file
from recall_data import DataSet, debian_set, nlist_for, pq_m, random_set
from recall_large import bench_large
from recall_report import jsonable, markdown, plot, show
from recall_systems import EXACT, SYSTEMS, Setting, Systems
from rounds import interleave, spread, summarise

TRAIN_PER_LIST = 39  # faiss's k-means minimum per centroid (the store searches exactly below it)


KINDS = ("flat", "hnsw", "ivf", "sq8", "pq")
"""--kinds of (a) and (b): exact, HNSW32, IVF<nlist>,Flat, IVF<nlist>,SQ8, IVF<nlist>,PQ<dim/8>np."""


def specs(rows: int, dim: int, kinds: Sequence[str] = KINDS, probes: Sequence[int] = (1, 8, 32, 128),
          efs: Sequence[int] = (16, 64, 256)) -> dict[str, list[dict[str, int]]]:
    """Index strings of ``kinds`` for a one-shard set of ``rows`` and their search parameter settings:
    ``efs`` (efSearch) for HNSW, ``probes`` up to nlist for IVF (SQ8 and PQ skip the first)."""
    nlist = min(nlist_for(rows), 1 << (rows // TRAIN_PER_LIST).bit_length() - 1)
    probes = [p for p in probes if p <= nlist]
    out: dict[str, list[dict[str, int]]] = {}
    if "flat" in kinds:
        out[EXACT] = [{}]
    if "hnsw" in kinds:
        out["HNSW32"] = [{"efSearch": e} for e in efs]
    if "ivf" in kinds:
        out[f"IVF{nlist},Flat"] = [{"nprobe": p} for p in probes]
    if rows >= TRAIN_PER_LIST * 256:  # below it the store keeps quantizers exact: nothing to compare
        if "sq8" in kinds:
            out[f"IVF{nlist},SQ8"] = [{"nprobe": p} for p in probes[1:]]
        # "np": no polysemous training, which index_factory turns on for IVF-PQ by default and which costs
        # ~100 s per build whatever the size; search never uses it (polysemous_ht stays 0)
        if "pq" in kinds:
            out[f"IVF{nlist},PQ{pq_m(dim)}np"] = [{"nprobe": p} for p in probes[1:]]
    return {spec: settings for spec, settings in out.items() if settings}


def bench_set(data: DataSet, directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Every setting of every index string, by every system, in interleaved rounds."""
    kinds = specs(data.rows, data.dim, args.kinds, args.probes, args.ef)
    systems = tuple(s for s in SYSTEMS if s != "network" or args.network)
    settings = [Setting(spec, tuple(sorted(p.items())), system)
                for spec, params in kinds.items() for p in params for system in systems]
    data.exact()
    found = Systems(data, list(kinds), Path(tempfile.mkdtemp(prefix="set-", dir=directory)), args.train_rows,
                    args.network, args.single, args.single_s, args.batches)
    try:
        found.open()
        runs = interleave(settings, args.runs, found.measure, lambda s: f"{data.name}: {s}", alternate=True)
    finally:
        found.close()
    rows: list[dict[str, Any]] = []
    for setting, r in zip(settings, runs):
        rows.append({"spec": setting.spec, "knobs": setting.knobs, "system": setting.system,
                     "summary": summarise(r), "runs": r})
    for row in rows:
        base = next(b for b in rows if b["system"] == "faiss" and b["spec"] == row["spec"]
                    and b["knobs"] == row["knobs"])
        row["ratio"], row["ratio_spread"] = round_ratios(row["runs"], base["runs"])
    return {"name": data.name, "rows": data.rows, "dim": data.dim, "metric": data.metric,
            "queries": len(data.queries), "build_s": found.build_s, "settings": rows}


def round_ratios(mine: list[dict[str, float]], faiss_runs: list[dict[str, float]]
                 ) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """Per q/s figure, mine / faiss's of the same round (the two ran next to each other, so the machine's drift
    cancels): the median of those ratios, and their spread (as Spread.as_dict)."""
    medians: dict[str, float] = {}
    spreads: dict[str, dict[str, Any]] = {}
    for key in ("batch_qps", "single_qps"):
        if all(key in run for run in mine + faiss_runs):
            ratios = spread([ours[key] / theirs[key] for ours, theirs in zip(mine, faiss_runs)])
            medians[key], spreads[key] = ratios.median, ratios.as_dict()
    return medians, spreads


def _sets(text: str) -> tuple[int, int]:
    try:
        rows, dim = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected ROWSxDIM, not {text!r}") from None
    if rows < 1 or dim < 8 or dim % 8:
        raise argparse.ArgumentTypeError(f"rows >= 1 and a dim that is a multiple of 8: {text!r}")
    return rows, dim


def _numbers(text: str) -> tuple[int, ...]:
    try:
        numbers = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, not {text!r}") from None
    if min(numbers) < 1:
        raise argparse.ArgumentTypeError(f"settings must be at least 1: {text!r}")
    return numbers


def _names(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    if set(names) - set(KINDS):
        raise argparse.ArgumentTypeError(f"index kinds are {', '.join(KINDS)}; not {text!r}")
    return names


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("BENCH_DIR") or Path.cwd()))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sets", default="debian,random,large", help="comma-separated: debian,random,large")
    parser.add_argument("--queries", type=int, default=1000, help="queries per batch for (a) and (b)")
    parser.add_argument("--single", type=int, default=200, help="most one-query calls per run (0: none)")
    parser.add_argument("--batches", type=int, default=1, help="batches of --queries timed per run, for (a) and (b)")
    parser.add_argument("--kinds", type=_names, default=KINDS, help=f"index kinds of (a) and (b): {','.join(KINDS)}")
    parser.add_argument("--probes", type=_numbers, default=(1, 8, 32, 128), help="IVF nprobe settings of (a), (b)")
    parser.add_argument("--ef", type=_numbers, default=(16, 64, 256), help="HNSW efSearch settings of (a), (b)")
    parser.add_argument("--single-s", type=float, default=1.0, help="most seconds of one-query calls per run")
    parser.add_argument("--random", type=_sets, default=(100_000, 768))
    parser.add_argument("--large", type=_sets, default=(5_000_000, 128))
    parser.add_argument("--large-kind", choices=("clustered", "gaussian"), default="clustered",
                        help="the large set's rows (recall_data.py: Clustered)")
    parser.add_argument("--large-queries", type=int, default=200, help="queries per batch for (c)")
    parser.add_argument("--nprobe", default="16,64,128,256,512", help="nprobe settings for (c)")
    parser.add_argument("--train-rows", type=int, default=100_000, help="index_train_rows for (a) and (b)")
    parser.add_argument("--no-network", dest="network", action="store_false")
    parser.add_argument("--plot", type=Path, help="write the recall/QPS plot here (PNG; needs matplotlib)")
    parser.add_argument("--load", type=Path, action="append", help="show (and plot) saved --json results instead")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, one run: seconds")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.random, args.large, args.queries, args.large_queries = 1, (12_000, 64), (120_000, 32), 100, 50
        args.single, args.train_rows = 20, 20_000
    if min(args.runs, args.queries, args.batches, args.train_rows, args.large_queries) < 1 or args.single < 0:
        parser.error("--runs, --queries, --batches, --large-queries and --train-rows must be at least 1, "
                     "--single at least 0")
    return args


def main() -> None:
    args = parse()
    if args.load:
        results: dict[str, Any] = {"settings": {}, "sets": [], "large": None}
        for path in args.load:
            loaded = json.loads(path.read_text())
            results["settings"] = loaded["settings"]
            results["sets"] += loaded["sets"]
            results["large"] = loaded["large"] or results["large"]
    else:
        results = measure_all(args)
    if args.plot:
        plot(results, args.plot)
    if args.markdown:
        print(markdown(results))
    else:
        emit(jsonable(results) if args.json else results, args.json, show)


def measure_all(args: argparse.Namespace) -> dict[str, Any]:
    chosen = set(args.sets.split(","))
    directory = Path(tempfile.mkdtemp(prefix="bench-recall-", dir=args.dir))
    results: dict[str, Any] = {"settings": {"date": time.strftime("%Y-%m-%d %H:%M"), "runs": args.runs,
                                            "train_rows": args.train_rows}, "sets": [], "large": None}
    try:
        if "debian" in chosen:
            data = debian_set(args.dir / "debian-wordllama256.npy", min(args.queries, 1000),
                              12_000 if args.smoke else None)
            results["sets"].append(bench_set(data, directory, args))
        if "random" in chosen:
            rows, dim = args.random
            results["sets"].append(bench_set(random_set(rows, dim, args.queries), directory, args))
        if "large" in chosen:
            rows, dim = args.large
            results["large"] = bench_large(directory, rows, dim, args.large_queries,
                                           [int(n) for n in args.nprobe.split(",")], args.runs, args.single,
                                           args.single_s, args.large_kind)
    finally:
        os.rmdir(directory) if not any(directory.iterdir()) else None
    return results


if __name__ == "__main__":
    main()
