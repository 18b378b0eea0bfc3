"""Events benchmark: end-to-end events per second, and what publishing costs an exec step.

    python -m rlsandbox.loadtest.events_bench [--events 200000] [--execs 2000]
        [--databases sqlite,postgresql] [--aggregators 1,2] [--rounds 1] [--json out.json]

Real parts: a nats-server with JetStream (child process), the aggregators (`rlsandbox aggregator`,
child processes) writing SQLite or PostgreSQL (Debian's server, a private cluster with its default
durability: fsync on, synchronous commit), the daemon's EventPublisher in this process.

1. End to end: ``--events`` step events over 1,000 sessions are emitted as fast as the publisher
   takes them; measured until the aggregator's database holds all of them (and until JetStream
   acknowledged all of them, for the publisher alone). Once per database and number of
   aggregators sharing the consumer (``--aggregators``), one after the other in the same run.
2. Overhead: three daemon processes on the same machine: one publishing events and answering each
   call once its events are durable (``events_confirm_timeout``, the default), one publishing
   without waiting (0), one without events; `true` through the API at concurrency 1, rotating
   blocks of 100 between them so that drift hits all alike. Ratios of p50s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlsandbox.client import AsyncClient
from rlsandbox.daemon.events.database import is_url
from rlsandbox.daemon.events.model import STEP, Event
from rlsandbox.daemon.events.nats_server import NatsServer
from rlsandbox.daemon.events.publisher import EventPublisher
from rlsandbox.daemon.events.store import Store
from rlsandbox.loadtest.node import daemon_process, wait_quiet, wait_ready
from rlsandbox.loadtest.postgres import postgres_server
from rlsandbox.loadtest.stats import bench_cli, machine, summary_ms

DAEMON = """
node_id = "{node}"
listen_tcp = "127.0.0.1:{{port}}"
nats_url = "{nats}"
events_outbox = "{outbox}"
session_journal = "{outbox}.journal"
events_confirm_timeout = {confirm}
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


