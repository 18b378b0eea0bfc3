"""The dashboard on a big run: every view of a store holding one run of N episodes (default
100,000), over real HTTP, and the page loaded in headless Chromium when it is installed.

    python -m rlsandbox.loadtest.dashboard_bench [--episodes 100000] [--samples 20] [--json out.json]

Each episode is what a daemon sends for a graded session (created, 5 steps in one batch, reward,
closed: 8 events), spread over 24 hours of event time across 3 nodes and 200 tasks, written
through the aggregator's own store. Every view is computed for each sample (the store's version is
bumped, as new events would); the last row is the overview served again within the same second,
what every other open dashboard gets. The baseline is the smallest view (one session's timeline).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from rlsandbox.loadtest.stats import bench_cli, latency_table, machine, summary_ms

RUN = "big-run"
DAY = 24 * 3600.0


def fill(store: Any, episodes: int, start: float) -> float:
    """Write the run; returns seconds taken."""
    from rlsandbox.daemon.events.model import CLOSED, CREATED, REWARD, STEP, Event, batch_payload

    began = time.perf_counter()
    batch: list[bytes] = []
    for i in range(episodes):
        at = start + DAY * i / episodes
        session = f"n{i % 3}-{i:08x}"
        labels = {"run": RUN, "task": f"task-{i % 200}"}
        node = f"n{i % 3}"
        steps = [
            Event(
                STEP,
                node,
                session,
                2 + k,
                {"argv": ["pytest", "-q"], "exit_code": k % 2, "duration": 0.002 * (k + 1)},
                labels,
                ts=at + k,
            )
            for k in range(5)
        ]
        reward = 1.0 if (i * 7919) % 100 < 30 + 40 * i // episodes else 0.0  # learning: 30% -> 70%
        grade = {"status": "ok", "reward": reward, "resolved": reward == 1.0, "tampering": []}
        batch += [
            Event(CREATED, node, session, 1, {"pool": "python"}, labels, ts=at).to_json(),
            batch_payload(node, steps),
            Event(REWARD, node, session, 7, grade, labels, ts=at + 6).to_json(),
            Event(CLOSED, node, session, 8, {"reason": "closed by client"}, labels, ts=at + 7).to_json(),
        ]
        if len(batch) >= 4000:
            store.apply(batch)
            batch = []
    if batch:
        store.apply(batch)
    return time.perf_counter() - began


async def bench(episodes: int, samples: int) -> dict[str, Any]:
    from aiohttp import web
    from rlsandbox.daemon.events.aggregator import Aggregator
    from rlsandbox.daemon.events.web import app

    folder = Path(tempfile.mkdtemp(prefix="rlsandbox-dashboard-bench-"))
    try:
        agg = Aggregator("nats://127.0.0.1:1", folder / "store.sqlite3")  # never connects: the store and the web side only
        now = time.time()
        ingest = await asyncio.to_thread(fill, agg.store, episodes, now - DAY)
        runner = web.AppRunner(app(agg), access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        base = f"http://127.0.0.1:{port}"
        page = await asyncio.to_thread(lambda: agg.store.run_sessions(RUN, limit=50))
        deep = await asyncio.to_thread(lambda: agg.store.run_sessions(RUN, before=now - DAY / 2, limit=50))
        views = {
            "one session's timeline (baseline)": f"/v1/sessions/{page[0]['session']}",
            "overview (nodes, rates, latency, alerts, runs)": "/v1/overview",
            "activity, last 30 min": "/v1/activity?minutes=30",
            "activity, last 24 h": "/v1/activity?minutes=1440",
            "reward curve of the run (200 points)": f"/v1/runs/{RUN}/curve",
            "tasks of the run": f"/v1/tasks?run={RUN}",
            "newest 50 episodes": f"/v1/runs/{RUN}/sessions?limit=50",
            "50 episodes half a day back": f"/v1/runs/{RUN}/sessions?limit=50&before={deep[0]['created_ts'] + 1e-3}",
            "Prometheus /metrics": "/metrics",
        }
        results: dict[str, Any] = {}
        for name, path in views.items():
            times, size = [], 0
            for _ in range(samples):
                agg.version += 1  # as if new events came: the view is computed, not served from the cache
                t = time.perf_counter()
                size = len(await asyncio.to_thread(_get, base + path))
                times.append(time.perf_counter() - t)
            results[name] = {**summary_ms(times), "bytes": size}
        times = []
        for _ in range(samples):  # the same second and store version: every other open dashboard
            t = time.perf_counter()
            size = len(await asyncio.to_thread(_get, base + "/v1/overview"))
            times.append(time.perf_counter() - t)
        results["overview, again within the second (cached)"] = {**summary_ms(times), "bytes": size}
        browser = await asyncio.to_thread(_page_load, base, samples=min(samples, 5))
        await runner.cleanup()
        agg.store.close()
        db_bytes = await asyncio.to_thread(_folder_bytes, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    baseline = results["one session's timeline (baseline)"]["p50"]
    return {
        "episodes": episodes,
        "events": episodes * 8,
        "ingest_seconds": ingest,
        "ingest_events_per_second": episodes * 8 / ingest,
        "store_bytes": db_bytes,
        "views": results,
        "ratio_to_baseline": {name: r["p50"] / baseline for name, r in results.items()},
        "browser": browser,
        "machine": machine(),
        "at": time.time(),
    }


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as r:
        body: bytes = r.read()
    return body


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


def _page_load(base: str, samples: int) -> dict[str, Any] | None:
    """Open the dashboard on the run in headless Chromium: until its 50 newest episodes show."""
    chromium = shutil.which("chromium")
    if chromium is None:
        return None
    from playwright.sync_api import sync_playwright

    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        try:
            for _ in range(samples):
                page = browser.new_page()
                t = time.perf_counter()
                page.goto(f"{base}/#run={RUN}")
                page.wait_for_function("document.querySelectorAll('#sessions tbody tr').length === 50", timeout=120_000)
                times.append(time.perf_counter() - t)
                page.close()
        finally:
            browser.close()
    return summary_ms(times)


def render(r: dict[str, Any]) -> str:
    rows = [(f"{name} ({v['bytes'] / 1024:.1f} KiB)", v) for name, v in r["views"].items()]
    if r["browser"]:
        rows.append(("Chromium: the page, until the run's 50 newest episodes show", r["browser"]))
    lines = [
        f"{r['episodes']:,} episodes ({r['events']:,} events) written in {r['ingest_seconds']:.1f} s "
        f"({r['ingest_events_per_second']:,.0f} events/s through Store.apply); store {r['store_bytes'] / 2**20:.0f} MiB",
        "",
        *latency_table(rows),
        "",
        "p50 against the baseline (one session's timeline): "
        + ", ".join(
            f"{name.split(' (')[0]} x{ratio:.1f}" for name, ratio in r["ratio_to_baseline"].items() if "baseline" not in name
        ),
    ]
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--episodes", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=20)


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.episodes, args.samples), render)


if __name__ == "__main__":
    main()
