"""Smoke runs of the benchmarks, so the harness keeps working (numbers are not asserted here:
benchmarks live in loadtest/ and their results in docs/BENCHMARKS.md)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import pytest
from rlsandbox.loadtest import adapter_bench, api_bench, events_bench, foundation, grading_bench, node_guard_bench

pytestmark = [pytest.mark.docker, pytest.mark.slow]


async def test_foundation_benchmark_runs(images: dict[str, str]) -> None:
    results = await foundation.run(images["python"], scale=0.02)
    assert results["agent_exec_true"]["n"] >= 5 and results["ratio_engine_over_agent_p50"] > 1
    assert "| warm acquire |" in foundation.render(results)


async def test_api_benchmark_runs(images: dict[str, str]) -> None:
    results = await api_bench.bench(live_sessions=10, scale=0.05)
    assert results["live_sessions"] == 10 and results["daemon_exit_code"] == 0
    assert results["exec_true_c64"]["n"] == 64 * 5
    assert "ExecBatch" in api_bench.render(results)


async def test_grading_benchmark_runs(images: dict[str, str]) -> None:
    results = await grading_bench.bench(samples=2, runs=1)
    assert results["evaluate_clean_room"]["n"] == 2 and results["daemon_exit_code"] == 0
    assert results["validation"]["verdicts"]["valid"] >= 2  # py-calc and node-strings
    assert "clean room" in grading_bench.render(results)


async def test_node_guard_benchmark_runs(images: dict[str, str]) -> None:
    """python -m rlsandbox.loadtest.node_guard_bench, as docs/BENCHMARKS.md runs it (one round):
    every runner's tests are witnessed under the guard (6 of node-jest's, 5 of mocha's)."""
    results = await node_guard_bench.run(argparse.Namespace(rounds=1))
    assert {n: r["witnesses"] for n, r in results["runners"].items()} == {"node --test": 3, "mocha": 5, "jest (in band)": 6}
    assert "| mocha |" in node_guard_bench.render(results)


async def test_events_benchmark_runs(images: dict[str, str]) -> None:
    results = await events_bench.bench(events=2000, execs=100, databases=["sqlite", "postgresql"], aggregators=[2])
    runs = results["end_to_end_runs"]
    assert [(e["database"], e["aggregators"]) for e in runs] == [("sqlite", 1), ("postgresql", 2)]
    assert all(e["integrity"]["events"] == 2000 and e["integrity"]["missing_events"] == 0 for e in runs)
    assert results["exec_overhead"]["published_by_daemon"] > 100  # the "on" daemon really published
    assert "end to end" in events_bench.render(results)


async def test_adapter_benchmark_runs(images: dict[str, str]) -> None:
    results = await adapter_bench.bench(steps=5, rounds=1)
    adapters = results["adapters"]
    assert {"raw client", "tools.run", "gymnasium", "skyrl-gym", "async raw client", "verl SandboxTool"} <= set(adapters)
    assert {"rLLM Sandbox", "slime Sandbox"} <= set(adapters)
    assert adapters["verl SandboxTool"]["baseline"] == "async raw client"
    assert adapters["slime Sandbox"]["baseline"] == "async raw client, bash -c"
    assert "overhead p50" in adapter_bench.render(results)


async def test_loadtest_harness_smoke_run(images: dict[str, str], tmp_path: Path) -> None:
    """`rlsandbox loadtest run --quick`: every scenario for a few seconds, the whole report."""
    out = tmp_path / "report"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlsandbox.daemon.cli", "--log-level", "WARNING", "loadtest", "run", "--quick", "--out", str(out),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    assert "## CreateSession bursts" in stdout.decode()
    assert "ops" in stderr.decode()  # the live progress line
    report = json.loads((out / "report.json").read_text())
    assert set(report["scenarios"]) == {"sweep", "batch", "episodes", "burst", "soak", "baseline"}
    batch = report["scenarios"]["batch"]["result"]
    assert batch["sessions"] == 4 and batch["commands_per_second"] > 0 and batch["failed_commands"] == 0
    assert report["errors"] == [] and report["leaked_containers"] == 0 and report["daemon_exit_code"] == 0
    assert report["scenarios"]["burst"]["result"]["warm"]["pool_hit_rate"] == 1.0
    assert report["scenarios"]["burst"]["result"]["cold"]["pool_hit_rate"] == 0.0
    assert any("cpu_percent" in p and "events_published" in p for p in report["timeline"])
    for png in ("latency_over_time.png", "latency_cdf.png", "throughput_vs_concurrency.png"):
        assert (out / png).read_bytes()[:4] == b"\x89PNG"
    assert "## Soak (open loop)" in (out / "report.md").read_text()
    assert "## ExecBatch" in (out / "report.md").read_text()
