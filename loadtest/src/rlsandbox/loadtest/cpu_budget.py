"""Where the CPU of one command goes: per process, from /proc, under a steady `true` load.

    python -m rlsandbox.loadtest.cpu_budget [--seconds 8] [--json out.json]

A real daemon process with 64 Python sessions; two loads in one run: unary Exec (64 in flight, one
per session) and ExecBatch (64 sessions per call, two calls in flight). For each, the CPU time
(user + system) the daemon, this client, the agents (with the commands they ran: their reaped
children), the containerd shims and dockerd used per command, and the whole machine's. On a
two-core machine, 2 s of CPU per second is the ceiling, so ``2 / total`` is the best throughput a
load of that shape can reach; what dominates ``total`` is what to work on.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import time
from typing import Any

from rlsandbox.client import AsyncClient, AsyncSession, BatchCommand
from rlsandbox.loadtest.api_bench import CONFIG
from rlsandbox.loadtest.node import daemon_process, wait_quiet, wait_ready
from rlsandbox.loadtest.stats import bench_cli, machine, process_cpu

HZ = os.sysconf("SC_CLK_TCK")
COMPONENTS = ("daemon", "client", "agents", "shims", "dockerd", "total")


def _proc_cpu(pid: int, *, children: bool) -> float:
    cpu = process_cpu(pid)
    if cpu is None:
        return 0.0
    return cpu[0] + cpu[1] if children else cpu[0]


def _pids(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _machine_cpu() -> float:
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / HZ  # everything but idle and iowait


def snapshot(daemon_pid: int) -> dict[str, float]:
    me = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "daemon": _proc_cpu(daemon_pid, children=False),
        "client": me.ru_utime + me.ru_stime,
        "agents": sum(_proc_cpu(p, children=True) for p in _pids("/.rlsandbox/agent.py")),
        "shims": sum(_proc_cpu(p, children=False) for p in _pids("containerd-shim")),
        "dockerd": sum(_proc_cpu(p, children=False) for p in _pids("dockerd")),
        "total": _machine_cpu(),
    }


async def _measure(
    client: AsyncClient, daemon_pid: int, sessions: list[AsyncSession], mode: str, seconds: float
) -> dict[str, Any]:
    done = 0
    stop = time.monotonic() + seconds

    async def unary(s: AsyncSession) -> None:
        nonlocal done
        while time.monotonic() < stop:
            await s.exec(["true"])
            done += 1

    async def batch() -> None:
        nonlocal done
        requests = [BatchCommand(s.id, ["true"]) for s in sessions]
        while time.monotonic() < stop:
            await client.exec_batch(requests)
            done += len(requests)

    before, t0 = snapshot(daemon_pid), time.monotonic()
    if mode == "unary":
        await asyncio.gather(*(unary(s) for s in sessions))
    else:
        await asyncio.gather(batch(), batch())
    after, elapsed = snapshot(daemon_pid), time.monotonic() - t0
    per_command = {k: (after[k] - before[k]) / done * 1e3 for k in COMPONENTS}
    return {"commands_per_s": done / elapsed, "cpu_ms_per_command": per_command}


async def bench(seconds: float) -> dict[str, Any]:
    results: dict[str, Any] = {"machine": machine()}
    config = CONFIG.format(node=f"cpubudget-{os.getpid()}", max_sessions=300)
    async with daemon_process(config) as daemon, AsyncClient(daemon.address, timeout=120) as client:
        await wait_ready(client, "python", 8, 180)
        sessions = [await client.create_session("python", acquire_timeout=120) for _ in range(64)]
        for mode in ("unary", "batch"):
            await wait_quiet(client)
            await asyncio.sleep(2.0)
            results[mode] = await _measure(client, daemon.pid, sessions, mode, seconds)
        await asyncio.gather(*(s.close() for s in sessions))
    return results


def render(r: dict[str, Any]) -> str:
    lines = ["| load | commands/s | " + " | ".join(COMPONENTS) + " |", "|---|---|" + "---|" * len(COMPONENTS)]
    for mode, label in (("unary", "Exec, 64 in flight"), ("batch", "ExecBatch of 64, 2 in flight")):
        m = r[mode]
        cells = " | ".join(f"{m['cpu_ms_per_command'][k]:.3f}" for k in COMPONENTS)
        lines.append(f"| {label} | {m['commands_per_s']:,.0f} | {cells} |")
    lines.append("")
    lines.append("CPU milliseconds per command; `agents` includes the commands they ran, `total` is the whole machine.")
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each load")


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.seconds), render)


if __name__ == "__main__":
    main()
