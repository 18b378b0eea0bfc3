"""Latency summaries shared by the benchmarks."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any


def percentile(samples: Sequence[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return float("nan")
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def summary_ms(samples: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean of samples given in seconds, in milliseconds."""
    return {
        "n": len(samples),
        "p50": percentile(samples, 50) * 1e3,
        "p90": percentile(samples, 90) * 1e3,
        "p99": percentile(samples, 99) * 1e3,
        "max": max(samples) * 1e3,
        "mean": statistics.fmean(samples) * 1e3,
    }


def latency_table(rows: Sequence[tuple[str, dict[str, float]]], digits: int = 2) -> list[str]:
    """Markdown rows: operation, n, p50/p90/p99/max in milliseconds."""
    lines = ["| operation | n | p50 ms | p90 ms | p99 ms | max ms |", "|---|---|---|---|---|---|"]
    for name, s in rows:
        cells = " | ".join(f"{s[k]:.{digits}f}" for k in ("p50", "p90", "p99", "max"))
        lines.append(f"| {name} | {s['n']} | {cells} |")
    return lines


def process_cpu(pid: int) -> tuple[float, float] | None:
    """CPU seconds (user + system) of process ``pid`` and of its reaped children, from /proc;
    None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / hz, (int(fields[13]) + int(fields[14])) / hz


def machine() -> dict[str, object]:
    import os
    import platform

    return {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release()}


def bench_cli(doc: str | None, add_arguments: Any, run: Any, render: Any) -> None:
    """The command line of a benchmark module: its arguments plus ``--json``; runs ``run(args)``
    on uvloop, writes the raw results to ``--json`` if given, prints ``render(results)``."""
    import argparse
    import json

    import uvloop

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.add_argument("--json", default=None, help="also write the raw results here")
    args = parser.parse_args()
    results = uvloop.run(run(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    print(render(results))
