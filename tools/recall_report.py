"""tools/bench_recall.py's output: its tables, the targets met or not, the plot, and JSON."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recall_systems import SYSTEMS
from rich.console import Console
from rich.table import Table
from rounds import Spread

RECALL_TARGET = 0.95
TARGETS = {"ours": 0.9, "network": 0.7}  # ratio of medians to faiss, at recall >= RECALL_TARGET
SPEEDUP_TARGET = 10.0  # large set: IVF at recall >= RECALL_TARGET vs exact over the same store


def _spread(cell: Any) -> Spread:
    """A Spread, also from its --json form (for --load)."""
    if isinstance(cell, Spread):
        return cell
    return Spread(cell["median"], cell["min"], cell["max"], tuple(cell["runs"]))


def _qps(cell: Any) -> str:
    s = _spread(cell)
    fmt = "{:,.0f}" if s.median >= 100 else "{:,.1f}"
    return f"{fmt.format(s.median)} [{fmt.format(s.low)}–{fmt.format(s.high)}]"


def _grouped(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """(spec, knobs) -> system -> row, in measuring order."""
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for row in rows:
        out.setdefault((row["spec"], row["knobs"]), {})[row["system"]] = row
    return out


FIGURES = {"batch_qps": "batch", "single_qps": "single"}


def _keys(data: dict[str, Any]) -> list[str]:
    """The q/s figures every row of a data set has (a run with ``--single 0`` has no single_qps)."""
    return [key for key in FIGURES if all(key in row["summary"] for row in data["settings"])]


def _ratio(row: dict[str, Any], key: str) -> str:
    """The median of per-round ratios to faiss and their spread (a ratio of medians in older --json output)."""
    cell = f"{row['ratio'][key]:.2f}"
    if key in row.get("ratio_spread", {}):
        s = _spread(row["ratio_spread"][key])
        cell += f" [{s.low:.2f}–{s.high:.2f}]"
    return cell


def _header(data: dict[str, Any]) -> tuple[str, list[str]]:
    """A data set's table title and columns."""
    title = (f"{data['name']}, {data['metric']}: recall@10 and queries/s (batch of {data['queries']:,}; one query "
             "per call), median [min–max]; × = median of per-round ratios to faiss [min–max]")
    columns = ["index", "params", "recall@10"]
    for key in _keys(data):
        columns += [f"{FIGURES[key]}: ours", "faiss", "network", "× ours", "× net"]
    return title, columns


def _cells(data: dict[str, Any]) -> list[list[str]]:
    """A data set's table rows: one per index string and parameter setting."""
    out = []
    for (spec, knobs), systems in _grouped(data["settings"]).items():
        cells = [spec, knobs, _recall(systems)]
        for key in _keys(data):
            cells += [_qps(systems[s]["summary"][key]) if s in systems else "" for s in SYSTEMS]
            cells += [_ratio(systems[s], key) if s in systems else "" for s in ("ours", "network")]
        out.append(cells)
    return out


def show(results: dict[str, Any]) -> None:
    console = Console(width=max(Console().width, 160))  # a pipe gets 80 columns: too few for these tables
    for data in results["sets"]:
        title, columns = _header(data)
        table = Table(title=title)
        for col in columns:
            table.add_column(col, justify="right")
        for cells in _cells(data):
            table.add_row(*cells)
        console.print(table)
        console.print("  build (s), store / faiss: " + ", ".join(
            f"{spec} {data['build_s']['ours'][spec]:.1f} / {data['build_s']['faiss'][spec]:.1f}"
            for spec in data["build_s"]["ours"]))
        for line in verdicts(data):
            console.print("  " + line)
    if results.get("large"):
        show_large(console, results["large"])


def _recall(systems: dict[str, dict[str, Any]]) -> str:
    """Ours; faiss's and the network's too where they differ (the store searches short answers again)."""
    values = {name: _spread(row["summary"]["recall"]).median for name, row in systems.items()}
    cell = f"{values['ours']:.3f}"
    others = [f"{name} {value:.3f}" for name, value in values.items() if abs(value - values["ours"]) >= 0.0005]
    return cell + (f" ({', '.join(others)})" if others else "")


def verdicts(data: dict[str, Any]) -> list[str]:
    """Per system, whether the QPS ratio targets hold at every setting of recall >= RECALL_TARGET."""
    lines = []
    for system, target in TARGETS.items():
        for key in _keys(data):
            rows = [r for r in data["settings"] if r["system"] == system and r["spec"] != "flat"
                    and _spread(r["summary"]["recall"]).median >= RECALL_TARGET]
            if not rows:
                continue
            worst = min(rows, key=lambda r: r["ratio"][key])
            met = sum(r["ratio"][key] >= target for r in rows)
            lines.append(f"{system} / faiss, {key}, {len(rows)} approximate settings at recall >= {RECALL_TARGET}: "
                         f"{met} meet >= {target} (worst {worst['ratio'][key]:.2f}, {worst['spec']} {worst['knobs']})")
    return lines


