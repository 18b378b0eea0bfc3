"""End-to-end API benchmark: a real daemon process, the real client, over gRPC on loopback.

    python -m rlsandbox.loadtest.api_bench [--live-sessions 1000] [--json out.json]

The daemon runs as its own process (`rlsandbox daemon`), as in production, so client and daemon
do not share an event loop. Measured in one run: `true` latency at concurrency 1 and 64, aggregate
throughput over many sessions, ExecBatch throughput, warm session hand-outs per second, and how
many concurrent live busybox sessions the node holds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from rlsandbox.client import AsyncClient, AsyncSession, BatchCommand, ResourceExhaustedError
from rlsandbox.loadtest.foundation import throughput, timed_sequential
from rlsandbox.loadtest.node import daemon_process, daemon_rss, wait_quiet, wait_ready
from rlsandbox.loadtest.stats import bench_cli, latency_table, machine, summary_ms

CONFIG = """
node_id = "{node}"
listen_tcp = "127.0.0.1:{{port}}"
max_sessions = {max_sessions}
create_concurrency = 4
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = 8
max_total = 200
[[pools]]
name = "busybox"
image = "rlsandbox/busybox:latest"
min_ready = 32
max_total = {max_sessions}
memory_mb = 32
cpus = 0.1
pids = 32
"""


async def bench(live_sessions: int, scale: float) -> dict[str, Any]:
    node = f"apibench-{os.getpid()}"
    n = lambda base: max(5, int(base * scale))  # noqa: E731
    results: dict[str, Any] = {}
    config = CONFIG.format(node=node, max_sessions=max(live_sessions + 100, 300))
    async with daemon_process(config) as daemon, AsyncClient(daemon.address, timeout=120) as client:
        await wait_ready(client, "python", 8, 180)
        true = ["true"]

        one = await client.create_session("python")
        await wait_quiet(client)
        await timed_sequential(50, lambda: one.exec(true))
        results["exec_true_c1"] = summary_ms(await timed_sequential(n(1000), lambda: one.exec(true)))

        sessions: list[AsyncSession] = [await client.create_session("python", acquire_timeout=120) for _ in range(63)]
        sessions.append(one)
        await wait_quiet(client)
        samples: list[float] = []

        async def worker(s: AsyncSession, count: int) -> None:
            for _ in range(count):
                t = time.perf_counter()
                await s.exec(true)
                samples.append(time.perf_counter() - t)

        per = n(100)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(s, per) for s in sessions))
        results["exec_true_c64_throughput"] = len(samples) / (time.perf_counter() - t0)
        results["exec_true_c64"] = summary_ms(samples)

        batch = [BatchCommand(s.id, true) for s in sessions]
        batches = n(50)
        for in_flight in (1, 2):
            # With one call in flight the node idles while the slowest command of each call ends;
            # a trainer stepping two groups of environments keeps it busy.
            async def caller(count: int) -> None:
                for _ in range(count):
                    await client.exec_batch(batch)

            t0 = time.perf_counter()
            await asyncio.gather(*(caller(batches // in_flight) for _ in range(in_flight)))
            done = (batches // in_flight) * in_flight * len(batch)
            results[f"exec_batch_64_x{in_flight}_commands_per_s"] = done / (time.perf_counter() - t0)
        await asyncio.gather(*(s.close() for s in sessions))

        # Warm hand-outs: create + close, as fast as the pool allows.
        await wait_quiet(client)

        # Hand-outs: a burst of CreateSession calls served from ready sandboxes (the pool
        # keeps 32 ready), 8 in flight; the sessions are closed afterwards, untimed.
        burst: list[AsyncSession] = []

        async def handout() -> None:
            burst.append(await client.create_session("busybox"))

        results["sessions_handed_out_per_s"] = await throughput(32, 8, handout)
        await asyncio.gather(*(s.close() for s in burst))
        await wait_quiet(client)
        handout_lat = await timed_sequential(10, lambda: client.create_session("busybox", acquire_timeout=60))
        results["warm_create_session"] = summary_ms(handout_lat)
        for s in await client.list_sessions(pool="busybox"):
            await client.close_session(s.session_id)

        # Live sessions: hold as many busybox sessions as asked, all answering.
        live: list[AsyncSession] = []
        t0 = time.perf_counter()
        sem = asyncio.Semaphore(64)

        async def hold() -> None:
            async with sem:
                try:
                    live.append(await client.create_session("busybox", acquire_timeout=600))
                except ResourceExhaustedError:
                    pass

        await asyncio.gather(*(hold() for _ in range(live_sessions)))
        results["live_sessions_created_s"] = time.perf_counter() - t0
        answers = await asyncio.gather(*(s.exec(["echo", "ok"]) for s in live), return_exceptions=True)
        results["live_sessions"] = sum(1 for a in answers if not isinstance(a, BaseException) and a.stdout == b"ok\n")
        results["daemon_rss_mb_with_live_sessions"] = await daemon_rss(daemon.pid) / 2**20
        status = await client.node_status()
        results["load1_with_live_sessions"] = status.load1
        t0 = time.perf_counter()
        await asyncio.gather(*(s.close() for s in live))
        results["live_sessions_closed_s"] = time.perf_counter() - t0
    results["daemon_exit_code"] = daemon.exit_code
    results["machine"] = machine()
    return results


def render(r: dict[str, Any]) -> str:
    rows = [
        ("`true`, 1 session, sequential", r["exec_true_c1"]),
        ("`true`, 64 sessions, 64 in flight", r["exec_true_c64"]),
        ("CreateSession from a warm pool", r["warm_create_session"]),
    ]
    lines = latency_table(rows, digits=2)
    lines += [
        "",
        f"- aggregate `true` throughput, 64 in flight over 64 sessions: {r['exec_true_c64_throughput']:.0f} commands/s",
        f"- ExecBatch of 64 sessions: {r['exec_batch_64_x1_commands_per_s']:.0f} commands/s with one call in flight, "
        f"{r['exec_batch_64_x2_commands_per_s']:.0f} with two",
        f"- warm sessions handed out (burst of 32 CreateSession, 8 in flight): {r['sessions_handed_out_per_s']:.0f}/s",
        f"- live busybox sessions held, each answering a command: {r['live_sessions']} "
        f"(created in {r['live_sessions_created_s']:.0f} s, closed in {r['live_sessions_closed_s']:.0f} s; "
        f"daemon RSS {r['daemon_rss_mb_with_live_sessions']:.0f} MB, load1 {r['load1_with_live_sessions']:.1f})",
        f"- daemon exit code after SIGTERM: {r['daemon_exit_code']}",
    ]
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--live-sessions", type=int, default=1000)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every sample count")


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.live_sessions, args.scale), render)


if __name__ == "__main__":
    main()
