"""The aggregator's HTTP side: the JSON query API, the live dashboard, Prometheus metrics.

- JSON (``/v1/...``): runs, tasks, nodes, alerts, integrity, a session's timeline, a run's
  trajectories (JSONL); for the dashboard, an overview (nodes, rates, step latency, alerts, runs),
  activity series, a run's reward curve and a page of its sessions. Every view is an SQL aggregate
  or a page: a run of 100k episodes is never loaded whole.
- ``/v1/stream``: server-sent events; ``change`` when the store took new events (at most once a
  second), so open dashboards refresh what they show, and a comment every 15 s to keep proxies open.
- ``/``: the dashboard (static files in ``dashboard/``: plain JavaScript, no build step, and uPlot
  for the charts, vendored with its licence).
- ``/metrics``: Prometheus text: per run the gradings by status, reward sum, rewarded and tampered
  gradings (counters: rewards only ever add rows, so every aggregator sharing the store reports
  the same), alerts by kind, live nodes, and this process's consumption counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from rlsandbox.daemon.events.aggregator import Aggregator

log = logging.getLogger(__name__)
STATIC = Path(__file__).resolve().parent / "dashboard"
NODE_STALE = 30.0  # seconds without a heartbeat after which a node shows as stale
SSE_CHECK = 1.0
SSE_KEEPALIVE = 15.0


def _json(value: Any) -> web.Response:
    return web.Response(body=orjson.dumps(value), content_type="application/json")


def _number(req: web.Request, name: str, default: float, lo: float, hi: float) -> float:
    raw = req.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"?{name}= must be a number, not {raw[:40]!r}") from None
    return min(max(value, lo), hi)


class _Memo:
    """The dashboard's views, computed at most once per second and store version whatever the
    number of open dashboards (each refreshes on every change); a bounded number of entries."""

    def __init__(self, agg: Aggregator, entries: int = 256) -> None:
        self.agg = agg
        self.entries = entries
        self._cache: dict[str, tuple[tuple[int, int], bytes]] = {}

    async def json(self, key: str, compute: Any, *args: Any, **kwargs: Any) -> web.Response:
        stamp = (self.agg.version, int(time.time()))
        hit = self._cache.get(key)
        if hit is None or hit[0] != stamp:
            body = orjson.dumps(await asyncio.to_thread(compute, *args, **kwargs))
            self._cache.pop(key, None)
            self._cache[key] = hit = (stamp, body)
            while len(self._cache) > self.entries:
                self._cache.pop(next(iter(self._cache)))
        return web.Response(body=hit[1], content_type="application/json")


class _StoreCollector(Collector):
    def __init__(self, agg: Aggregator) -> None:
        self.agg = agg

    def collect(self) -> Iterator[Metric]:
        agg = self.agg
        try:  # the store's numbers; while its database does not answer, this process's own still
            families = list(self._from_store())
            up = 1
        except Exception as e:  # reported as rlsandbox_aggregator_store_up 0, not as a failed scrape
            log.warning("metrics: the store did not answer: %s: %s", type(e).__name__, e)
            families, up = [], 0
        yield from families
        yield GaugeMetricFamily("rlsandbox_aggregator_store_up", "1 when the store's database answered this scrape", value=up)
        yield CounterMetricFamily(
            "rlsandbox_aggregator_store_errors", "Batches the database did not take (tried again)", value=agg.store_errors_total
        )
        yield CounterMetricFamily(
            "rlsandbox_aggregator_write_retries", "Write transactions tried again after a deadlock", value=agg.store.retries
        )
        yield CounterMetricFamily(
            "rlsandbox_aggregator_events_applied", "New events this process stored", value=agg.applied_total
        )
        yield CounterMetricFamily(
            "rlsandbox_aggregator_events_duplicate", "Events this process got again (redelivery)", value=agg.duplicates_total
        )
        yield CounterMetricFamily(
            "rlsandbox_aggregator_events_invalid", "Messages this process skipped as not v1 events", value=agg.invalid_total
        )
        yield CounterMetricFamily(
            "rlsandbox_aggregator_anomalies", "Reward anomalies this process published", value=agg.anomalies_total
        )

    def _from_store(self) -> Iterator[Metric]:
        store = self.agg.store
        gradings = CounterMetricFamily("rlsandbox_run_gradings", "Gradings of a run by status", labels=["run", "status"])
        reward = CounterMetricFamily("rlsandbox_run_reward", "Sum of the rewards of a run's gradings", labels=["run"])
        rewarded = CounterMetricFamily("rlsandbox_run_rewarded", "Gradings of a run with a reward", labels=["run"])
        tampered = CounterMetricFamily("rlsandbox_run_tampered", "Gradings of a run with tampering found", labels=["run"])
        per_run: dict[str, list[float]] = {}
        for run, status, n, total, with_reward, with_tampering in store.run_totals():
            gradings.add_metric([run, status], n)
            sums = per_run.setdefault(run, [0.0, 0.0, 0.0])
            sums[0] += float(total)
            sums[1] += float(with_reward or 0)
            sums[2] += float(with_tampering or 0)
        for run, sums in per_run.items():
            reward.add_metric([run], sums[0])
            rewarded.add_metric([run], sums[1])
            tampered.add_metric([run], sums[2])
        alerts = CounterMetricFamily("rlsandbox_aggregator_alerts", "Alerts stored, by kind", labels=["kind"])
        for kind, n in store.alert_counts().items():
            alerts.add_metric([kind], n)
        now = time.time()
        nodes = GaugeMetricFamily("rlsandbox_aggregator_nodes", "Nodes known by their heartbeats", labels=["state"])
        beats = [n["last_heartbeat"] for n in store.nodes()]
        nodes.add_metric(["live"], sum(1 for t in beats if now - t <= NODE_STALE))
        nodes.add_metric(["stale"], sum(1 for t in beats if now - t > NODE_STALE))
        yield from (gradings, reward, rewarded, tampered, alerts, nodes)


def app(agg: Aggregator, middlewares: list[Any] | None = None) -> web.Application:
    store = agg.store
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StoreCollector(agg))
    memo = _Memo(agg)

    async def off_loop(fn: Any, *args: Any) -> web.Response:
        return _json(await asyncio.to_thread(fn, *args))

    async def runs(_: web.Request) -> web.Response:
        return await off_loop(store.runs)

    async def tasks(req: web.Request) -> web.Response:
        return await memo.json(req.path_qs, store.tasks, req.query.get("run"))

    async def nodes(_: web.Request) -> web.Response:
        return await off_loop(store.nodes)

    async def alerts(req: web.Request) -> web.Response:
        return await off_loop(store.alerts, int(_number(req, "limit", 100, 1, 1000)))

    async def integrity(_: web.Request) -> web.Response:
        return await off_loop(store.integrity)

    async def session(req: web.Request) -> web.Response:
        timeline = await asyncio.to_thread(store.timeline, req.match_info["session"])
        if not timeline:
            raise web.HTTPNotFound(text=f"no events of session {req.match_info['session']}")
        return _json(timeline)

    async def trajectories(req: web.Request) -> web.Response:
        run = req.query.get("run")
        if not run:
            raise web.HTTPBadRequest(text="trajectories need ?run=<run label>")
        lines = await asyncio.to_thread(lambda: b"".join(orjson.dumps(t) + b"\n" for t in store.trajectories(run)))
        return web.Response(body=lines, content_type="application/x-ndjson")

    def overview_now() -> dict[str, Any]:
        now = time.time()
        node_rows = store.nodes()
        for n in node_rows:
            n["live"] = now - n["last_heartbeat"] <= NODE_STALE
        return {
            "now": now,
            "nodes": node_rows,
            "rates": store.rates(now),
            "latency": store.latency(now - 300),
            "alerts": store.alerts(20),
            "runs": store.runs(),
            "integrity": store.integrity(),
        }

    async def overview(req: web.Request) -> web.Response:
        return await memo.json(req.path_qs, overview_now)

    async def activity(req: web.Request) -> web.Response:
        minutes = _number(req, "minutes", 30, 1, 24 * 60)
        step = int(_number(req, "step", max(1, minutes * 60 // 180), 1, 3600))
        since = int(time.time() - minutes * 60) // step * step
        return await memo.json(
            req.path_qs, lambda: {"since": since, "step": step, "until": time.time(), "points": store.activity(since, step)}
        )

    async def curve(req: web.Request) -> web.Response:
        points = int(_number(req, "points", 200, 2, 2000))
        return await memo.json(req.path_qs, store.curve, req.match_info["run"], points, req.query.get("task"))

    async def run_sessions(req: web.Request) -> web.Response:
        before = req.query.get("before")
        limit = int(_number(req, "limit", 50, 1, 500))
        start = _number(req, "before", 0, 0, 1e12) if before else None
        return await memo.json(req.path_qs, store.run_sessions, req.match_info["run"], before=start, limit=limit)

    async def stream(req: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(req)
        seen = -1
        quiet = 0.0
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while not agg.stopping:
                if agg.version != seen:
                    seen = agg.version
                    await resp.write(b"event: change\ndata: " + orjson.dumps({"version": seen, "ts": time.time()}) + b"\n\n")
                    quiet = 0.0
                elif quiet >= SSE_KEEPALIVE:
                    await resp.write(b": keepalive\n\n")
                    quiet = 0.0
                await asyncio.sleep(SSE_CHECK)
                quiet += SSE_CHECK
        return resp

    async def metrics(_: web.Request) -> web.Response:
        body = await asyncio.to_thread(generate_latest, registry)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def index(_: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / "index.html")

    application = web.Application(middlewares=middlewares or [])
    application.add_routes(
        [
            web.get("/", index),
            web.get("/metrics", metrics),
            web.get("/v1/runs", runs),
            web.get("/v1/runs/{run}/curve", curve),
            web.get("/v1/runs/{run}/sessions", run_sessions),
            web.get("/v1/tasks", tasks),
            web.get("/v1/nodes", nodes),
            web.get("/v1/alerts", alerts),
            web.get("/v1/integrity", integrity),
            web.get("/v1/sessions/{session}", session),
            web.get("/v1/trajectories", trajectories),
            web.get("/v1/overview", overview),
            web.get("/v1/activity", activity),
            web.get("/v1/stream", stream),
            web.static("/static", STATIC),
        ]
    )
    return application
