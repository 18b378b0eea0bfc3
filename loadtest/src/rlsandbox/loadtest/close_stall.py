"""Does closing a big session stall the others? Latency of `true` in one session while another,
holding many files, closes.

    python -m rlsandbox.loadtest.close_stall [--files 100000] [--rounds 3] [--json out.json]

A real daemon process. Session A runs `true` back to back; in each round, session B first writes
``--files`` small files (in /tmp and in its host-visible places, as a hostile program would),
then B is closed while A keeps going. Reported: A's p50/p99/max during the closes against the
same in a quiet window of the same length just before (ratios in one run). The close used to
stall every session (a synchronous rmtree of the agent's host folder on the event loop); the
folder now holds one socket and is removed off the loop, and the container's files are the
engine's to remove.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from rlsandbox.client import AsyncClient
from rlsandbox.loadtest.node import daemon_process, wait_quiet, wait_ready
from rlsandbox.loadtest.stats import bench_cli, machine, summary_ms

CONFIG = """
listen_tcp = "127.0.0.1:{port}"
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = 2
max_total = 8
"""
FILL = (
    "python3 -c 'import os\n"
    'for d in ("/tmp/many", "/.rlsandbox/sock"):\n'
    "    try:\n"
    "        os.makedirs(d, exist_ok=True)\n"
    '        [open(f"{{d}}/f{{i}}", "w").close() for i in range({n})]\n'
    "    except OSError:\n"
    "        pass\n"
    "'"
)


async def sample(client: AsyncClient, sid: str, until: float) -> list[float]:
    out = []
    while time.monotonic() < until:
        t = time.perf_counter()
        await client.exec(sid, ["true"])
        out.append(time.perf_counter() - t)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    quiet: list[float] = []
    closing: list[float] = []
    close_s: list[float] = []
    async with daemon_process(CONFIG) as node, AsyncClient(node.address, timeout=300) as client:
        await wait_ready(client, "python", 2, 180)
        a = await client.create_session("python")
        for _ in range(50):
            await a.exec(["true"])
        for _ in range(args.rounds):
            b = await client.create_session("python")
            filled = await b.exec(FILL.format(n=args.files), timeout=600)
            if filled.exit_code != 0:
                raise RuntimeError(f"filling the session failed: {filled.stderr.decode(errors='replace')}")
            await wait_quiet(client)
            window = args.window
            quiet += await sample(client, a.id, time.monotonic() + window)
            t = time.monotonic()
            sampler = asyncio.create_task(sample(client, a.id, t + window))
            await b.close()
            close_s.append(time.monotonic() - t)
            closing += await sampler
            await wait_quiet(client)
        await a.close()
    q, c = summary_ms(quiet), summary_ms(closing)
    return {
        "files": args.files,
        "rounds": args.rounds,
        "quiet": q,
        "while_closing": c,
        "close_seconds": close_s,
        "p99_ratio": c["p99"] / q["p99"],
        "max_ratio": c["max"] / q["max"],
        "machine": machine(),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--files", type=int, default=100_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window", type=float, default=3.0, help="seconds sampled quiet, and from each close on")


def render(r: dict[str, Any]) -> str:
    q, c = r["quiet"], r["while_closing"]
    return "\n".join(
        [
            f"`true` in another session while a session holding {r['files']:,} files closes "
            f"({r['rounds']} rounds, {r['machine']}):",
            "| window | n | p50 ms | p99 ms | max ms |",
            "|---|---|---|---|---|",
            f"| quiet, just before | {q['n']} | {q['p50']:.2f} | {q['p99']:.2f} | {q['max']:.2f} |",
            f"| from the close on | {c['n']} | {c['p50']:.2f} | {c['p99']:.2f} | {c['max']:.2f} |",
            f"- p99 ratio {r['p99_ratio']:.2f}x, max ratio {r['max_ratio']:.2f}x; CloseSession took "
            + ", ".join(f"{s:.2f} s" for s in r["close_seconds"]),
        ]
    )


if __name__ == "__main__":
    bench_cli(__doc__, add_arguments, run, render)
