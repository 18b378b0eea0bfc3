"""Events benchmark: end-to-end events per second, and what publishing costs an exec step.

    python -m rlsandbox.loadtest.events_bench [--events 200000] [--execs 2000] [--json out.json]

Real parts: a nats-server with JetStream (child process), the aggregator (`rlsandbox aggregator`,
child process, SQLite), the daemon's EventPublisher in this process.

1. End to end: ``--events`` step events over 1,000 sessions are emitted as fast as the publisher
   takes them; measured until the aggregator's database holds all of them (and until JetStream
   acknowledged all of them, for the publisher alone).
2. Overhead: two daemon processes on the same machine, one publishing events (to the same
   nats-server, aggregator running) and one not; `true` through the API at concurrency 1,
   alternating blocks of 100 between them so that drift hits both alike. Ratio of p50s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlsandbox.client import AsyncClient
from rlsandbox.daemon.events.model import STEP, Event
from rlsandbox.daemon.events.nats_server import NatsServer
from rlsandbox.daemon.events.publisher import EventPublisher
from rlsandbox.daemon.events.store import Store
from rlsandbox.loadtest.node import daemon_process, wait_quiet, wait_ready
from rlsandbox.loadtest.stats import bench_cli, machine, summary_ms

DAEMON = """
node_id = "{node}"
listen_tcp = "127.0.0.1:{{port}}"
nats_url = "{nats}"
events_outbox = "{outbox}"
heartbeat_interval = 5.0
[[pools]]
name = "busybox"
image = "rlsandbox/busybox:latest"
min_ready = 2
max_total = 8
memory_mb = 64
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = 1
max_total = 4
"""


def _step_data(i: int) -> dict[str, Any]:
    return {
        "argv": ["python3", "-m", "pytest", "-q", f"tests/test_{i % 50}.py"],
        "shell": None,
        "shell_session": None,
        "step_seq": None,
        "exit_code": i % 3,
        "signal": None,
        "timed_out": False,
        "duration": 0.0123,
        "stdout_bytes": 1234,
        "stderr_bytes": 0,
        "truncated": False,
    }


async def _aggregator(url: str, db: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlsandbox.daemon.cli", "--log-level", "WARNING", "aggregator", "--nats", url, "--db", str(db),
        "--http", "", stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


async def end_to_end(server: NatsServer, tmp: Path, count: int) -> dict[str, Any]:
    db = tmp / "agg.sqlite3"
    agg = await _aggregator(server.url, db)
    publisher = EventPublisher(
        "bench", "i1", nats_url=server.url, outbox_path=tmp / "outbox.sqlite3", outbox_max_bytes=1 << 30, heartbeat_interval=0
    )
    await publisher.start()
    try:
        while not publisher.stats().connected:
            await asyncio.sleep(0.05)
        sessions = 1000
        seqs = [0] * sessions
        labels = {"run": "bench", "task": "t"}
        t0 = time.perf_counter()
        emit_cpu = time.process_time()
        for i in range(count):
            s = i % sessions
            seqs[s] += 1
            publisher.emit(Event(STEP, "bench", f"bench-s{s}", seqs[s], _step_data(i), labels))
            if i % 2000 == 1999:
                await asyncio.sleep(0)  # let the publisher run, as the daemon's loop would
        emit_s = time.perf_counter() - t0
        emit_cpu = time.process_time() - emit_cpu
        while publisher.stats().published_total < count:
            await asyncio.sleep(0.01)
        published_s = time.perf_counter() - t0
        store = Store(db)
        try:
            while True:
                n = (await asyncio.to_thread(store.integrity))["events"]
                if n >= count:
                    break
                await asyncio.sleep(0.05)
            stored_s = time.perf_counter() - t0
            integrity = store.integrity()
        finally:
            store.close()
        return {
            "events": count,
            "emit_us_per_event": emit_s / count * 1e6,
            "publisher_acked_per_s": count / published_s,
            "end_to_end_per_s": count / stored_s,
            "end_to_end_s": stored_s,
            "outbox_used": publisher.stats().outbox_events,
            "integrity": integrity,
            "event_bytes": len(Event(STEP, "bench", "bench-s1", 1, _step_data(1), labels).to_json()),
        }
    finally:
        await publisher.stop()
        agg.terminate()
        await agg.wait()


async def overhead(server: NatsServer, tmp: Path, execs: int) -> dict[str, Any]:
    with_events = DAEMON.format(node=f"evb-on-{os.getpid()}", nats=server.url, outbox=tmp / "on.sqlite3")
    without = DAEMON.format(node=f"evb-off-{os.getpid()}", nats="", outbox=tmp / "off.sqlite3")
    agg = await _aggregator(server.url, tmp / "agg2.sqlite3")
    try:
        async with (
            daemon_process(with_events) as on,
            daemon_process(without) as off,
            AsyncClient(on.address, timeout=60) as c_on,
            AsyncClient(off.address, timeout=60) as c_off,
        ):
            await wait_ready(c_on, "python", 1, 180)
            await wait_ready(c_off, "python", 1, 180)
            s_on = await c_on.create_session("python")
            s_off = await c_off.create_session("python")
            await wait_quiet(c_on)
            await wait_quiet(c_off)
            samples: dict[str, list[float]] = {"on": [], "off": []}
            for s in (s_on, s_off):
                for _ in range(50):
                    await s.exec(["true"])
            for block in range(max(1, execs // 100)):
                order = [("on", s_on), ("off", s_off)] if block % 2 == 0 else [("off", s_off), ("on", s_on)]
                for name, s in order:
                    for _ in range(100):
                        t = time.perf_counter()
                        await s.exec(["true"])
                        samples[name].append(time.perf_counter() - t)
            status = await c_on.node_status()
            await s_on.close()
            await s_off.close()
        on_s, off_s = summary_ms(samples["on"]), summary_ms(samples["off"])
        return {
            "exec_true_with_events": on_s,
            "exec_true_without_events": off_s,
            "overhead_p50_percent": (on_s["p50"] / off_s["p50"] - 1) * 100,
            "overhead_mean_percent": (on_s["mean"] / off_s["mean"] - 1) * 100,
            "published_by_daemon": status.events.published_total,
        }
    finally:
        agg.terminate()
        await agg.wait()


async def bench(events: int, execs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        server = NatsServer(tmp / "js")
        await server.start()
        try:
            results = {"end_to_end": await end_to_end(server, tmp, events)}
            results["exec_overhead"] = await overhead(server, tmp, execs)
        finally:
            await server.stop()
    results["machine"] = machine()
    return results


def render(r: dict[str, Any]) -> str:
    e, o = r["end_to_end"], r["exec_overhead"]
    return "\n".join(
        [
            f"- {e['events']:,} step events ({e['event_bytes']} bytes each) over 1,000 sessions: "
            f"emit {e['emit_us_per_event']:.1f} us each; acknowledged by JetStream at {e['publisher_acked_per_s']:,.0f}/s; "
            f"in the aggregator's database at "
            f"**{e['end_to_end_per_s']:,.0f}/s end to end** ({e['end_to_end_s']:.1f} s); "
            f"missing {e['integrity']['missing_events']}, duplicates {e['integrity']['duplicates']}",
            f"- `true` through the API at concurrency 1, daemon with events: p50 {o['exec_true_with_events']['p50']:.3f} ms; "
            f"without: p50 {o['exec_true_without_events']['p50']:.3f} ms; **overhead {o['overhead_p50_percent']:+.1f}% of p50** "
            f"({o['overhead_mean_percent']:+.1f}% of the mean; n={o['exec_true_with_events']['n']} each, alternating blocks)",
        ]
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--execs", type=int, default=2000)


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.events, args.execs), render)


if __name__ == "__main__":
    main()
