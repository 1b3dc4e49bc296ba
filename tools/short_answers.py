"""What a short answer costs to complete: through the index at doubled breadth, or exactly (issue 24).

A query an index answers with fewer than k rows (an IVF list of fewer than
k rows at a low nprobe; an HNSW graph whose neighbourhoods are deleted runs
dry) is searched again by the store (shardmgr/store/searcher.py). This
measures, on the Debian set (tools/recall_data.py), for one index built as
the store builds it and for each pattern of deleted rows: how many of a
batch of queries come back short at each setting, what an exact search of
just those costs (the store's ``search_rows`` with the shard's selector of
live rows), and what doubling ``nprobe`` / ``efSearch`` costs until none is
short (cumulated; capped at 4096) and how many are left at each step. The
two are timed alternately, ``--runs`` times each; medians.

Deletes: ``random:F`` deletes a random fraction F of the rows; ``holes:QxN``
deletes the N nearest rows of each of the first Q queries (their
neighbourhoods, as deleting one topic's documents does).

Usage:
  PYTHONPATH=. python tools/short_answers.py --kind hnsw [--dir DIR] [--runs 3]
      [--settings 16,64,128] [--deletes random:0.9,random:0.99,holes:50x1000]
  PYTHONPATH=. python tools/short_answers.py --kind ivf --settings 1,16 --deletes random:0.5,random:0.99
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from recall_data import METRICS, DataSet, K, debian_set, nlist_for

from shardmgr.store.deletes import selector
from shardmgr.store.knn import search_rows

WIDEST = 4096


def built(data: DataSet, kind: str) -> tuple[faiss.Index, str]:
    """The index the store builds for ``kind`` over the set (HNSW32, or IVF at the bench's nlist), and its knob."""
    spec = "HNSW32" if kind == "hnsw" else f"IVF{nlist_for(data.rows)},Flat"
    index = faiss.index_factory(data.dim, spec, METRICS[data.metric])
    if not index.is_trained:
        index.train(data.vectors)
    index.add(data.vectors)
    return index, "efSearch" if kind == "hnsw" else "nprobe"


def deleted(data: DataSet, pattern: str) -> np.ndarray:
    """A bool mask of the rows ``pattern`` deletes (see the module docstring)."""
    how, _, value = pattern.partition(":")
    if how == "random":
        mask: np.ndarray = np.random.default_rng(0).random(data.rows) < float(value)
        return mask
    if how == "holes":
        queries, rows = (int(v) for v in value.split("x"))
        flat = faiss.IndexFlat(data.dim, METRICS[data.metric])
        flat.add(data.vectors)
        _, near = flat.search(data.queries[:queries], rows)
        mask = np.zeros(data.rows, bool)
        mask[near.ravel()] = True
        return mask
    raise ValueError(f"deletes are random:F or holes:QxN, not {pattern!r}")


def timed(call: Callable[[], Any], runs: int) -> tuple[float, Any]:
    """Median seconds of ``runs`` calls, and the last call's result."""
    times, out = [], None
    for _ in range(runs):
        started = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def params(knob: str, value: int, keep: faiss.IDSelector) -> Any:
    made: Any = faiss.SearchParametersHNSW() if knob == "efSearch" else faiss.SearchParametersIVF()  # type: ignore[attr-defined]
    setattr(made, knob, value)
    made.sel = keep
    return made


def one_setting(index: faiss.Index, knob: str, value: int, data: DataSet, mask: np.ndarray,
                runs: int) -> dict[str, Any]:
    """Short answers at ``knob`` = ``value`` and the cost of completing them both ways."""
    keep = selector(mask)
    live = int((~mask).sum())
    wanted = min(K, live)
    batch_s, (_, rows) = timed(lambda: index.search(data.queries, K, params=params(knob, value, keep.selector)), runs)
    short = np.flatnonzero((rows >= 0).sum(axis=1) < wanted)
    row: dict[str, Any] = {"setting": f"{knob} {value}", "batch_ms": batch_s * 1e3, "short": len(short)}
    if not len(short):
        return row
    exact_s, _ = timed(lambda: search_rows(data.queries[short], data.vectors, K, data.metric, keep), runs)
    steps, total, left, wider = [], 0.0, short, value
    while len(left) and wider < WIDEST:
        wider *= 2
        chosen = params(knob, wider, keep.selector)
        step_s, (_, found) = timed(lambda: index.search(data.queries[left], K, params=chosen), runs)  # noqa: B023
        total += step_s
        left = left[(found >= 0).sum(axis=1) < wanted]
        steps.append(f"{wider}: {total * 1e3:.1f} ms, {len(left)} left")
    return row | {"exact_ms": exact_s * 1e3, "widened_ms": total * 1e3, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=Path(os.environ.get("BENCH_DIR") or Path.cwd()))
    parser.add_argument("--kind", choices=("hnsw", "ivf"), default="hnsw")
    parser.add_argument("--settings", default="16,64,128", help="efSearch (hnsw) or nprobe (ivf) values")
    parser.add_argument("--deletes", default="random:0.9,random:0.98,random:0.99,holes:50x1000,holes:5x20000")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    data = debian_set(args.dir / "debian-wordllama256.npy", 1000)
    index, knob = built(data, args.kind)
    print(f"{data.name}, {args.kind} ({index.ntotal:,} rows), {len(data.queries)} queries, k = {K}; "
          f"medians of {args.runs} runs")
    for pattern in args.deletes.split(","):
        mask = deleted(data, pattern)
        live = int((~mask).sum())
        print(f"{pattern}: {int(mask.sum()):,} deleted, {live:,} live ({live / data.rows:.1%})")
        for value in (int(v) for v in args.settings.split(",")):
            row = one_setting(index, knob, value, data, mask, args.runs)
            line = f"  {row['setting']}: batch {row['batch_ms']:.0f} ms, {row['short']} short"
            if row["short"]:
                verdict = "widening cheaper" if row["widened_ms"] < row["exact_ms"] else "exact cheaper"
                line += (f"; exact {row['exact_ms']:.1f} ms, widened {row['widened_ms']:.1f} ms ({verdict}); "
                         f"doubling to {'; '.join(row['steps'])}")
            print(line, flush=True)


if __name__ == "__main__":
    main()
