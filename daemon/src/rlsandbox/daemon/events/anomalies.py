"""Reward anomalies per run, judged by the aggregator over fixed windows of grading time.

A policy that found a way to game the reward shows as a sudden jump of the mean reward (or of the
tampering the grader saw); broken infrastructure shows as a share of infra errors. Each complete
window (``window`` seconds of reward events, aligned to multiples of it) of each run is judged
against the ``baseline_windows`` before it:

- ``infra_error_rate``: at least ``min_gradings`` gradings and a share of infra errors of at least
  ``infra_error_rate``;
- ``reward_jump``: the mean reward moved by at least ``reward_jump`` (up or down) from the
  baseline's, each side with at least ``min_gradings`` rewarded gradings;
- ``tampering_jump``: the share of gradings with tampering is at least ``tampering_rate`` and at
  least ``tampering_factor`` times the baseline's.

An anomaly is an alert event (docs/events.md) from node ``_aggregator`` whose identity is its run,
kind and window: every aggregator sharing the work may judge the same window, and JetStream's
duplicate window and the store's keys keep one. Judging is pure (:func:`judge`); the store gives
the per-window counts (``Store.window_stats``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlsandbox.daemon.events.model import ALERT, Event

NODE = "_aggregator"  # the node of the aggregator's own events ('_' keeps it apart from node ids in subjects)


@dataclass(frozen=True, slots=True)
class AnomalyRules:
    window: float = 60.0
    baseline_windows: int = 10
    min_gradings: int = 20
    infra_error_rate: float = 0.2
    reward_jump: float = 0.3
    tampering_rate: float = 0.1
    tampering_factor: float = 3.0
    settle: float = 5.0  # seconds after a window's end before it is judged: late events arrive
    look_back: int = 3  # the last complete windows judged each time (a failed publish is retried)


@dataclass(frozen=True, slots=True)
class WindowStats:
    """The gradings of one run in one window (``index``: the window's start / window)."""

    run: str
    index: int
    gradings: int = 0
    infra_errors: int = 0
    rewarded: int = 0
    reward_sum: float = 0.0
    tampered: int = 0


@dataclass(slots=True)
class Anomaly:
    run: str
    kind: str
    index: int
    data: dict[str, Any] = field(default_factory=dict)

    def event(self, rules: AnomalyRules) -> Event:
        instance = f"anomaly:{self.run}:{self.kind}"
        data = {
            "kind": self.kind,
            "run": self.run,
            "window_start": self.index * rules.window,
            "window_seconds": rules.window,
            **self.data,
            "instance": instance,
        }
        return Event(ALERT, NODE, "", self.index, data, {"run": self.run}, ts=(self.index + 1) * rules.window, instance=instance)


def windows_to_judge(now: float, rules: AnomalyRules) -> range:
    """Indexes of the last ``look_back`` windows that ended at least ``settle`` seconds ago."""
    last = int((now - rules.settle) // rules.window) - 1
    return range(last - rules.look_back + 1, last + 1)


def judge(stats: list[WindowStats], now: float, rules: AnomalyRules) -> list[Anomaly]:
    by_run: dict[str, dict[int, WindowStats]] = {}
    for w in stats:
        by_run.setdefault(w.run, {})[w.index] = w
    found: list[Anomaly] = []
    for run, windows in sorted(by_run.items()):
        for index in windows_to_judge(now, rules):
            judged = windows.get(index)
            if judged is None or judged.gradings == 0:
                continue
            base = [windows[i] for i in range(index - rules.baseline_windows, index) if i in windows]
            found.extend(_judge_window(run, judged, base, rules))
    return found


def _judge_window(run: str, w: WindowStats, base: list[WindowStats], rules: AnomalyRules) -> list[Anomaly]:
    found: list[Anomaly] = []
    if w.gradings >= rules.min_gradings and w.infra_errors / w.gradings >= rules.infra_error_rate:
        found.append(
            Anomaly(
                run,
                "infra_error_rate",
                w.index,
                {"infra_errors": w.infra_errors, "gradings": w.gradings, "rate": w.infra_errors / w.gradings},
            )
        )
    base_rewarded = sum(b.rewarded for b in base)
    if w.rewarded >= rules.min_gradings and base_rewarded >= rules.min_gradings:
        mean = w.reward_sum / w.rewarded
        base_mean = sum(b.reward_sum for b in base) / base_rewarded
        if abs(mean - base_mean) >= rules.reward_jump:
            found.append(
                Anomaly(
                    run,
                    "reward_jump",
                    w.index,
                    {
                        "mean_reward": mean,
                        "baseline_mean_reward": base_mean,
                        "rewarded": w.rewarded,
                        "baseline_rewarded": base_rewarded,
                    },
                )
            )
    if w.gradings >= rules.min_gradings:
        rate = w.tampered / w.gradings
        base_gradings = sum(b.gradings for b in base)
        base_rate = sum(b.tampered for b in base) / base_gradings if base_gradings else 0.0
        if rate >= rules.tampering_rate and rate >= rules.tampering_factor * base_rate:
            found.append(
                Anomaly(
                    run,
                    "tampering_jump",
                    w.index,
                    {
                        "tampering_rate": rate,
                        "baseline_tampering_rate": base_rate,
                        "tampered": w.tampered,
                        "gradings": w.gradings,
                    },
                )
            )
    return found
