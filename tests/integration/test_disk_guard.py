"""The node's disk guard (pool/disk.py) against real sandboxes: once the engine's disk runs low
(here: a floor above any real free space, so it is always low), a sandbox past its pool's
disk_mb is ended as its episode's doing, graded reward 0 and never masked; a clean room the
episode's code fills likewise; a sandbox within its budget is left alone, unless the disk is
critically low: then the largest holders go, within their budgets too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import PYTHON, daemon_config, eventually, running_daemon
from rlsandbox.client import AsyncClient, NotFoundError, SandboxAbortedError
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.grading.task import Task, load_tasks
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

TEXTKIT = Path(__file__).resolve().parent.parent / "fixtures" / "tasks" / "py-textkit" / "task.yaml"


@pytest.fixture(scope="module")
async def node(images: dict[str, str]) -> AsyncIterator[NodeDaemon]:
    pools = [PoolConfig(name="disk", image=PYTHON, min_ready=1, max_total=4, disk_mb=64)]
    config = daemon_config(pools=pools, disk_floor_mb=1 << 40, disk_critical_mb=0, disk_check_interval=0.5)
    async with running_daemon(config) as daemon:
        yield daemon


@pytest.fixture(scope="module")
def task() -> Task:
    textkit = load_tasks(TEXTKIT)[0]
    return Task(textkit.spec.model_copy(update={"pool": "disk"}), textkit.workspace_tar)


async def test_a_sandbox_past_its_disk_budget_is_ended_as_its_episodes_doing(node: NodeDaemon, task: Task) -> None:
    async with AsyncClient(node.address, timeout=60) as client:
        s = await client.create_session(task=task)
        within = await client.create_session("disk")
        assert (await within.exec("head -c 10000000 /dev/zero > /root/small")).exit_code == 0
        started = time.monotonic()
        with pytest.raises((SandboxAbortedError, NotFoundError)) as ended:
            # On a slow machine the guard's next look (every 2 s) may end the sandbox mid-write.
            await s.exec("head -c 150000000 /dev/zero > /root/fill")
            while time.monotonic() - started < 30:
                await s.exec("sleep 0.2")
        assert "past its pool's disk_mb of 64 MB" in ended.value.fault, ended.value
        grade = await s.grade()
        assert grade.status == "ok" and grade.reward == 0.0 and grade.limits == [ended.value.fault], grade
        await asyncio.sleep(1.5)  # the guard looked again: the sandbox within its budget lives on
        assert (await within.exec("echo alive")).stdout == b"alive\n"
        await eventually(lambda: _true(node.disk_guard.killed_total == 1), 10, "the guard counted its kill")
        await within.close()


async def test_a_clean_room_the_episodes_code_fills_grades_0_not_infra_error(node: NodeDaemon, task: Task) -> None:
    """The agent's code writes 150 MB when the tests import it: in the clean room, not in its own
    sandbox. The guard ends the room; the grade is the episode's mess, reward 0."""
    async with AsyncClient(node.address, timeout=120) as client, client.session(task=task) as s:
        core = (await s.read_files(["src/textkit/core.py"]))["src/textkit/core.py"].data.decode()
        bomb = "import os, time\nif os.environ.get('HOME') != '/nowhere':\n"
        bomb += "    open('/root/fill', 'wb').write(b'0' * 150_000_000)\n    time.sleep(20)\n"
        await s.write_files({"src/textkit/core.py": bomb + core})
        before = node.disk_guard.killed_total
        grade = await s.grade()
        assert grade.status == "ok" and grade.reward == 0.0, (grade.status, grade.message)
        assert len(grade.limits) == 1 and "the clean room died of the episode's code" in grade.limits[0], grade.limits
        assert "past its pool's disk_mb of 64 MB" in grade.limits[0]
        await eventually(lambda: _true(node.disk_guard.killed_total == before + 1), 10, "the guard counted its kill")


async def _true(value: bool) -> bool:
    return value


async def test_empty_files_count_against_the_disk_budget(node: NodeDaemon) -> None:
    """Files without a byte use up the host's inodes (500,000 empty files in 10 s here; the
    engine's layer size says 0 for them): each file and folder counts 4 KiB of disk_mb, so 30,000
    of them are past 64 MB and the sandbox is ended as its episode's doing."""
    async with AsyncClient(node.address, timeout=120) as client:
        s = await client.create_session("disk")
        make = "import os\nos.makedirs('/root/m', exist_ok=True)\nfor i in range(30000): open('/root/m/%d' % i, 'w').close()"
        with pytest.raises((SandboxAbortedError, NotFoundError)) as ended:
            assert (await s.exec(["python3", "-c", make], timeout=60)).exit_code == 0
            started = time.monotonic()
            while time.monotonic() - started < 30:
                await s.exec("sleep 0.2")
        assert "files and folders" in ended.value.fault and "past its pool's disk_mb of 64 MB" in ended.value.fault, ended.value


async def test_on_a_critically_low_disk_the_largest_holders_go_even_within_their_budgets(images: dict[str, str]) -> None:
    """Budgets alone do not keep the disk: sandboxes each within its disk_mb can fill it together.
    Critically low (here: always, and by more than any sandbox holds), the guard ends every
    sandbox in use holding at least 1 MB, the largest first, as its episode's doing (reward 0:
    writing a lot must not buy a masked episode); one holding less is left alone, and so is a
    ready sandbox holding its pool's setup (its refill would only write it again)."""
    pools = [
        PoolConfig(name="disk", image=PYTHON, min_ready=0, max_total=3, disk_mb=512),
        PoolConfig(
            name="setup", image=PYTHON, min_ready=1, max_total=1, disk_mb=512, setup=["head -c 4000000 /dev/zero > /root/setup"]
        ),
    ]
    config = daemon_config(pools=pools, disk_floor_mb=1 << 40, disk_critical_mb=1 << 40, disk_check_interval=0.5)
    async with running_daemon(config) as node, AsyncClient(node.address, timeout=60) as client:
        await eventually(lambda: _true(node.pools["setup"].stats().ready == 1), 60, "the setup pool's sandbox is ready")
        small = await client.create_session("disk", acquire_timeout=60)
        big = await client.create_session("disk", acquire_timeout=60)
        assert (await small.exec("head -c 100000 /dev/zero > /root/small")).exit_code == 0
        started = time.monotonic()
        with pytest.raises((SandboxAbortedError, NotFoundError)) as ended:
            await big.exec("head -c 40000000 /dev/zero > /root/big")  # 40 MB of its 512
            while time.monotonic() - started < 30:
                await big.exec("sleep 0.2")
        assert "the node's disk was critically low" in ended.value.fault, ended.value
        assert "within its pool's disk_mb of 512 MB" in str(ended.value), ended.value
        await asyncio.sleep(1.5)  # the guard looked again
        assert (await small.exec("echo alive")).stdout == b"alive\n"
        assert node.disk_guard.killed_total == 1
        setup = node.pools["setup"].stats()
        assert setup.ready == 1 and setup.created_total == 1, setup
