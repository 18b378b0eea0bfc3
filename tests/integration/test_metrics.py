"""Prometheus metrics of a real daemon, scraped over HTTP and parsed with prometheus_client's own
parser: calls by method and code, exec latency by pool, session creation, pool gauges."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import pytest
from helpers import BUSYBOX, daemon_config, running_daemon
from prometheus_client.parser import text_string_to_metric_families
from rlsandbox.client import AsyncClient, NotFoundError
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
async def node(images: dict[str, str]) -> AsyncIterator[NodeDaemon]:
    pools = [PoolConfig(name="busybox", image=BUSYBOX, min_ready=2, max_total=8, memory_mb=64)]
    async with running_daemon(daemon_config(pools=pools, metrics_listen="127.0.0.1:0")) as daemon:
        yield daemon


async def scrape(node: NodeDaemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10) as r:
            return r.read().decode()

    text = await asyncio.to_thread(get)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_calls_execs_and_pools_are_measured(node: NodeDaemon) -> None:
    async with AsyncClient(node.address, timeout=60) as client:
        async with client.session("busybox") as s:
            for _ in range(3):
                assert (await s.exec("true")).exit_code == 0
        with pytest.raises(NotFoundError):
            await client.exec("no-such-session", "true")
    m = await scrape(node)
    ok = m[("rlsandbox_grpc_server_handling_seconds_count", (("code", "OK"), ("method", "Exec")))]
    missing = m[("rlsandbox_grpc_server_handling_seconds_count", (("code", "NOT_FOUND"), ("method", "Exec")))]
    assert ok >= 3 and missing >= 1
    assert m[("rlsandbox_exec_seconds_count", (("pool", "busybox"),))] >= 3
    assert m[("rlsandbox_session_create_seconds_count", (("pool", "busybox"), ("source", "pool")))] >= 1
    assert m[("rlsandbox_pool_max_total", (("image", BUSYBOX), ("pool", "busybox")))] == 8
    assert m[("rlsandbox_pool_acquired_total", (("image", BUSYBOX), ("pool", "busybox")))] >= 1
    assert ("rlsandbox_sessions", ()) in m and ("rlsandbox_event_loop_lag_seconds", ()) in m
    assert ("rlsandbox_prefetch_handed_out_total", ()) in m


async def test_status_watch_shows_the_node_live(node: NodeDaemon) -> None:
    import sys

    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlsandbox.daemon.cli", "status", "--target", node.address, "--watch", "0.2", "--count", "2",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    frames = out.decode().strip().split("\n\n")
    assert len(frames) == 2 and all(f.startswith(f"node {node.config.node_id}") for f in frames)
    assert "/s)" in frames[1] and "busybox" in frames[1]


async def test_healthz_answers_probes_without_a_token(node: NodeDaemon) -> None:
    """Kubelet's HTTP probe: 200 while the node serves, 503 when it cannot make sandboxes (Docker
    unreachable, simulated: stopping dockerd would take the other tests' engine too)."""

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/healthz", timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    assert await asyncio.to_thread(get) == (200, "serving\n")
    node.docker_ok = False
    try:
        assert await asyncio.to_thread(get) == (503, "not serving\n")
    finally:
        node.docker_ok = True
