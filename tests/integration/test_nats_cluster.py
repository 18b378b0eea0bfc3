"""Events and the node table on a 3-server NATS cluster with JetStream (replicas 3): the daemon and
two aggregators writing one PostgreSQL database (the cluster's store) know all three servers; one
server is SIGKILLed while sessions run, and no event is lost or stored twice (a second delivery is
absorbed), the node table stays readable, the stream keeps its three copies."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import nats.js.errors
import pytest
from helpers import TEST_OWNER, assert_every_step_stored, events_config, eventually, run_steps, wait_run_stored
from rlsandbox.client import AsyncClient
from rlsandbox.daemon.cluster import BUCKET
from rlsandbox.daemon.events.aggregator import Aggregator
from rlsandbox.daemon.events.model import STREAM
from rlsandbox.daemon.events.nats_server import NatsServer, free_port
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker


@pytest.fixture
async def nats_cluster(tmp_path: Path) -> AsyncIterator[list[NatsServer]]:
    routes = [free_port() for _ in range(3)]
    servers = []
    for i in range(3):
        others = ",".join(f"nats://127.0.0.1:{p}" for j, p in enumerate(routes) if j != i)
        flags = ["--server_name", f"rls-n{i}", "--cluster_name", "rlsandbox-test"]
        flags += ["--cluster", f"nats://127.0.0.1:{routes[i]}", "--routes", others]
        servers.append(NatsServer(tmp_path / f"js{i}", extra_args=flags))
    try:
        await asyncio.gather(*(s.start() for s in servers))
        nc = await nats.connect([s.url for s in servers])
        try:
            # JetStream answers once the cluster has elected its meta leader.
            deadline = time.monotonic() + 60
            while True:
                try:
                    await nc.jetstream(timeout=2).account_info()
                    break
                except (nats.errors.Error, nats.js.errors.Error):
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.5)
        finally:
            await nc.close()
        yield servers
    finally:
        await asyncio.gather(*(s.stop() for s in servers))


async def test_a_server_killed_under_load_loses_no_event(
    nats_cluster: list[NatsServer], tmp_path: Path, images: object, postgres_db: str
) -> None:
    url = ",".join(s.url for s in nats_cluster)  # the daemon's nats_url names all three
    node = NodeDaemon(events_config(tmp_path, url, node_id=f"{TEST_OWNER}-natsc", nats_replicas=3))
    aggregators = [Aggregator(url, postgres_db, batch=100) for _ in range(2)]
    aggregator = aggregators[0]
    consuming = [asyncio.create_task(a.run()) for a in aggregators]
    await asyncio.gather(*(asyncio.wait_for(a.started.wait(), 30) for a in aggregators))
    await node.start()
    counter = [0]
    try:
        async with AsyncClient(node.address) as client:
            sessions = [await client.create_session("busybox", labels={"run": "nats-cluster"}) for _ in range(6)]
            start = time.monotonic()
            load = asyncio.gather(*(run_steps(s, start + 10, counter) for s in sessions))
            await asyncio.sleep(3)
            # Kill the server the daemon's publisher is connected to, mid-load.
            assert node.events is not None and node.events._nc is not None
            connected = node.events._nc.connected_url.port
            victim = next(s for s in nats_cluster if s.port == connected)
            await victim.kill()
            killed_at = counter[0]
            assert node.membership is not None
            table_writes = node.membership.published_total
            await load
            for s in sessions:
                await s.close()
            ids = {s.id for s in sessions}
            await wait_run_stored(aggregator.store, "nats-cluster", len(ids))
            status = await client.node_status()

            # The node table (a KV bucket with 3 replicas) is written and read again.
            async def table_written() -> bool:
                return node.membership is not None and node.membership.published_total > table_writes + 1

            await eventually(table_written, timeout=30, what="the node's record written after the kill")
            table = await node.cluster_nodes()
            assert [r["node"] for r in table] == [node.config.node_id]
        survivors = [s.url for s in nats_cluster if s is not victim]
        nc = await nats.connect(survivors)
        try:
            js = nc.jetstream(timeout=10)
            events_stream = (await js.stream_info(STREAM)).config
            assert events_stream.num_replicas == 3
            assert events_stream.max_age == 7 * 24 * 3600  # bounded: not every event ever emitted
            assert (await js.stream_info(f"KV_{BUCKET}")).config.num_replicas == 3
        finally:
            await nc.close()
        assert counter[0] > killed_at > 0, "sessions kept being served after the kill"
        assert_every_step_stored(aggregator.store, ids, counter[0])
        # Delivery is at least once: a batch whose acknowledgement died with the server may come
        # twice; the store keeps one row per event (the sequences above) and counts the other.
        assert status.events.dropped_total == 0
        assert all(a.applied_total > 0 for a in aggregators), [a.applied_total for a in aggregators]
    finally:
        await node.stop()
        for a in aggregators:
            a.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*consuming), 30)