async def _aggregator(url: str, db: Path | str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlsandbox.daemon.cli", "--log-level", "WARNING", "aggregator", "--nats", url, "--db", str(db),
        "--http", "", stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


async def end_to_end(server: NatsServer, tmp: Path, count: int, db: Path | str, aggregators: int = 1) -> dict[str, Any]:
    """``db``: a new, empty database; ``aggregators`` processes share the consumer and write it."""
    aggs = [await _aggregator(server.url, db) for _ in range(aggregators)]
    run = f"r{time.monotonic_ns()}"  # a new instance each time: JetStream drops a message id it saw lately
    publisher = EventPublisher(
        "bench", run, nats_url=server.url, outbox_path=tmp / f"outbox-{run}.sqlite3", outbox_max_bytes=1 << 30
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
            publisher.emit(Event(STEP, "bench", f"{run}-s{s}", seqs[s], _step_data(i), labels))
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
            "database": "postgresql" if is_url(db) else "sqlite",
            "aggregators": aggregators,
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
        for agg in aggs:
            agg.terminate()
            await agg.wait()


async def overhead(server: NatsServer, tmp: Path, execs: int) -> dict[str, Any]:
    pid = os.getpid()
    configs = {
        "confirmed": DAEMON.format(node=f"evb-conf-{pid}", nats=server.url, outbox=tmp / "conf.sqlite3", confirm=0.25),
        "on": DAEMON.format(node=f"evb-on-{pid}", nats=server.url, outbox=tmp / "on.sqlite3", confirm=0),
        "off": DAEMON.format(node=f"evb-off-{pid}", nats="", outbox=tmp / "off.sqlite3", confirm=0),
    }
    agg = await _aggregator(server.url, tmp / "agg2.sqlite3")
    try:
        async with contextlib.AsyncExitStack() as stack:
            sessions = {}
            clients = {}
            for name, config in configs.items():
                node = await stack.enter_async_context(daemon_process(config))
                clients[name] = await stack.enter_async_context(AsyncClient(node.address, timeout=60))
                await wait_ready(clients[name], "python", 1, 180)
                sessions[name] = await clients[name].create_session("python")
            for c in clients.values():
                await wait_quiet(c)
            samples: dict[str, list[float]] = {name: [] for name in configs}
            for s in sessions.values():
                for _ in range(50):
                    await s.exec(["true"])
            names = list(configs)
            for block in range(max(1, execs // 100)):
                for name in names[block % 3 :] + names[: block % 3]:
                    s = sessions[name]
                    for _ in range(100):
                        t = time.perf_counter()
                        await s.exec(["true"])
                        samples[name].append(time.perf_counter() - t)
            status = await clients["confirmed"].node_status()
            for s in sessions.values():
                await s.close()
        stats = {name: summary_ms(v) for name, v in samples.items()}
        off = stats["off"]
        return {
            "exec_true_with_events": stats["on"],
            "exec_true_with_events_confirmed": stats["confirmed"],
            "exec_true_without_events": off,
            "overhead_p50_percent": (stats["on"]["p50"] / off["p50"] - 1) * 100,
            "overhead_mean_percent": (stats["on"]["mean"] / off["mean"] - 1) * 100,
            "confirmed_overhead_p50_percent": (stats["confirmed"]["p50"] / off["p50"] - 1) * 100,
            "published_by_daemon": status.events.published_total if status.events is not None else 0,
        }
    finally:
        agg.terminate()
        await agg.wait()


async def bench(events: int, execs: int, databases: list[str], aggregators: list[int], rounds: int = 1) -> dict[str, Any]:
    results: dict[str, Any] = {"end_to_end_runs": []}
    with tempfile.TemporaryDirectory() as d, contextlib.ExitStack() as stack:
        tmp = Path(d)
        postgres = stack.enter_context(postgres_server()) if "postgresql" in databases else None
        server = NatsServer(tmp / "js")
        await server.start()
        try:
            for round_ in range(rounds):  # the whole sequence again: the machine's drift hits every setup alike
                for database in databases:
                    for n in aggregators if database == "postgresql" else [1]:
                        name = f"agg_{database}_{n}_{round_}"
                        db = postgres.create_database(name) if postgres and database == "postgresql" else tmp / name
                        results["end_to_end_runs"].append(await end_to_end(server, tmp, events, db, n))
            results["end_to_end"] = results["end_to_end_runs"][0]
            if execs:
                results["exec_overhead"] = await overhead(server, tmp, execs)
        finally:
            await server.stop()
    results["machine"] = machine()
    return results


def render(r: dict[str, Any]) -> str:
    e = r["end_to_end"]
    setups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for x in r["end_to_end_runs"]:
        setups.setdefault((x["database"], x["aggregators"]), []).append(x)
    first = statistics.median(x["end_to_end_per_s"] for x in next(iter(setups.values())))
    lines = []
    for (database, n), runs in setups.items():
        rates = [x["end_to_end_per_s"] for x in runs]
        lines.append(
            f"- {database}, {n} aggregator(s): **{statistics.median(rates):,.0f} events/s end to end** (median of "
            f"{', '.join(f'{v:,.0f}' for v in rates)}; {statistics.median(rates) / first:.2f}x the first setup), "
            f"missing {sum(x['integrity']['missing_events'] for x in runs)}, "
            f"duplicates {sum(x['integrity']['duplicates'] for x in runs)}"
        )
    if "exec_overhead" not in r:
        return "\n".join(lines)
    o = r["exec_overhead"]
    return "\n".join(
        [
            *lines,
            f"- {e['events']:,} step events ({e['event_bytes']} bytes each) over 1,000 sessions: "
            f"emit {e['emit_us_per_event']:.1f} us each; acknowledged by JetStream at {e['publisher_acked_per_s']:,.0f}/s; "
            f"in the aggregator's database at "
            f"**{e['end_to_end_per_s']:,.0f}/s end to end** ({e['end_to_end_s']:.1f} s); "
            f"missing {e['integrity']['missing_events']}, duplicates {e['integrity']['duplicates']}",
            f"- `true` through the API at concurrency 1, daemon with events: p50 {o['exec_true_with_events']['p50']:.3f} ms; "
            f"without: p50 {o['exec_true_without_events']['p50']:.3f} ms; **overhead {o['overhead_p50_percent']:+.1f}% of p50** "
            f"({o['overhead_mean_percent']:+.1f}% of the mean; n={o['exec_true_with_events']['n']} each, rotating blocks)",
            f"- answering each call once its events are durable (events_confirm_timeout, the default): "
            f"p50 {o['exec_true_with_events_confirmed']['p50']:.3f} ms, **{o['confirmed_overhead_p50_percent']:+.1f}% of p50**",
        ]
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--execs", type=int, default=2000, help="0: the end-to-end part only")
    parser.add_argument("--databases", default="sqlite,postgresql", help="the aggregator's databases, in this order")
    parser.add_argument("--aggregators", default="1,2", help="PostgreSQL: aggregator processes sharing the consumer")
    parser.add_argument("--rounds", type=int, default=1, help="end to end: the sequence of setups this many times")


def main() -> None:
    bench_cli(
        __doc__,
        _arguments,
        lambda args: bench(
            args.events, args.execs, args.databases.split(","), [int(n) for n in args.aggregators.split(",")], args.rounds
        ),
        render,
    )


if __name__ == "__main__":
    main()
