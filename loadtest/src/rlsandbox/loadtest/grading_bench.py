"""Grading benchmark: clean-room grading latency and task validation throughput.

    python -m rlsandbox.loadtest.grading_bench [--samples 20] [--runs 3] [--json out.json]

A real daemon process, the real client. Measured in one run, on the sample task py-calc (a small
pytest project, hidden tests, 5 graded tests), each phase started on a settled node:

- baseline: the same pytest command run directly in the agent's sandbox (Exec);
- Evaluate in place (hidden tests added to the agent's sandbox, tests run there);
- Evaluate in a clean room (the default), acquire of the clean-room sandbox included;
- Evaluate in a clean room of a solved workspace (a paying grade), with and without the second
  opinion (each FAIL_TO_PASS test run again alone: grading/second_opinion.py), interleaved;
- validation of the sample tasks (`rlsandbox tasks validate` logic), in tasks per minute.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from rlsandbox.client import AsyncClient
from rlsandbox.daemon.grading.task import Task, load_tasks
from rlsandbox.daemon.grading.validate import validate
from rlsandbox.loadtest.foundation import timed_sequential
from rlsandbox.loadtest.node import daemon_process, wait_quiet, wait_ready
from rlsandbox.loadtest.stats import bench_cli, latency_table, machine, summary_ms

REPO = Path(__file__).resolve().parents[4]
DEFAULT_TASKS = REPO / "tests" / "fixtures" / "tasks"

CONFIG = """
node_id = "{node}"
listen_tcp = "127.0.0.1:{{port}}"
max_sessions = 200
create_concurrency = 4
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = {ready}
max_total = 64
[[pools]]
name = "node"
image = "rlsandbox/node:latest"
min_ready = 2
max_total = 16
"""


async def bench(samples: int, runs: int, tasks_dir: Path = DEFAULT_TASKS) -> dict[str, Any]:
    tasks = {t.id: t for t in load_tasks(tasks_dir)}
    calc = tasks["py-calc"]
    results: dict[str, Any] = {"task": calc.id, "samples": samples}
    config = CONFIG.format(node=f"gradebench-{os.getpid()}", ready=8)
    async with daemon_process(config) as daemon, AsyncClient(daemon.address, timeout=300) as client:
        await wait_ready(client, "python", 8, 300)
        async with client.session(task=calc) as s:
            await wait_quiet(client)
            command = calc.spec.evaluation.test_command
            results["pytest_direct"] = summary_ms(await timed_sequential(samples, lambda: s.exec(command, timeout=120)))
            await wait_quiet(client)
            results["evaluate_in_place"] = summary_ms(await timed_sequential(samples, lambda: s.grade(mode="in_place")))
        # Each clean-room grade takes a fresh sandbox; wait for refills between samples so that
        # every sample measures a warm acquire (the pool keeps 8 ready), as a trainer sees it.
        async with client.session(task=calc) as s:
            clean: list[float] = []
            for _ in range(samples):
                await wait_quiet(client)
                t0 = time.perf_counter()
                r = await s.grade()
                clean.append(time.perf_counter() - t0)
                assert r.status == "ok" and r.reward == 0.0, r
            results["evaluate_clean_room"] = summary_ms(clean)
        # A paying grade, with the second opinion and without it, interleaved (same node, same minute).
        solved = calc.spec.gold_patch or ""
        without = Task(
            calc.spec.model_copy(update={"evaluation": calc.spec.evaluation.model_copy(update={"second_opinion": "off"})}),
            calc.workspace_tar,
        )
        async with client.session(task=calc) as s:
            applied = await s.exec(["git", "apply", "-"], stdin=solved.encode())
            assert applied.exit_code == 0, applied.stderr
            paying: dict[str, list[float]] = {"with": [], "without": []}
            for _ in range(samples):
                for name, task in (("with", calc), ("without", without)):
                    await wait_quiet(client)
                    t0 = time.perf_counter()
                    r = await s.grade(task=task)
                    paying[name].append(time.perf_counter() - t0)
                    assert r.status == "ok" and r.reward == 1.0, r
            results["evaluate_paying_second_opinion"] = summary_ms(paying["with"])
            results["evaluate_paying_no_second_opinion"] = summary_ms(paying["without"])
        # Validation: the sample tasks, `runs` runs of each patch, 8 gradings at once.
        await wait_quiet(client)
        report = await validate(client, list(tasks.values()), runs=runs, concurrency=8)
        results["validation"] = {
            "tasks": len(report.tasks),
            "runs": runs,
            "gradings": sum(v.runs for v in report.tasks),
            "seconds": report.duration,
            "tasks_per_minute": len(report.tasks) / report.duration * 60,
            "gradings_per_minute": sum(v.runs for v in report.tasks) / report.duration * 60,
            "verdicts": report.counts(),
        }
    results["daemon_exit_code"] = daemon.exit_code
    base = results["pytest_direct"]["p50"]
    results["ratio_clean_room_over_pytest_p50"] = results["evaluate_clean_room"]["p50"] / base
    results["ratio_in_place_over_pytest_p50"] = results["evaluate_in_place"]["p50"] / base
    results["ratio_second_opinion_p50"] = (
        results["evaluate_paying_second_opinion"]["p50"] / results["evaluate_paying_no_second_opinion"]["p50"]
    )
    results["machine"] = machine()
    return results


def render(r: dict[str, Any]) -> str:
    rows = [
        ("pytest run directly in the session (Exec), the baseline", r["pytest_direct"]),
        ("Evaluate, in place", r["evaluate_in_place"]),
        ("Evaluate, clean room (acquire included)", r["evaluate_clean_room"]),
        ("Evaluate, clean room, a paying grade, no second opinion", r["evaluate_paying_no_second_opinion"]),
        ("Evaluate, clean room, a paying grade, second opinion (3 tests alone)", r["evaluate_paying_second_opinion"]),
    ]
    v = r["validation"]
    lines = latency_table(rows, digits=0)
    lines += [
        "",
        f"- clean room / baseline p50: {r['ratio_clean_room_over_pytest_p50']:.2f}x; "
        f"in place / baseline p50: {r['ratio_in_place_over_pytest_p50']:.2f}x; second opinion / none, "
        f"paying grade p50: {r['ratio_second_opinion_p50']:.2f}x",
        f"- validation of {v['tasks']} sample tasks, {v['runs']} runs per patch ({v['gradings']} gradings, 8 at once): "
        f"{v['seconds']:.1f} s, {v['tasks_per_minute']:.1f} tasks/min, {v['gradings_per_minute']:.0f} gradings/min; "
        f"verdicts {', '.join(f'{k} {n}' for k, n in v['verdicts'].items() if n)}",
        f"- daemon exit code after SIGTERM: {r['daemon_exit_code']}",
    ]
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tasks", type=Path, default=DEFAULT_TASKS)


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.samples, args.runs, args.tasks), render)


if __name__ == "__main__":
    main()
