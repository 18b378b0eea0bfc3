"""The node-wide PID cap (runtime/cgroups.py) against real sandboxes: every sandbox is under one
parent cgroup whose pids.max keeps the host's share out of their reach, so fork bombs in several
sandboxes at once run out of PIDs there, never on the host. The cap is tiny here (300) and the
parent the test's own, so the host's real PIDs are never at stake."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import PYTHON, TEST_OWNER, daemon_config, running_daemon
from rlsandbox.client import AsyncClient, AsyncSession
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.runtime import cgroups
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

PARENT = f"rlsandbox-{TEST_OWNER}"
CAP = 300
# Start sleepers, each in its own session (they outlive the command), until a fork fails; say how many.
SPAWN = r"""
import subprocess, sys
started = 0
for _ in range(int(sys.argv[1])):
    try:
        subprocess.Popen(["sleep", "300"], start_new_session=True)
    except OSError:
        break
    started += 1
print(started)
"""


@pytest.fixture(scope="module")
async def node(images: dict[str, str]) -> AsyncIterator[NodeDaemon]:
    pools = [PoolConfig(name="bomb", image=PYTHON, min_ready=1, max_total=3, pids=256, memory_mb=256)]
    try:
        async with running_daemon(daemon_config(pools=pools, cgroup_parent=PARENT, sandbox_pids_max=CAP)) as daemon:
            yield daemon
    finally:
        cgroups.remove_parent(PARENT)


async def spawn(s: AsyncSession, n: int) -> int:
    run = await s.exec(["python3", "-c", SPAWN, str(n)], timeout=60)
    assert run.exit_code == 0, run.stderr_text
    return int(run.stdout)


async def test_fork_bombs_in_several_sandboxes_run_out_of_pids_under_the_nodes_cap(node: NodeDaemon) -> None:
    folder = cgroups.pids_folder(PARENT, str((await node.runtime.info()).get("CgroupVersion") or "1"))
    assert cgroups.read_cap(folder) == str(CAP)
    async with AsyncClient(node.address, timeout=60) as client:
        first = await client.create_session("bomb", acquire_timeout=60)
        second = await client.create_session("bomb", acquire_timeout=60)
        for s in (first, second):
            cgroup = (await s.exec("cat /proc/1/cgroup")).stdout_text
            assert f"/{PARENT}/" in cgroup, cgroup  # the sandbox is under the node's parent
        # Each sandbox alone may hold 256 tasks; together they may not pass the node's 300.
        assert await spawn(first, 230) == 230
        starved = await spawn(second, 230)
        assert starved < 100, starved
        assert int((folder / "pids.current").read_text()) <= CAP
        # Outside the parent nothing is short: the daemon answers, the host forks.
        health = health_pb2_grpc.HealthStub(client._channel)
        assert (await health.Check(health_pb2.HealthCheckRequest())).status == health_pb2.HealthCheckResponse.SERVING
        assert os.waitpid(os.spawnv(os.P_NOWAIT, "/bin/true", ["true"]), 0)[1] == 0
        # The first episode's end gives its PIDs back to the others.
        await first.close()
        assert await spawn(second, 150) == 150
        await second.close()
