"""A real node daemon on a real port, started in-process (uvicorn's run_server pattern)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from helpers import daemon_config, running_daemon
from rlsandbox.client import AsyncClient
from rlsandbox.daemon.server import NodeDaemon


@pytest.fixture(scope="module")
async def daemon(images: dict[str, str]) -> AsyncIterator[NodeDaemon]:
    async with running_daemon(daemon_config()) as node:
        yield node


@pytest.fixture
async def client(daemon: NodeDaemon) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(daemon.address, timeout=30) as c:
        yield c
