"""Prometheus metrics of the node (``metrics_listen``): names in base units, ``_total`` counters.

Two kinds: what happens on the hot path is observed as it happens (gRPC calls by method and code,
exec latency by pool, grading results, event-loop lag); what the node holds (pools, sessions,
events, image pools, prefetching) is read from its one NodeStatus at scrape time, so it costs
nothing between scrapes. A registry per daemon (not prometheus_client's global one).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
LAG_INTERVAL = 0.25  # seconds between event-loop lag probes


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.status: Callable[[], Any] | None = None  # the node's NodeStatus, once add_status gave it
        r = self.registry
        self.rpc_seconds = Histogram(
            "rlsandbox_grpc_server_handling_seconds", "gRPC calls by method and status code.", ["method", "code"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.exec_seconds = Histogram(
            "rlsandbox_exec_seconds", "Commands run in sessions, by pool (the command's own time included).", ["pool"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.create_seconds = Histogram(
            "rlsandbox_session_create_seconds", "CreateSession by pool and how the sandbox came: warm, waited, prefetched.",
            ["pool", "source"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.grades = Counter("rlsandbox_grades_total", "Gradings by status.", ["status", "mode"], registry=r)
        self.grade_seconds = Histogram(
            "rlsandbox_grade_seconds", "Grading time by mode.", ["mode"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.tampering = Counter("rlsandbox_grade_tampering_findings_total", "Tampering findings of gradings.", registry=r)
        self.sandbox_deaths = Counter(
            "rlsandbox_sandbox_deaths_total",
            "Sandboxes that died under a session, by pool and cause.",
            ["pool", "cause"],
            registry=r,
        )
        self.loop_lag = Gauge("rlsandbox_event_loop_lag_seconds", "How late the last event-loop probe woke up.", registry=r)
        self.loop_lag_max = Gauge(
            "rlsandbox_event_loop_lag_max_seconds", "Largest event-loop lag since the last scrape.", registry=r
        )
        self._lag_peak = 0.0

    def forget_pool(self, pool: str) -> None:
        """Drop a removed pool's series: image pools come and go by the thousand (one per
        instance image), and their labels must not pile up in every scrape."""
        for metric in (self.exec_seconds, self.create_seconds, self.sandbox_deaths):
            for labels in [k for k in metric._metrics if k[0] == pool]:
                metric.remove(*labels)

    def observe_rpc(self, method: str, code: str, seconds: float) -> None:
        self.rpc_seconds.labels(method, code).observe(seconds)

    def observe_grade(self, status: str, mode: str, seconds: float, findings: int) -> None:
        self.grades.labels(status, mode).inc()
        self.grade_seconds.labels(mode).observe(seconds)
        if findings:
            self.tampering.inc(findings)

    def add_status(self, status: Callable[[], Any], extra: Callable[[], dict[str, float]]) -> None:
        """Scrape-time figures from the node's NodeStatus and a few counters beside it."""
        self.status = status
        self.registry.register(_StatusCollector(status, extra))

    async def watch_loop(self) -> None:
        """Event-loop lag: how late a timer fires (a blocked loop delays every call in flight)."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(LAG_INTERVAL)
            lag = max(0.0, loop.time() - start - LAG_INTERVAL)
            self.loop_lag.set(lag)
            self._lag_peak = max(self._lag_peak, lag)
            self.loop_lag_max.set(self._lag_peak)

    def render(self) -> bytes:
        out = generate_latest(self.registry)
        self._lag_peak = 0.0
        return out


class _StatusCollector(Collector):
    def __init__(self, status: Callable[[], Any], extra: Callable[[], dict[str, float]]) -> None:
        self._status = status
        self._extra = extra

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        st = self._status()
        gauges = {
            "ready": "Sandboxes ready to hand out.",
            "in_use": "Sandboxes leased to sessions, clean rooms or prefetching.",
            "creating": "Sandboxes being created.",
            "waiting": "Callers waiting for a sandbox.",
            "destroying": "Released sandboxes being removed.",
            "recycling": "Released sandboxes being reset for the next episode.",
            "min_ready": "Sandboxes the pool keeps ready.",
            "max_total": "The pool's cap on sandboxes.",
        }
        for field, doc in gauges.items():
            g = GaugeMetricFamily(f"rlsandbox_pool_{field}", doc, labels=["pool", "image"])
            for p in st.pools:
                g.add_metric([p.stats.name, p.image], getattr(p.stats, field))
            yield g
        counters = {
            "created": "Sandboxes created.",
            "failed": "Sandbox creations that failed.",
            "destroyed": "Sandboxes removed.",
            "acquired": "Sandboxes handed out.",
            "acquired_waited": "Hand-outs that waited for a sandbox to be made (pool misses).",
            "recycled": "Hand-backs of reset, proven-clean sandboxes.",
            "recycle_failures": "Resets refused or failed (the sandbox was destroyed).",
        }
        for field, doc in counters.items():
            c = CounterMetricFamily(f"rlsandbox_pool_{field}", doc, labels=["pool", "image"])
            for p in st.pools:
                c.add_metric([p.stats.name, p.image], getattr(p.stats, f"{field}_total"))
            yield c
        yield GaugeMetricFamily("rlsandbox_sessions", "Live sessions.", value=st.sessions)
        yield GaugeMetricFamily("rlsandbox_sessions_max", "The node's admission limit.", value=st.max_sessions)
        yield GaugeMetricFamily("rlsandbox_docker_reachable", "1 when the Docker engine answers.", value=int(st.docker_reachable))
        yield CounterMetricFamily("rlsandbox_execs", "Commands run.", value=st.execs_total)
        yield CounterMetricFamily("rlsandbox_sessions_adopted", "Sessions re-adopted after a crash.", value=st.sessions_adopted)
        yield CounterMetricFamily(
            "rlsandbox_sessions_lost", "Journalled sessions that could not be re-adopted.", value=st.sessions_lost
        )
        if st.events is not None:
            e = st.events
            yield GaugeMetricFamily("rlsandbox_events_connected", "1 when connected to NATS.", value=int(e.connected))
            yield CounterMetricFamily("rlsandbox_events_published", "Events acknowledged by JetStream.", value=e.published_total)
            yield GaugeMetricFamily("rlsandbox_events_queued", "Events in memory, not yet published.", value=e.queued)
            yield GaugeMetricFamily("rlsandbox_events_outbox", "Events in the durable outbox.", value=e.outbox_events)
            yield GaugeMetricFamily("rlsandbox_events_outbox_bytes", "Bytes in the durable outbox.", value=e.outbox_bytes)
            yield CounterMetricFamily("rlsandbox_events_dropped", "Events dropped (outbox full).", value=e.dropped_total)
        for name, value in self._extra().items():
            kind = CounterMetricFamily if name.endswith("_total") else GaugeMetricFamily
            yield kind(f"rlsandbox_{name.removesuffix('_total')}", name.replace("_", " ") + ".", value=value)


async def serve(metrics: Metrics, host: str, port: int, tokens: list[bytes] | None = None) -> tuple[web.AppRunner, int]:
    """``GET /metrics`` on ``host:port`` (port 0: any free one); with ``tokens``, only for a
    request bearing one of them. ``GET /healthz``, open to all (probes send no token, and it
    tells nothing about sessions): 200 while the node serves (Docker reachable, not stopping),
    503 otherwise; the gRPC health service says the same. Returns the runner and the port."""
    import hmac

    async def handle(request: web.Request) -> web.Response:
        if tokens is not None:
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").encode()
            if not any(hmac.compare_digest(given, t) for t in tokens):
                return web.Response(status=401, text="a bearer token from auth_token_file is required\n")
        return web.Response(body=metrics.render(), content_type="text/plain", charset="utf-8")

    async def healthz(request: web.Request) -> web.Response:
        st = metrics.status() if metrics.status is not None else None
        serving = st is not None and bool(st.serving and st.docker_reachable)
        return web.Response(status=200 if serving else 503, text="serving\n" if serving else "not serving\n")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    sockets = site._server.sockets if site._server is not None else []  # type: ignore[attr-defined]
    bound = sockets[0].getsockname()[1] if sockets else port
    log.info("metrics on http://%s:%d/metrics", host, bound)
    return runner, int(bound)
