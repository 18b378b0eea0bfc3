"""The cost of metrics and tracing on the hot path: `true` through Exec with each off and on.

    python -m rlsandbox.loadtest.metrics_bench [--samples 2000] [--rounds 5] [--json out.json]

Three real daemon processes on the same machine: one with neither, one with ``metrics_listen``
set (scraped every second meanwhile, as Prometheus would, more often than usual), one with
``tracing_otlp_endpoint`` set (every call sampled, spans exported to an OTLP/gRPC receiver in
this process); the samples alternate between them in rounds, so that machine noise falls on all
alike. Reported: p50/p99 of each, the overhead on p50, on the mean and on throughput with 16 calls
in flight, and what tracing off adds to a call (measured in-process: a few ns are far under what a
latency comparison between processes can resolve).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
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


class _SpanSink:
    """A stand-in OTLP/gRPC collector in this process: counts the spans it is sent."""

    def __init__(self) -> None:
        self.spans = 0

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[str]:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        sink = self

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            async def Export(self, request: Any, context: Any) -> Any:
                sink.spans += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
                return trace_service_pb2.ExportTraceServiceResponse()

        server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            await server.stop(0)


def off_path_ns(calls: int = 200_000) -> dict[str, float]:
    """What tracing off adds to every call at the edge, in ns: the edge's context for a call with
    tracing off (one check) against the log context alone, which is all the edge had before."""
    from rlsandbox.daemon import tracing
    from rlsandbox.daemon.logs import log_context

    def call_context() -> contextlib.AbstractContextManager[None]:  # as in api/edge.py
        if not tracing.enabled():
            return log_context(request="r", trace="", session="s")
        raise AssertionError("tracing must be off here")

    def run(make: Callable[[], contextlib.AbstractContextManager[None]]) -> float:
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter_ns()
            for _ in range(calls):
                with make():
                    pass
            best = min(best, (time.perf_counter_ns() - t) / calls)
        return best

    plain = run(lambda: log_context(request="r", trace="", session="s"))
    checked = run(call_context)
    span = run(lambda: tracing.span("grade.tests"))  # a child span's cost, off
    return {"log_context_ns": plain, "with_tracing_check_ns": checked, "added_ns": checked - plain, "span_off_ns": span}


def metrics_path_ns(calls: int = 100_000) -> float:
    """What metrics add to an Exec, in ns: the call's histogram by method and code, and the
    command's by pool (as api/edge.py and session/manager.py observe them)."""
    from rlsandbox.daemon.metrics import Metrics

    metrics = Metrics()
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(calls):
            metrics.observe_rpc("Exec", "OK", 0.0017)
            metrics.exec_seconds.labels("python").observe(0.0012)
        best = min(best, (time.perf_counter_ns() - t) / calls)
    return best


async def bench(samples: int, rounds: int) -> dict[str, Any]:
    port = free_port()
    sink = _SpanSink()
    names = ("off", "metrics", "tracing")
    lat: dict[str, list[float]] = {n: [] for n in names}
    rates: dict[str, list[float]] = {n: [] for n in names}
    scrapes = 0
    async with contextlib.AsyncExitStack() as stack:
        endpoint = await stack.enter_async_context(sink.serving())
        extra = {
            "off": "",
            "metrics": f'metrics_listen = "127.0.0.1:{port}"',
            "tracing": f'tracing_otlp_endpoint = "{endpoint}"',
        }
        clients: dict[str, AsyncClient] = {}
        for n in names:
            config = CONFIG.format(node=f"obsbench-{n}-{os.getpid()}", metrics=extra[n])
            d = await stack.enter_async_context(daemon_process(config))
            clients[n] = await stack.enter_async_context(AsyncClient(d.address, timeout=60))
        for c in clients.values():
            await wait_ready(c, "python", 1, 300)
        sessions = {n: await c.create_session("python") for n, c in clients.items()}
        for s in sessions.values():
            await timed_sequential(100, _true(s))  # warm-up
        for c in clients.values():
            await wait_quiet(c)

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
                for n in names:
                    lat[n] += await timed_sequential(per, _true(sessions[n]))
                for n in names:
                    rates[n].append(await throughput(per, 16, _true(sessions[n])))
        finally:
            scraping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await scraping
        for s in sessions.values():
            await s.close()
    summary = {n: summary_ms(lat[n]) for n in names}
    rate = {n: sum(rates[n]) / len(rates[n]) for n in names}
    off = summary["off"]
    micro = off_path_ns()
    result: dict[str, Any] = {
        **summary,
        **{f"throughput_16_{n}": rate[n] for n in names},
        "scrapes": scrapes,
        "spans_exported": sink.spans,
        "tracing_off_path": micro,
        "tracing_off_percent_of_p50": micro["added_ns"] / (off["p50"] * 1e6) * 100,
        "metrics_path_ns": metrics_path_ns(),
        "machine": machine(),
        "at": time.time(),
    }
    for n in ("metrics", "tracing"):
        result[f"{n}_overhead_p50_percent"] = (summary[n]["p50"] / off["p50"] - 1) * 100
        result[f"{n}_overhead_mean_percent"] = (summary[n]["mean"] / off["mean"] - 1) * 100
        result[f"{n}_throughput_change_percent"] = (rate[n] / rate["off"] - 1) * 100
    return result


def render(r: dict[str, Any]) -> str:
    lines = latency_table(
        [
            ("`true` via Exec, metrics and tracing off", r["off"]),
            ("`true` via Exec, metrics on", r["metrics"]),
            ("`true` via Exec, tracing on (every call sampled)", r["tracing"]),
        ]
    )
    micro = r["tracing_off_path"]
    lines += [""]
    for n, what in (("metrics", f"{r['scrapes']} scrapes meanwhile"), ("tracing", f"{r['spans_exported']} spans exported")):
        lines.append(
            f"- overhead of {n}: p50 {r[f'{n}_overhead_p50_percent']:+.1f}%, mean {r[f'{n}_overhead_mean_percent']:+.1f}%, "
            f"throughput with 16 in flight {r[f'throughput_16_{n}']:.0f}/s vs {r['throughput_16_off']:.0f}/s "
            f"({r[f'{n}_throughput_change_percent']:+.1f}%; {what})"
        )
    lines.append(
        f"- metrics, per Exec in-process: {r['metrics_path_ns']:.0f} ns, "
        f"{r['metrics_path_ns'] / (r['off']['p50'] * 1e4):.3f}% of the p50"
    )
    lines.append(
        f"- tracing off, per call at the edge: {micro['with_tracing_check_ns']:.0f} ns vs {micro['log_context_ns']:.0f} ns "
        f"for the log context alone: {micro['added_ns']:+.0f} ns, {r['tracing_off_percent_of_p50']:.3f}% of the p50; "
        f"a child span off costs {micro['span_off_ns']:.0f} ns"
    )
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.samples, args.rounds), render)


if __name__ == "__main__":
    main()
