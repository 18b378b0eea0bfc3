"""The node-wide caps (runtime/cgroups.py) against real sandboxes: every sandbox is under one
parent cgroup whose PID and memory limits keep the host's share out of their reach, so fork bombs
in several sandboxes at once run out of PIDs there, never on the host, and sandboxes together
using more memory than the node has for them meet the kernel's OOM killer there, as the node's
doing (pool/oom.py). The caps are tiny here (300 PIDs, 300 MB) and the parent the test's own, so
the host's real PIDs and memory are never at stake."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import PYTHON, TEST_OWNER, daemon_config, eventually, running_daemon
from rlsandbox.client import AsyncClient, AsyncSession
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.process import NO_FILE_TABLE_LIMIT
from rlsandbox.daemon.runtime import cgroups
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

PARENT = f"rlsandbox-{TEST_OWNER}"
CAP = 300
MEMORY_MB = 300
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
    pools = [
        PoolConfig(name="bomb", image=PYTHON, min_ready=1, max_total=3, pids=256, memory_mb=256),
        PoolConfig(name="huge", image=PYTHON, min_ready=0, max_total=1, memory_mb=512),  # more than the node's cap
    ]
    config = daemon_config(pools=pools, cgroup_parent=PARENT, sandbox_pids_max=CAP, sandbox_memory_mb=MEMORY_MB)
    try:
        async with running_daemon(config) as daemon:
            yield daemon
    finally:
        cgroups.remove_parent(PARENT)


async def spawn(s: AsyncSession, n: int) -> int:
    run = await s.exec(["python3", "-c", SPAWN, str(n)], timeout=60)
    assert run.exit_code == 0, run.stderr_text
    return int(run.stdout)


async def test_fork_bombs_in_several_sandboxes_run_out_of_pids_under_the_nodes_cap(node: NodeDaemon) -> None:
    pids = cgroups.knob(PARENT, str((await node.runtime.info()).get("CgroupVersion") or "1"), "pids")
    assert cgroups.read(pids) == str(CAP)
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
        assert int((pids.parent / "pids.current").read_text()) <= CAP
        # Outside the parent nothing is short: the daemon answers, the host forks.
        health = health_pb2_grpc.HealthStub(client._channel)
        assert (await health.Check(health_pb2.HealthCheckRequest())).status == health_pb2.HealthCheckResponse.SERVING
        assert os.waitpid(os.spawnv(os.P_NOWAIT, "/bin/true", ["true"]), 0)[1] == 0
        # The host's open-file table: unlimited (the daemon raised it), so a sandbox's open files are
        # bounded by its memory alone and cannot fill it for the others.
        assert int(Path("/proc/sys/fs/file-max").read_text()) == NO_FILE_TABLE_LIMIT
        # The first episode's end gives its PIDs back to the others.
        await first.close()
        assert await spawn(second, 150) == 150
        await second.close()


HOLD = "import time\nb = b'\\x01' * 180_000_000\nprint('held', flush=True)\ntime.sleep(float(__import__('sys').argv[1]))"


async def test_sandboxes_together_past_the_nodes_memory_meet_the_oom_killer_as_the_nodes_doing(node: NodeDaemon) -> None:
    """Two sandboxes of 256 MB each hold 180 MB: within their own limits, past the 300 MB the node
    has for all of them. The kernel's OOM killer takes a process of one of them, in the parent's
    cgroup (the host's memory untouched), and the daemon counts that kill as the node's: a death
    of it would be masked, a clean room's test run so hit an infra error."""
    version = str((await node.runtime.info()).get("CgroupVersion") or "1")
    memory = cgroups.knob(PARENT, version, "memory")
    assert cgroups.read(memory) in (str(MEMORY_MB << 20), str((MEMORY_MB << 20) // 4096 * 4096))
    kills = node.factory.oom.host_kills_total
    async with AsyncClient(node.address, timeout=60) as client:
        first = await client.create_session("bomb", acquire_timeout=60)
        second = await client.create_session("bomb", acquire_timeout=60)
        holding = asyncio.create_task(first.exec(["python3", "-c", HOLD, "30"], timeout=60))
        await asyncio.sleep(2.0)
        run = await second.exec(["python3", "-c", HOLD, "0"], timeout=60)
        ours = {node.sessions.get(s.id).sandbox.container_id for s in (first, second)}  # type: ignore[union-attr]
        await eventually(lambda: _true(node.factory.oom.host_kills_total > kills), 10, "the kill counted as the node's")
        assert any(node.factory.oom.host_killed(cid) for cid in ours)
        victims = [r for r in (run, await holding) if r.signal == 9]
        assert len(victims) == 1, (run, holding.result())  # one process killed, in the sandboxes' cgroup
        for s in (first, second):  # the sandboxes live on (the agents were not the largest)
            assert (await s.exec("echo alive")).stdout == b"alive\n"
        await first.close()
        await second.close()
    if version == "1":
        assert int((memory.parent / "memory.max_usage_in_bytes").read_text()) <= MEMORY_MB << 20


async def _true(value: bool) -> bool:
    return value


async def test_a_sandbox_allowed_more_than_the_nodes_cap_still_meets_its_own_limit_first(node: NodeDaemon) -> None:
    """A policy's way around a 0: in a pool whose memory_mb passes the node's cap on all sandboxes
    (here 512 MB against 300), fill its memory and be OOM-killed at the node's cap, which is the
    node's doing and masked. A sandbox gets at most 90% of the cap, so it meets its own limit
    first, and that kill is the episode's."""
    kills = node.factory.oom.host_kills_total
    async with AsyncClient(node.address, timeout=60) as client, client.session("huge", acquire_timeout=60) as s:
        cid = node.sessions.get(s.id).sandbox.container_id  # type: ignore[union-attr]
        limit = (await node.runtime.inspect(cid))["HostConfig"]["Memory"]
        assert limit == int((MEMORY_MB << 20) * 0.9), limit
        run = await s.exec(["python3", "-c", HOLD.replace("180_000_000", "400_000_000"), "0"], timeout=60)
        assert run.signal == 9, run
        await eventually(lambda: _true(bool(node.factory.oom.kills.get(cid))), 10, "the kernel's line was read")
        assert node.factory.oom.kills[cid][-1][1] is False  # at its own limit: the episode's doing
        assert node.factory.oom.host_kills_total == kills
