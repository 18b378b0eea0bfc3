"""Chaos: SIGKILL the daemon under busy sessions, restart it, check that nothing was lost.

    python -m rlsandbox.loadtest.chaos [--sessions 100] [--rounds 5] [--busy 2.0] [--json out.json]

A real daemon process with its journal, a real nats-server and an aggregator (events on). Each
session holds a file, a persistent shell with an exported variable and a background process.
Every round, every session runs commands that stream output (and short ones in its shell) for
``--busy`` seconds, the daemon is SIGKILLed in the middle of that, started again, and every
session is checked: same id, its file, its shell's variable, its background process. At the end
the sessions are closed, the daemon stopped, and the report says: sessions lost (target 0),
containers left behind (0), events lost (0: numbers missing below one that arrived), and the
numbers the crashes left unused.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlsandbox.client import AsyncClient, SandboxRPCError
from rlsandbox.daemon.events.aggregator import Aggregator
from rlsandbox.daemon.events.nats_server import NatsServer
from rlsandbox.daemon.runtime.docker import LABEL_OWNER, DockerRuntime
from rlsandbox.loadtest.node import free_port
from rlsandbox.loadtest.stats import bench_cli, machine

CONFIG = """
node_id = "{node}"
listen_tcp = "127.0.0.1:{port}"
session_journal = "{dir}/sessions.sqlite3"
events_outbox = "{dir}/outbox.sqlite3"
nats_url = "{nats}"
max_sessions = {max_sessions}
create_concurrency = 8
shutdown_grace = 10.0
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = 4
max_total = {max_total}
memory_mb = 256
"""
STREAM = "for i in $(seq 1 400); do echo streaming line $i of a busy command; done; sleep 0.05"


async def start_daemon(config: Path, address: str) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlsandbox.daemon.cli", "--log-level", "WARNING", "daemon", "--config", str(config),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    async with AsyncClient(address, timeout=5) as client:
        deadline = time.monotonic() + 120
        while True:
            try:
                await client.node_status()
                return process
            except SandboxRPCError:
                if process.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the daemon did not start (exit {process.returncode})") from None
                await asyncio.sleep(0.1)


async def busy(client: AsyncClient, sid: str, until: float, counts: dict[str, int]) -> None:
    while time.monotonic() < until:
        try:
            await client.exec(sid, STREAM, timeout=30)
            await client.exec(sid, "echo $MARK", shell_session="main", timeout=30)
            counts["ok"] += 2
        except SandboxRPCError:
            counts["errors"] += 1  # the daemon went away under this call: expected
            return


async def check(client: AsyncClient, sid: str, mark: int) -> str | None:
    """None if the session came back whole, else what is wrong."""
    try:
        state = await client.exec(sid, f"cat /workspace/state-{mark}; pgrep -f 'sleep 100000' >/dev/null && echo bg")
        shell = await client.exec(sid, "echo $MARK", shell_session="main")
    except SandboxRPCError as e:
        return f"{type(e).__name__}: {e}"
    if state.stdout != f"session {mark}\nbg\n".encode():
        return f"files or background process: {state.stdout!r}"
    if shell.stdout != f"{mark}\n".encode():
        return f"shell: {shell.stdout!r}"
    return None


async def run(args: argparse.Namespace) -> dict[str, Any]:
    node = f"chaos-{os.getpid()}"
    results: dict[str, Any] = {"sessions": args.sessions, "rounds": [], "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="rls-chaos-") as tmp:
        nats = NatsServer(Path(tmp) / "jetstream")
        await nats.start()
        agg = Aggregator(nats.url, Path(tmp) / "agg.sqlite3")
        agg_task = asyncio.create_task(agg.run())
        port = free_port()
        address = f"127.0.0.1:{port}"
        config = Path(tmp) / "daemon.toml"
        config.write_text(
            CONFIG.format(
                node=node, port=port, dir=tmp, nats=nats.url, max_sessions=args.sessions + 20, max_total=args.sessions + 8
            )
        )
        process = await start_daemon(config, address)
        try:
            async with AsyncClient(address, timeout=120) as client:
                ids: list[str] = []
                for i in range(args.sessions):
                    s = await client.create_session("python", labels={"run": node})
                    await s.write_files({f"/workspace/state-{i}": f"session {i}\n"})
                    await s.exec(f"export MARK={i}", shell_session="main")
                    await s.exec("nohup sleep 100000 >/dev/null 2>&1 &")
                    ids.append(s.id)
                print(f"chaos: {len(ids)} sessions ready", file=sys.stderr)
                for r in range(args.rounds):
                    counts = {"ok": 0, "errors": 0}
                    until = time.monotonic() + args.busy * 2
                    load = [asyncio.create_task(busy(client, sid, until, counts)) for sid in ids]
                    await asyncio.sleep(args.busy)
                    process.send_signal(signal.SIGKILL)
                    await process.wait()
                    killed = time.monotonic()
                    await asyncio.gather(*load)
                    process = await start_daemon(config, address)
                    restarted = time.monotonic() - killed
                    problems = {
                        sid: p
                        for sid, p in zip(
                            ids, await asyncio.gather(*(check(client, sid, i) for i, sid in enumerate(ids))), strict=True
                        )
                        if p
                    }
                    status = await client.node_status()
                    round_result = {
                        "round": r + 1,
                        "commands_before_kill": counts["ok"],
                        "calls_cut_by_the_kill": counts["errors"],
                        "restart_to_serving_s": round(restarted, 2),
                        "sessions_after": status.sessions,
                        "lost": len(problems),
                        "problems": dict(list(problems.items())[:5]),
                    }
                    results["rounds"].append(round_result)
                    print(f"chaos: round {r + 1}: {round_result}", file=sys.stderr)
                    ids = [sid for sid in ids if sid not in problems]
                for sid in ids:
                    with contextlib.suppress(SandboxRPCError):
                        await client.close_session(sid)
            process.send_signal(signal.SIGTERM)
            await asyncio.wait_for(process.wait(), 120)
            async with DockerRuntime(owner=node) as docker:
                left = await docker.list_containers({LABEL_OWNER: node})
            results["containers_left"] = len(left)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # the aggregator catches up with every closed event
                closed = agg.store._rows("SELECT COUNT(*) AS n FROM sessions WHERE state = 'closed'")[0]["n"]
                if closed >= len(ids):
                    break
                await asyncio.sleep(0.5)
            results["events"] = agg.store.integrity()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
            agg.stop()
            await asyncio.wait_for(agg_task, 30)
            await nats.stop()
    results["sessions_lost"] = sum(r["lost"] for r in results["rounds"])
    return results


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sessions", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--busy", type=float, default=2.0, help="seconds of load before each SIGKILL")


def render(r: dict[str, Any]) -> str:
    lines = [
        f"chaos: {r['sessions']} busy sessions, {len(r['rounds'])} SIGKILLs of the daemon ({r['machine']})",
        "| round | commands before the kill | calls cut by it | restart to serving (s) | sessions lost |",
        "|---|---|---|---|---|",
    ]
    for x in r["rounds"]:
        cells = (x["round"], x["commands_before_kill"], x["calls_cut_by_the_kill"], x["restart_to_serving_s"], x["lost"])
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    e = r.get("events", {})
    lines.append(
        f"- sessions lost: {r['sessions_lost']}; containers left after stop: {r.get('containers_left')}; events: "
        f"{e.get('events')} received, lost {e.get('missing_events')} (in crash windows {e.get('crash_window_lost')}), "
        f"numbers unused {e.get('crash_window_unused')}, duplicates {e.get('duplicates')}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    bench_cli(__doc__, add_arguments, run, render)
