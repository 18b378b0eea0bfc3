"""The cost of Prometheus metrics on the hot path: `true` through Exec with metrics off and on.

    python -m rlsandbox.loadtest.metrics_bench [--samples 2000] [--rounds 5] [--json out.json]

Two real daemon processes on the same machine, one with ``metrics_listen`` set (scraped every
second meanwhile, as Prometheus would, more often than usual), one without; the samples alternate
between them in rounds, so that machine noise falls on both alike. Reported: p50/p99 of each, the
overhead of metrics on p50 and on the mean, and throughput with 16 calls in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import urllib.request
from collections.abc import Awaitable, Callable
from typing import Any

from rlsandbox.client import AsyncClient, AsyncSession
from rlsandbox.loadtest.foundation import throughput, timed_sequential
from rlsandbox.loadtest.node import daemon_process, free_port, wait_quiet, wait_ready
from rlsandbox.loadtest.stats import bench_cli, latency_table, machine, summary_ms

CONFIG = """
node_id = "{node}"
listen_tcp = "127.0.0.1:{{port}}"
session_journal = ""
{metrics}
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = 1
max_total = 4
"""


def _true(s: AsyncSession) -> Callable[[], Awaitable[Any]]:
    return lambda: s.exec(["true"])


async def bench(samples: int, rounds: int) -> dict[str, Any]:
    port = free_port()
    off_cfg = CONFIG.format(node=f"metricsbench-off-{os.getpid()}", metrics="")
    on_cfg = CONFIG.format(node=f"metricsbench-on-{os.getpid()}", metrics=f'metrics_listen = "127.0.0.1:{port}"')
    lat: dict[str, list[float]] = {"off": [], "on": []}
    rates: dict[str, list[float]] = {"off": [], "on": []}
    scrapes = 0
    async with (
        daemon_process(off_cfg) as d_off,
        daemon_process(on_cfg) as d_on,
        AsyncClient(d_off.address, timeout=60) as c_off,
        AsyncClient(d_on.address, timeout=60) as c_on,
    ):
        for c in (c_off, c_on):
            await wait_ready(c, "python", 1, 300)
        s_off = await c_off.create_session("python")
        s_on = await c_on.create_session("python")
        for s in (s_off, s_on):
            await timed_sequential(100, _true(s))  # warm-up
        await wait_quiet(c_off)
        await wait_quiet(c_on)

        async def scraper() -> None:
            nonlocal scrapes
            while True:
                await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read())
                scrapes += 1
                await asyncio.sleep(1.0)

        scraping = asyncio.create_task(scraper())
        try:
            per = max(1, samples // rounds)
            for _ in range(rounds):
                for name, s in (("off", s_off), ("on", s_on)):
                    lat[name] += await timed_sequential(per, _true(s))
                for name, s in (("off", s_off), ("on", s_on)):
                    rates[name].append(await throughput(per, 16, _true(s)))
        finally:
            scraping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraping
        await s_off.close()
        await s_on.close()
    off, on = summary_ms(lat["off"]), summary_ms(lat["on"])
    off_rate, on_rate = sum(rates["off"]) / len(rates["off"]), sum(rates["on"]) / len(rates["on"])
    return {
        "off": off,
        "on": on,
        "throughput_16_off": off_rate,
        "throughput_16_on": on_rate,
        "overhead_p50_percent": (on["p50"] / off["p50"] - 1) * 100,
        "overhead_mean_percent": (on["mean"] / off["mean"] - 1) * 100,
        "throughput_change_percent": (on_rate / off_rate - 1) * 100,
        "scrapes": scrapes,
        "machine": machine(),
        "at": time.time(),
    }


def render(r: dict[str, Any]) -> str:
    lines = latency_table([("`true` via Exec, metrics off", r["off"]), ("`true` via Exec, metrics on", r["on"])])
    lines += [
        "",
        f"- overhead of metrics: p50 {r['overhead_p50_percent']:+.1f}%, mean {r['overhead_mean_percent']:+.1f}% "
        f"({r['scrapes']} scrapes meanwhile)",
        f"- throughput, 16 in flight: {r['throughput_16_off']:.0f}/s off, {r['throughput_16_on']:.0f}/s on "
        f"({r['throughput_change_percent']:+.1f}%)",
    ]
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.samples, args.rounds), render)


if __name__ == "__main__":
    main()