def show_large(console: Console, large: dict[str, Any]) -> None:
    kind = large.get("kind", "gaussian")
    table = Table(title=f"large: {large['rows']:,} x {large['dim']} {kind} l2, {large['shards']} sealed shards of "
                        f"{large['spec']} (store defaults); {large['queries']} queries; median [min–max]; "
                        "× = vs exact (flat) over the same store")
    for col in ("setting", "recall@10", "batch q/s", "×", "single q/s", "×"):
        table.add_column(col, justify="right")
    exact = large["settings"][0]["summary"]
    for row in large["settings"]:
        s = row["summary"]
        table.add_row("exact (flat)" if row["nprobe"] == 0 else f"nprobe {row['nprobe']}",
                      f"{_spread(s['recall']).median:.3f}", _qps(s["batch_qps"]),
                      f"{_spread(s['batch_qps']).median / _spread(exact['batch_qps']).median:.1f}",
                      _qps(s["single_qps"]),
                      f"{_spread(s['single_qps']).median / _spread(exact['single_qps']).median:.1f}")
    console.print(table)
    console.print(f"  filled in {large['fill_s']:.0f} s; indexes sealed and built {large['build_s']:.0f} s later")
    if large["chosen"] is None:
        console.print(f"  no nprobe reached recall@10 >= {RECALL_TARGET}: speed-up target not met")
    else:
        row = next(r for r in large["settings"] if r["nprobe"] == large["chosen"])
        speedup = _spread(row["summary"]["batch_qps"]).median / _spread(exact["batch_qps"]).median
        console.print(f"  nprobe {large['chosen']}: recall {_spread(row['summary']['recall']).median:.3f}, "
                      f"{speedup:.1f} x exact (batch): target >= {SPEEDUP_TARGET:g} x "
                      f"{'met' if speedup >= SPEEDUP_TARGET else 'NOT met'}")


def plot(results: dict[str, Any], path: Path) -> None:
    """recall@10 (x) against batch queries/s (y, log) per index string, one panel per data set (PNG):
    ours embedded solid, faiss direct dashed in the same colour."""
    import matplotlib  # the optional `bench` extra: only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(d["name"], _curves(d["settings"])) for d in results["sets"]]
    if results.get("large"):
        large = results["large"]
        points = [(_spread(r["summary"]["recall"]).median, _spread(r["summary"]["batch_qps"]).median)
                  for r in large["settings"]]
        kind = large.get("kind", "gaussian")
        panels.append((f"large {large['rows']:,} x {large['dim']} {kind}, {large['shards']} shards",
                       {("flat", "ours"): points[:1], (large["spec"], "ours"): points[1:]}))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for ax, (title, curves) in zip(axes[0], panels):
        specs = list(dict.fromkeys(spec for spec, _ in curves))
        for (spec, system), points in curves.items():
            xs, ys = zip(*points)
            ax.plot(xs, ys, "--" if system == "faiss" else "-", marker="o" if system == "ours" else "x",
                    label=f"{spec} ({system})", color=f"C{specs.index(spec)}")
        ax.set_yscale("log")
        ax.set_xlabel("recall@10")
        ax.set_ylabel("queries/s (batch, log)")
        ax.set_title(title)
        ax.axvline(RECALL_TARGET, color="grey", linewidth=0.5)
        ax.grid(True, which="both", linewidth=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _curves(rows: list[dict[str, Any]]) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """(spec, system) -> (recall, batch q/s) per setting, for ours embedded and faiss."""
    curves: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for row in rows:
        if row["system"] in ("ours", "faiss"):
            curves.setdefault((row["spec"], row["system"]), []).append(
                (_spread(row["summary"]["recall"]).median, _spread(row["summary"]["batch_qps"]).median))
    return curves


def jsonable(results: dict[str, Any]) -> dict[str, Any]:
    """Spreads as dicts, for --json."""
    def rows(section: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**r, "summary": {k: _spread(s).as_dict() for k, s in r["summary"].items()}} for r in section]

    large = results.get("large")
    return {**results, "sets": [{**d, "settings": rows(d["settings"])} for d in results["sets"]],
            "large": {**large, "settings": rows(large["settings"])} if large else None}


def markdown(results: dict[str, Any]) -> str:
    """The same tables as :func:`show`, as Markdown (for docs/benchmarks.md)."""
    out: list[str] = []
    for data in results["sets"]:
        _, columns = _header(data)
        out += [f"**{data['name']}**, {data['metric']}, batch of {data['queries']:,} queries; q/s median "
                "[min–max]; × = median of per-round ratios to faiss [min–max]", "",
                "| " + " | ".join(columns) + " |", "|---|---|" + "---:|" * (len(columns) - 2)]
        out += ["| " + " | ".join(cells) + " |" for cells in _cells(data)]
        out += ["", *(f"- {line}" for line in verdicts(data)), ""]
    large = results.get("large")
    if large:
        exact = large["settings"][0]["summary"]
        kind = large.get("kind", "gaussian")
        out += [f"**large** {large['rows']:,} × {large['dim']} {kind}, l2, {large['shards']} sealed shards, "
                f"{large['spec']}, {large['queries']} queries; × = vs exact (flat) over the same store", "",
                "| setting | recall@10 | batch q/s | × | single q/s | × |", "|---|---:|---:|---:|---:|---:|"]
        for row in large["settings"]:
            s = row["summary"]
            out.append(f"| {'exact (flat)' if row['nprobe'] == 0 else 'nprobe ' + str(row['nprobe'])} | "
                       f"{_spread(s['recall']).median:.3f} | {_qps(s['batch_qps'])} | "
                       f"{_spread(s['batch_qps']).median / _spread(exact['batch_qps']).median:.1f} | "
                       f"{_qps(s['single_qps'])} | "
                       f"{_spread(s['single_qps']).median / _spread(exact['single_qps']).median:.1f} |")
    return "\n".join(out)
