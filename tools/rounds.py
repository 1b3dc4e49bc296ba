"""Interleaved benchmark rounds and their summary: the median of each figure
with its per-run spread (min-max).

Round r measures every configuration once, in a fixed order, before round
r + 1 starts, so slow drift of the machine (other tenants, page cache,
thermal) lands on every configuration alike instead of on whichever ran last.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

C = TypeVar("C")


@dataclass(frozen=True)
class Spread:
    """One figure over several runs."""

    median: float
    low: float
    high: float
    runs: tuple[float, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.low, "max": self.high, "runs": list(self.runs)}

    def cell(self, fmt: str = "{:,.0f}") -> str:
        """The median, and the spread on a second line when there was more than one run."""
        if len(self.runs) == 1:
            return fmt.format(self.median)
        return f"{fmt.format(self.median)}\n[{fmt.format(self.low)}–{fmt.format(self.high)}]"


def spread(values: Sequence[float]) -> Spread:
    """Median, min and max of ``values``; ValueError if there are none."""
    if not values:
        raise ValueError("no runs to summarise")
    return Spread(statistics.median(values), min(values), max(values), tuple(values))


def summarise(runs: Sequence[Mapping[str, float]]) -> dict[str, Spread]:
    """Each figure the runs share, as a Spread (figures missing from any run are left out)."""
    keys = [k for k in runs[0] if all(k in run for run in runs)] if runs else []
    return {key: spread([float(run[key]) for run in runs]) for key in keys}


def ratio(mine: Spread, theirs: Spread) -> float:
    """mine / theirs, from the medians (not a median of per-run ratios)."""
    return mine.median / theirs.median if theirs.median else float("nan")


def interleave(configs: Sequence[C], runs: int, measure: Callable[[C], dict[str, float]],
               label: Callable[[C], str] = str, alternate: bool = False) -> list[list[dict[str, float]]]:
    """Measure every config ``runs`` times in interleaved rounds; per config, its runs in order.
    ``alternate``: odd rounds go through the configs backwards, so that of two neighbours neither always
    runs first (the first of a pair can pay for caches and threads the other then finds warm).
    Progress goes to stderr so that ``--json`` output stays clean."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, not {runs}")
    results: list[list[dict[str, float]]] = [[] for _ in configs]
    for r in range(runs):
        order = list(enumerate(configs))
        for i, config in (order[::-1] if alternate and r % 2 else order):
            started = time.perf_counter()
            results[i].append(measure(config))
            print(f"round {r + 1}/{runs}: {label(config)} ({time.perf_counter() - started:.1f} s)",
                  file=sys.stderr, flush=True)
    return results
