"""Foundation benchmark: agent vs Engine API exec, warm acquire vs create+start, in one run.

    python -m rlsandbox.loadtest.foundation [--image rlsandbox/python-task:latest] [--json out.json]

Everything runs against the real Docker engine on the same image in the same process, so the
ratios are meaningful on a noisy machine even when absolute numbers drift between runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rlsandbox.daemon.model import AgentMode, ContainerSpec, ExecRequest
from rlsandbox.daemon.pool import CreateLimiter, PoolSpec, SandboxFactory, WarmPool
from rlsandbox.daemon.runtime.docker import LABEL_OWNER, DockerRuntime
from rlsandbox.loadtest.stats import bench_cli, latency_table, machine, summary_ms


async def timed_sequential(n: int, op: Callable[[], Awaitable[Any]]) -> list[float]:
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        await op()
        samples.append(time.perf_counter() - t)
    return samples


async def throughput(total: int, concurrency: int, op: Callable[[], Awaitable[Any]]) -> float:
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await op()

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total / (time.perf_counter() - t)


async def run(image: str, scale: float) -> dict[str, Any]:
    owner = f"bench-{os.getpid()}"
    n = lambda base: max(5, int(base * scale))  # noqa: E731
    true = ExecRequest(argv=("true",), timeout=30)
    async with DockerRuntime(owner=owner) as runtime:
        factory = SandboxFactory(runtime)
        results: dict[str, Any] = {}
        try:
            agent_sb = await factory.create(PoolSpec(name="bench-agent", container=ContainerSpec(image=image)))
            exec_sb = await factory.create(
                PoolSpec(name="bench-exec", container=ContainerSpec(image=image, agent=AgentMode.EXEC))
            )
            await timed_sequential(20, lambda: agent_sb.exec(true))  # warm-up
            await timed_sequential(5, lambda: exec_sb.exec(true))
            results["agent_exec_true"] = summary_ms(await timed_sequential(n(1000), lambda: agent_sb.exec(true)))
            results["engine_exec_true"] = summary_ms(await timed_sequential(n(100), lambda: exec_sb.exec(true)))
            results["agent_throughput_64"] = await throughput(n(4000), 64, lambda: agent_sb.exec(true))
            results["engine_throughput_16"] = await throughput(n(200), 16, lambda: exec_sb.exec(true))
            await factory.destroy(agent_sb)
            await factory.destroy(exec_sb)

            cold_spec = PoolSpec(name="bench-cold", container=ContainerSpec(image=image))
            cold: list[float] = []
            for _ in range(n(10)):
                t = time.perf_counter()
                sb = await factory.create(cold_spec)
                cold.append(time.perf_counter() - t)
                await factory.destroy(sb)
            results["cold_create_to_ready"] = summary_ms(cold)

            warm_n = n(30)
            spec = PoolSpec(name="bench-warm", container=ContainerSpec(image=image), min_ready=warm_n, max_total=warm_n * 2)
            pool = WarmPool(spec, factory, limiter=CreateLimiter(4))
            runner = asyncio.create_task(pool.run())
            while pool.stats().ready < warm_n:
                await asyncio.sleep(0.1)
            leased = []
            warm: list[float] = []
            for _ in range(warm_n):
                t = time.perf_counter()
                leased.append(await pool.acquire(timeout=60))
                warm.append(time.perf_counter() - t)
            results["warm_acquire"] = summary_ms(warm)
            for sb in leased:
                pool.release(sb)
            await pool.close()
            await runner
        finally:
            for c in await runtime.list_containers({LABEL_OWNER: owner}):
                await runtime.remove(c.id)
    r = results
    r["ratio_engine_over_agent_p50"] = r["engine_exec_true"]["p50"] / r["agent_exec_true"]["p50"]
    r["ratio_agent_over_engine_throughput"] = r["agent_throughput_64"] / r["engine_throughput_16"]
    r["ratio_cold_over_warm_p50"] = r["cold_create_to_ready"]["p50"] / r["warm_acquire"]["p50"]
    r["machine"] = machine()
    r["image"] = image
    return r


def render(r: dict[str, Any]) -> str:
    rows = [
        ("`true` via agent, sequential", r["agent_exec_true"]),
        ("`true` via Engine API exec, sequential", r["engine_exec_true"]),
        ("cold create+start to ready", r["cold_create_to_ready"]),
        ("warm acquire", r["warm_acquire"]),
    ]
    lines = latency_table(rows, digits=3)
    lines += [
        "",
        f"- agent throughput, 64 in flight, one sandbox: {r['agent_throughput_64']:.0f} commands/s",
        f"- Engine API exec throughput, 16 in flight: {r['engine_throughput_16']:.0f} commands/s",
        f"- Engine API exec p50 / agent p50: {r['ratio_engine_over_agent_p50']:.1f}x",
        f"- agent / Engine API throughput: {r['ratio_agent_over_engine_throughput']:.1f}x",
        f"- cold create p50 / warm acquire p50: {r['ratio_cold_over_warm_p50']:.0f}x",
    ]
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image", default="rlsandbox/python-task:latest")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every sample count")


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: run(args.image, args.scale), render)


if __name__ == "__main__":
    main()
