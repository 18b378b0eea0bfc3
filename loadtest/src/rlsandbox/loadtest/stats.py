"""Latency summaries shared by the benchmarks."""

from __future__ import annotations

import statistics
from collections.abc import Sequence


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
