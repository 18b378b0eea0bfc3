"""A real node daemon on a real port, started in-process (uvicorn's run_server pattern)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from helpers import TEST_OWNER, daemon_config, running_daemon
from rlsandbox.client import AsyncClient
from rlsandbox.daemon.events.aggregator import Aggregator
from rlsandbox.daemon.events.nats_server import NatsServer
from rlsandbox.daemon.runtime.docker import LABEL_MANAGED, LABEL_OWNER, DockerRuntime
from rlsandbox.daemon.server import NodeDaemon
from rlsandbox.loadtest.postgres import PostgresServer, postgres_server


@pytest.fixture(scope="module", autouse=True)
async def _no_container_left_by_the_module(docker_runtime: DockerRuntime) -> AsyncIterator[None]:
    """Every integration module leaves no container of this run behind: its daemons' pools,
    clean rooms and the daemons it SIGKILLed included (module fixtures are torn down first)."""

    async def ours() -> dict[str, str]:
        managed = await docker_runtime.list_containers({LABEL_MANAGED: "1"})
        return {c.id: c.name for c in managed if c.labels.get(LABEL_OWNER, "").startswith(TEST_OWNER)}

    before = await ours()
    yield
    left = [name for cid, name in (await ours()).items() if cid not in before]
    assert not left, f"containers left behind by this module: {left}"


@pytest.fixture(scope="module")
async def daemon(images: dict[str, str]) -> AsyncIterator[NodeDaemon]:
    async with running_daemon(daemon_config()) as node:
        yield node


@pytest.fixture
async def client(daemon: NodeDaemon) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(daemon.address, timeout=30) as c:
        yield c


@pytest.fixture
async def nats_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    server = NatsServer(tmp_path / "jetstream")
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def aggregator(nats_server: NatsServer, tmp_path: Path) -> AsyncIterator[Aggregator]:
    agg = Aggregator(nats_server.url, tmp_path / "agg.sqlite3", http="127.0.0.1:0")
    task = asyncio.create_task(agg.run())
    await asyncio.wait_for(agg.started.wait(), 30)
    try:
        yield agg
    finally:
        agg.stop()
        await asyncio.wait_for(task, 30)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A private PostgreSQL server (Debian's package) for the run; fsync off, it is thrown away."""
    with postgres_server(durable=False) as server:
        yield server


@pytest.fixture
def postgres_db(postgres: PostgresServer, request: pytest.FixtureRequest) -> str:
    """The URL of a new, empty database of its own for the test."""
    _databases[0] += 1
    name = re.sub(r"[^a-z0-9]+", "_", request.node.name.lower())[:40]
    return postgres.create_database(f"t{_databases[0]}_{name}")


_databases = [0]
