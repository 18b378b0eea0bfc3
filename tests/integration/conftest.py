"""A real node daemon on a real port, started in-process (uvicorn's run_server pattern)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from helpers import TEST_OWNER, daemon_config, running_daemon
from rlsandbox.client import AsyncClient
from rlsandbox.daemon.runtime.docker import LABEL_MANAGED, LABEL_OWNER, DockerRuntime
from rlsandbox.daemon.server import NodeDaemon


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
