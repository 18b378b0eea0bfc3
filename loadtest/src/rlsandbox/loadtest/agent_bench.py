"""The agent's own CPU per command, this version against another, alternating in one run.

    git show <commit>:daemon/src/rlsandbox/daemon/agent/sandbox_agent.py > /tmp/old_agent.py
    python -m rlsandbox.loadtest.agent_bench --baseline /tmp/old_agent.py [--rounds 3] [--json out.json]

Each agent runs on this host (no container: what is compared is the agent's code) on a unix
socket, driven by the daemon's own AgentChannel with `true`, 4 in flight. Measured from /proc:
the agent process's CPU (its Python: framing, spawning, reaping) apart from its children's (the
commands themselves), per command. Rounds alternate the two versions so that drift on a shared
machine hits both.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlsandbox.daemon.agent import AGENT_PATH
from rlsandbox.daemon.agent.socket_transport import AgentListener, accept_agent
from rlsandbox.daemon.model import ExecRequest
from rlsandbox.loadtest.stats import bench_cli, machine, process_cpu


def _cpu(pid: int) -> tuple[float, float]:
    cpu = process_cpu(pid)
    assert cpu is not None, f"agent {pid} is gone"
    return cpu


async def one_round(agent: Path, commands: int, in_flight: int = 4) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "agent.sock"
        listener = await AgentListener.open(path)
        proc = await asyncio.create_subprocess_exec(sys.executable, str(agent), "--connect", str(path))
        try:
            channel = await accept_agent(listener, "bench", 10)
            await listener.close()
            req = ExecRequest(argv=("true",), timeout=10, cwd=tmp)
            for _ in range(100):
                await channel.exec(req)
            self0, children0 = _cpu(proc.pid)
            t0 = time.perf_counter()
            left = commands

            async def worker() -> None:
                nonlocal left
                while left > 0:
                    left -= 1
                    assert (await channel.exec(req)).exit_code == 0

            await asyncio.gather(*(worker() for _ in range(in_flight)))
            elapsed = time.perf_counter() - t0
            self1, children1 = _cpu(proc.pid)
            await channel.close("done")
        finally:
            proc.terminate()
            await proc.wait()
    return {
        "commands_per_s": commands / elapsed,
        "agent_ms_per_command": (self1 - self0) / commands * 1e3,
        "children_ms_per_command": (children1 - children0) / commands * 1e3,
    }


async def bench(baseline: Path, rounds: int, commands: int) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], "current": []}
    for _ in range(rounds):
        runs["baseline"].append(await one_round(baseline, commands))
        runs["current"].append(await one_round(AGENT_PATH, commands))
    summary = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }  # fmt: skip
    return {"machine": machine(), "baseline_file": str(baseline), "rounds": runs, "median": summary}


def render(r: dict[str, Any]) -> str:
    b, c = r["median"]["baseline"], r["median"]["current"]
    lines = [
        "| agent | commands/s | agent CPU ms/command | children CPU ms/command |",
        "|---|---|---|---|",
        f"| baseline ({Path(r['baseline_file']).name}) | {b['commands_per_s']:,.0f} | {b['agent_ms_per_command']:.3f} | "
        f"{b['children_ms_per_command']:.3f} |",
        f"| current | {c['commands_per_s']:,.0f} | {c['agent_ms_per_command']:.3f} | {c['children_ms_per_command']:.3f} |",
        "",
        f"current / baseline agent CPU per command: {c['agent_ms_per_command'] / b['agent_ms_per_command']:.2f}x "
        f"(medians of {len(r['rounds']['current'])} alternating rounds)",
    ]
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--baseline", type=Path, required=True, help="another sandbox_agent.py to compare with")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--commands", type=int, default=3000, help="commands per round")


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.baseline, args.rounds, args.commands), render)


if __name__ == "__main__":
    main()
