"""Hostile programs are contained: each one runs in a sandbox, and the node stays healthy (other
sessions keep working, health stays SERVING, the hostile sandbox is removed when its session ends)."""

from __future__ import annotations

import asyncio
import io
import json
import resource
import subprocess
import tarfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import commands_through_a_stop_loop, daemon_config, running_daemon
from rlsandbox.client import AsyncClient, AsyncSession, NotFoundError, SandboxAbortedError
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.errors import ArchiveCutShort
from rlsandbox.daemon.grading.task import Task, load_tasks
from rlsandbox.daemon.runtime.container import KEPT_CAPABILITIES
from rlsandbox.daemon.runtime.docker import LABEL_SESSION
from rlsandbox.daemon.server import NodeDaemon
from rlsandbox.integrations import tools

# linux/capability.h
CAPABILITY_NUMBERS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "FSETID": 4, "KILL": 5, "SETGID": 6, "SETUID": 7}

TEXTKIT = Path(__file__).resolve().parent.parent / "fixtures" / "tasks" / "py-textkit" / "task.yaml"

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
async def node(images: dict[str, str]) -> AsyncIterator[NodeDaemon]:
    pool = PoolConfig(name="python", image="rlsandbox/python-task:latest", min_ready=2, max_total=8, memory_mb=512, pids=256)
    tiny = PoolConfig(name="tiny", image="rlsandbox/python-task:latest", min_ready=1, max_total=2, memory_mb=48)
    quota = PoolConfig(
        name="quota", image="rlsandbox/python-task:latest", min_ready=1, max_total=2, memory_mb=256, workspace_mb=32
    )
    readonly = PoolConfig(name="readonly", image="rlsandbox/python-task:latest", min_ready=1, max_total=2, read_only_root=True)
    async with running_daemon(daemon_config(pools=[pool, tiny, quota, readonly], metrics_listen="127.0.0.1:0")) as daemon:
        yield daemon


@pytest.fixture
async def hc(node: NodeDaemon) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(node.address, timeout=60) as c:
        yield c


async def assert_node_healthy(node: NodeDaemon, client: AsyncClient) -> None:
    async with client.session("python") as other:
        assert (await other.exec(["echo", "fine"])).stdout == b"fine\n"
    health = health_pb2_grpc.HealthStub(client._channel)
    assert (await health.Check(health_pb2.HealthCheckRequest())).status == health_pb2.HealthCheckResponse.SERVING


async def assert_removed_on_close(node: NodeDaemon, s: AsyncSession) -> None:
    await s.close()
    left = await node.runtime.list_containers({LABEL_SESSION: s.id})
    assert not left, f"the sandbox of {s.id} outlived its session"


async def test_fork_bomb(node: NodeDaemon, hc: AsyncClient) -> None:
    s = await hc.create_session("python")
    await s.exec(["bash", "-c", ":(){ :|:& };:"], timeout=3)  # returns at once; the bomb runs on
    await assert_node_healthy(node, hc)  # bounded by the sandbox's pids limit
    await assert_removed_on_close(node, s)


async def test_memory_bomb(node: NodeDaemon, hc: AsyncClient) -> None:
    async with hc.session("python") as s:
        r = await s.exec(["python3", "-c", "x = bytearray(2 * 1024**3)"], timeout=30)
        assert r.exit_code is None and r.signal == 9  # the kernel's OOM killer, inside the sandbox
        assert (await s.exec(["echo", "still here"])).stdout == b"still here\n"
    await assert_node_healthy(node, hc)


async def test_endless_output(node: NodeDaemon, hc: AsyncClient) -> None:
    async with hc.session("python") as s:
        r = await s.exec("yes", timeout=1, stdout_cap=4096)
        assert r.timed_out and r.stdout_truncated and len(r.stdout) == 4096
        assert r.stdout_total > 10 * 4096  # counted, not kept
    await assert_node_healthy(node, hc)


async def test_process_ignoring_sigterm_is_killed_at_its_timeout(node: NodeDaemon, hc: AsyncClient) -> None:
    async with hc.session("python") as s:
        t = time.monotonic()
        r = await s.exec("trap '' TERM; sleep 100", timeout=1)
        assert r.timed_out and r.signal == 9 and time.monotonic() - t < 5


async def test_daemonized_grandchild_does_not_outlive_the_session(node: NodeDaemon, hc: AsyncClient) -> None:
    s = await hc.create_session("python")
    t = time.monotonic()
    r = await s.exec("setsid sh -c 'sleep 1000' & echo started", timeout=10)
    assert r.stdout == b"started\n" and time.monotonic() - t < 3  # the command does not wait for it
    assert b"sleep 1000" in (await s.exec("ps -eo args")).stdout  # alive inside the sandbox...
    await assert_removed_on_close(node, s)  # ...and gone with it


async def test_no_network(node: NodeDaemon, hc: AsyncClient) -> None:
    async with hc.session("python") as s:
        r = await s.exec(["python3", "-c", "import socket; socket.create_connection(('1.1.1.1', 80), timeout=3)"], timeout=10)
        assert r.exit_code == 1 and b"Network is unreachable" in r.stderr
        r = await s.exec(["python3", "-c", "import socket; socket.getaddrinfo('pypi.org', 443)"], timeout=10)
        assert r.exit_code == 1


async def test_host_processes_are_invisible(node: NodeDaemon, hc: AsyncClient) -> None:
    async with hc.session("python") as s:
        one = await s.exec("tr '\\0' ' ' < /proc/1/cmdline")
        assert one.stdout.startswith(b"python3 -u /.rlsandbox/agent.py")  # PID 1 is the sandbox's own agent
        procs = (await s.exec("ls /proc | grep -c '^[0-9]'")).stdout
        assert int(procs) < 20  # the sandbox's processes only, not the host's hundreds
        r = await s.exec("cat /proc/1/environ /proc/kcore 2>&1 | head -c 100; dmesg 2>&1 | head -1")
        assert b"dockerd" not in r.stdout


async def test_sandbox_killed_mid_command_is_aborted_with_the_reason(node: NodeDaemon, hc: AsyncClient) -> None:
    s = await hc.create_session("python")
    running = asyncio.create_task(s.exec("sleep 30", timeout=60))
    await asyncio.sleep(0.5)
    sandbox = node.sessions.get(s.id).sandbox
    assert sandbox is not None
    await node.runtime.docker.containers.container(sandbox.container_id).kill()  # an OOM kill, a node hiccup
    with pytest.raises(SandboxAbortedError, match="died") as died:
        await running
    assert died.value.fault == ""  # killed from outside: the node's trouble, not the episode's
    with pytest.raises(NotFoundError, match="died") as gone:
        await hc.get_session(s.id)  # the session ended, and says why
    assert gone.value.fault == ""
    await assert_node_healthy(node, hc)


async def test_sandbox_oom_killed_as_a_whole_is_aborted_and_told_apart(node: NodeDaemon, hc: AsyncClient) -> None:
    """The OOM killer takes the sandbox's agent (PID 1), here by making it hold a command's input
    larger than the sandbox's memory (it keeps no output it streams): the caller learns it was
    memory, the session ends saying so, and the `failed` event and alert carry oom_killed."""
    s = await hc.create_session("tiny")
    with pytest.raises(SandboxAbortedError, match="out of memory: the kernel OOM-killed it at its memory limit of 48 MB"):
        await s.exec("sleep 20", stdin=b"x" * 60_000_000, timeout=30)
    with pytest.raises(NotFoundError, match="out of memory"):
        await hc.get_session(s.id)
    await assert_node_healthy(node, hc)


def _host_wide_oom_kill_logged(container_id: str) -> None:
    """The kernel's summary line of an OOM kill because the host ran out of memory, for a process
    of this container, written to the real /dev/kmsg the daemon follows (a host-wide OOM cannot
    be caused safely on a test machine)."""
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(
            "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
            f"task_memcg=/docker/{container_id},task=python3,pid=1,uid=0\n"
        )


def tiny_textkit() -> Task:
    """The py-textkit task in the 48 MB pool."""
    textkit = load_tasks(TEXTKIT)[0]
    return Task(textkit.spec.model_copy(update={"pool": "tiny"}), textkit.workspace_tar)


async def slow_import(s: AsyncSession) -> None:
    """The agent's textkit takes 3 s to import: a test run long enough to be hit in the middle."""
    core = (await s.read_files(["src/textkit/core.py"]))["src/textkit/core.py"].data.decode()
    await s.write_files({"src/textkit/core.py": "import time\ntime.sleep(3)\n" + core})


async def test_an_oom_kill_because_the_host_ran_out_of_memory_is_the_nodes_doing(node: NodeDaemon, hc: AsyncClient) -> None:
    """The host's OOM killer takes the sandbox's agent (its line in the kernel's log; the kill
    itself from outside, as the kernel's would be). The engine's OOMKilled is the same for a kill
    at the sandbox's own limit; only that one is the episode's doing. This one is the node's: no
    fault, so a trainer masks it instead of teaching the policy that its episode failed."""
    assert node.factory.oom.watching, "the daemon does not follow the kernel's log"
    assert node.metrics is not None
    deaths = {"pool": "tiny", "cause": "host_oom_killed"}
    before = node.metrics.registry.get_sample_value("rlsandbox_sandbox_deaths_total", deaths) or 0
    s = await hc.create_session("tiny")
    sandbox = node.sessions.get(s.id).sandbox
    assert sandbox is not None and sandbox.container_id
    running = asyncio.create_task(s.exec("sleep 30", timeout=60))
    await asyncio.sleep(0.5)
    _host_wide_oom_kill_logged(sandbox.container_id)
    await node.runtime.docker.containers.container(sandbox.container_id).kill()
    with pytest.raises(SandboxAbortedError, match="the host ran out of memory") as died:
        await running
    assert died.value.fault == ""
    with pytest.raises(NotFoundError, match="the host ran out of memory") as gone:
        await hc.get_session(s.id)
    assert gone.value.fault == ""
    # Counted apart from other deaths, for the alert that says the node's pools overcommit memory.
    assert node.metrics.registry.get_sample_value("rlsandbox_sandbox_deaths_total", deaths) == before + 1
    await assert_node_healthy(node, hc)


async def test_an_episode_filling_its_memory_after_a_host_wide_oom_kill_still_scores_0(node: NodeDaemon, hc: AsyncClient) -> None:
    """A policy's way around a 0: once the host's OOM killer has taken something of its sandbox,
    kill the sandbox itself (fill its memory past its own limit) and be masked as the node's
    trouble. The kernel logs that last kill at the sandbox's own limit: it is the episode's."""
    s = await hc.create_session("tiny")
    sandbox = node.sessions.get(s.id).sandbox
    assert sandbox is not None and sandbox.container_id
    _host_wide_oom_kill_logged(sandbox.container_id)
    with pytest.raises(SandboxAbortedError, match="out of memory: the kernel OOM-killed it at its memory limit of 48 MB") as died:
        await s.exec("sleep 20", stdin=b"x" * 60_000_000, timeout=30)
    assert "out of memory" in died.value.fault
    await assert_node_healthy(node, hc)


@pytest.mark.parametrize("first", ["grade", "step"])
async def test_a_sandbox_its_episode_killed_scores_reward_0_never_an_infra_error(
    node: NodeDaemon, hc: AsyncClient, first: str
) -> None:
    """The episode fills /dev/shm past its sandbox's memory (48 MB): the kernel OOM-kills the
    sandbox whole. That is the episode's doing: every call on the session says so (the `fault`
    field, trailing metadata rlsandbox-fault), and its grade is reward 0 with the cause as its
    limit, status ok: never an infra error, which a trainer masks (dying would pay better than
    failing). The same whether the grade or a step is the first to meet the death."""
    task = tiny_textkit()
    s = await hc.create_session(task=task)
    filler = "(sleep 0.3; head -c 60000000 /dev/zero > /dev/shm/fill) > /dev/null 2>&1 &"
    assert (await s.exec(filler)).exit_code == 0
    await asyncio.sleep(3)
    if first == "step":
        with pytest.raises((SandboxAbortedError, NotFoundError)) as died:
            await s.exec("true")
        assert "out of memory" in died.value.fault and "do not mask" in died.value.message, died.value
    grade = await s.grade()
    assert grade.status == "ok" and grade.reward == 0.0 and not grade.resolved, grade
    assert len(grade.limits) == 1 and "out of memory" in grade.limits[0] and "48 MB" in grade.limits[0], grade.limits
    with pytest.raises(NotFoundError) as gone:
        await s.exec("true")
    assert gone.value.fault == grade.limits[0]
    assert await tools.alost(s, gone.value) == grade  # what the adapters use: the node's grade again
    await assert_node_healthy(node, hc)


async def _engine_view(node: NodeDaemon, s: AsyncSession, path: str) -> set[str]:
    """The names under ``path`` as the grader reads them: through the engine's archive API."""
    sandbox = node.sessions.get(s.id).sandbox
    assert sandbox is not None
    tar = await node.runtime.get_archive(sandbox.container_id, path, 1 << 20)
    return set(tarfile.open(fileobj=io.BytesIO(tar)).getnames())


CHURN = "nohup python3 -c \"while 1: open('churn.txt', 'w').write('x' * 100000)\" >/dev/null 2>&1 &"


async def test_a_file_shrunk_nonstop_never_yields_a_cut_tarball(node: NodeDaemon, hc: AsyncClient) -> None:
    """The engine ends its archive stream early, with no error, when a file shrinks while it is
    copied (here about one read in five): what reaches the grader or a fork is the whole folder,
    read again, or a typed error, never a tarball missing the files after the one that shrank."""
    async with hc.session("python") as s:
        sandbox = node.sessions.get(s.id).sandbox
        assert sandbox is not None
        assert (await s.exec(f"seq 1 20000 > zz.txt; {CHURN} sleep 0.5")).exit_code == 0
        whole, refused = 0, 0
        for _ in range(20):
            try:
                tar = await node.runtime.get_archive(sandbox.container_id, "/workspace", 64 << 20)
            except ArchiveCutShort as e:
                assert "kept changing while it was read" in e.message
                refused += 1
                continue
            with tarfile.open(fileobj=io.BytesIO(tar)) as t:
                data = {m.name: t.extractfile(m).read() for m in t if m.isfile()}  # type: ignore[union-attr]
            assert data["workspace/zz.txt"].endswith(b"\n20000\n")
            whole += 1
        assert whole >= 10, (whole, refused)
    await assert_node_healthy(node, hc)


async def test_reading_a_huge_sparse_file_costs_the_node_only_what_is_asked(node: NodeDaemon, hc: AsyncClient) -> None:
    """A file of 4 GiB that costs the sandbox nothing (sparse): reading its first MiB through the
    engine moves that MiB, not the 4 GiB (the grader reads report files this way)."""
    async with hc.session("python") as s:
        sandbox = node.sessions.get(s.id).sandbox
        assert sandbox is not None
        assert (await s.exec("truncate -s 4G big.bin")).exit_code == 0
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        data, size = await node.runtime.get_file(sandbox.container_id, "/workspace/big.bin", 1 << 20)
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10
        assert (len(data), size) == (1 << 20, 4 << 30)
        assert grown_mb < 256, f"the daemon's peak memory grew by {grown_mb} MiB for a 1 MiB read"
    await assert_node_healthy(node, hc)


async def test_filling_the_disk_stops_at_the_workspace_quota(node: NodeDaemon, hc: AsyncClient) -> None:
    async with hc.session("quota") as s:
        r = await s.exec("dd if=/dev/zero of=/workspace/fill bs=1M count=100", timeout=30)
        assert r.exit_code != 0 and b"No space left on device" in r.stderr
        size_mb = int((await s.exec("du -sm /workspace/fill")).stdout.split()[0])
        assert 30 <= size_mb <= 32  # stopped at the 32 MB quota, not at the node's disk
        assert (await s.exec("rm /workspace/fill && echo after > /workspace/after")).exit_code == 0
        assert (await s.read_files(["/workspace/after"]))["/workspace/after"].data == b"after\n"
        # The grader reads workspaces through the engine: the quota volume is visible to it.
        assert "workspace/after" in await _engine_view(node, s, "/workspace")
    await assert_node_healthy(node, hc)


async def test_read_only_root_keeps_tmp_and_the_workspace_writable(node: NodeDaemon, hc: AsyncClient) -> None:
    async with hc.session("readonly") as s:
        r = await s.exec("touch /usr/lib/planted")
        assert r.exit_code != 0 and b"Read-only file system" in r.stderr
        assert (await s.exec("echo t > /tmp/t && echo w > /workspace/w && python3 -c 'print(1)'")).exit_code == 0
        assert "workspace/w" in await _engine_view(node, s, "/workspace")
        assert (await s.exec("echo shell-too", shell_session="main")).stdout == b"shell-too\n"


async def test_hardened_defaults(node: NodeDaemon, hc: AsyncClient) -> None:
    """What every sandbox gets without asking: only the capabilities in KEPT_CAPABILITIES,
    no-new-privileges, Docker's default seccomp filter, and the pool's pids and nofile limits."""
    async with hc.session("python") as s:
        status = dict(
            line.split(":\t", 1) for line in (await s.exec("cat /proc/self/status")).stdout.decode().splitlines() if ":\t" in line
        )
        kept = sum(1 << CAPABILITY_NUMBERS[name] for name in KEPT_CAPABILITIES)
        assert int(status["CapEff"], 16) == kept and int(status["CapBnd"], 16) == kept
        assert status["NoNewPrivs"].strip() == "1"
        assert status["Seccomp"].strip() == "2"  # a filter: Docker's default profile
        assert (await s.exec("ulimit -n")).stdout == b"4096\n"
        pids_max = await s.exec("cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max")
        assert pids_max.stdout == b"256\n"
        raw = await s.exec(["python3", "-c", "import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)"])
        assert raw.exit_code != 0 and b"PermissionError" in raw.stderr  # no NET_RAW
        assert (await s.exec("mknod /tmp/dev c 1 3")).exit_code != 0  # no MKNOD


async def test_special_files_never_wedge_the_agent(node: NodeDaemon, hc: AsyncClient) -> None:
    """FIFOs, devices and sockets are refused without blocking; a path 2,500 folders deep is that
    file's error; a FIFO planted where the agent writes its temporary file is replaced. The session
    answers throughout, and every call returns well within its deadline."""
    async with hc.session("python") as s:
        made = await s.exec(
            "mkfifo /tmp/fifo && python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind(\"/tmp/sock\")' "
            "&& mkfifo /tmp/target.txt.rls-tmp-1"
        )
        assert made.exit_code == 0, made.stderr
        started = time.monotonic()
        got = await s.read_files(["/tmp/fifo", "/dev/zero", "/tmp/sock", "/etc/hostname"])
        assert got["/tmp/fifo"].error and "regular file" in got["/tmp/fifo"].error
        assert got["/dev/zero"].error and got["/tmp/sock"].error
        assert got["/etc/hostname"].error is None and got["/etc/hostname"].data
        deep = "/tmp/" + "/".join(["d"] * 1900) + "/f.txt"  # 1,900 folders: os.makedirs would recurse past its limit
        await s.write_files({deep: "deep"})
        assert (await s.read_files([deep]))[deep].data == b"deep"
        await s.write_files({"/tmp/target.txt": "over the fifo", "/tmp/ok.txt": "fine"})
        assert time.monotonic() - started < 10
        assert (await s.exec("cat /tmp/target.txt /tmp/ok.txt")).stdout == b"over the fifofine"
        assert (await hc.get_session(s.id)).state == "ready"


async def test_an_episode_stopping_its_own_processes_never_freezes_the_agent(node: NodeDaemon, hc: AsyncClient) -> None:
    """As root, `kill -STOP -1` in a loop stops every command's process before its exec too: the
    agent kills such a process and answers throughout; the session is never lost to it."""
    async with hc.session("python") as s:
        seen = await commands_through_a_stop_loop(s)
        assert seen["commands"] > 0, seen
        assert (await hc.get_session(s.id)).state == "ready"
    await assert_node_healthy(node, hc)


async def test_a_clean_room_the_episodes_code_fills_with_memory_grades_0_not_infra_error(
    node: NodeDaemon, hc: AsyncClient
) -> None:
    """The agent's code fills /dev/shm past the sandbox's memory when the tests import it: in
    the clean room. The kernel OOM-kills the largest process there (the test run, here) or the
    room whole (its agent); either way the grade is the episode's 0, never an infra error a
    trainer would mask (a room killed whole says so in limits; test_disk_guard.py pins that
    path down with the disk guard's kill)."""
    task = tiny_textkit()
    async with hc.session(task=task) as s:
        core = (await s.read_files(["src/textkit/core.py"]))["src/textkit/core.py"].data.decode()
        bomb = "import subprocess\nsubprocess.run('head -c 60000000 /dev/zero > /dev/shm/fill', shell=True)\n"
        await s.write_files({"src/textkit/core.py": bomb + core})
        grade = await s.grade()
    assert grade.status == "ok" and grade.reward == 0.0 and not grade.resolved, (grade.status, grade.message)
    assert all("the clean room died of the episode's code: out of memory" in why for why in grade.limits), grade.limits
    await assert_node_healthy(node, hc)


async def test_an_in_place_test_run_hit_by_a_host_wide_oom_kill_is_an_infra_error(node: NodeDaemon, hc: AsyncClient) -> None:
    """The same for a grade in the session's own sandbox (``mode="in_place"``)."""
    task = tiny_textkit()
    async with hc.session(task=task) as s:
        await slow_import(s)
        mine = node.sessions.get(s.id).sandbox
        assert mine is not None and mine.container_id
        grading = asyncio.create_task(s.grade(mode="in_place"))
        await asyncio.sleep(1.5)  # into the test run
        _host_wide_oom_kill_logged(mine.container_id)
        grade = await grading
    assert grade.status == "infra_error" and grade.reward is None, (grade.status, grade.message)
    assert "the host ran out of memory during the test run" in grade.message, grade.message


@pytest.mark.parametrize("room_dies", [False, True], ids=["a-test-process", "the-room"])
async def test_a_clean_room_test_run_hit_by_a_host_wide_oom_kill_is_an_infra_error(
    node: NodeDaemon, hc: AsyncClient, room_dies: bool
) -> None:
    """While the tests run in the clean room, the kernel's log says the host's memory ran out and
    a process of the room was killed (the summary line written to the real /dev/kmsg: see the
    test above); or the kill took the room's agent, and the room with it. That run says nothing
    of the agent's work: an infra error, masked, never a 0."""
    task = tiny_textkit()
    async with hc.session(task=task) as s:
        await slow_import(s)
        mine = node.sessions.get(s.id).sandbox
        grading = asyncio.create_task(s.grade())
        deadline = time.monotonic() + 30
        room = None
        while room is None and time.monotonic() < deadline and not grading.done():
            room = next((x for x in node.pools["tiny"]._leased if x is not mine), None)
            await asyncio.sleep(0.05)
        assert room is not None and room.container_id, "no clean room was taken"
        await asyncio.sleep(1.0)  # into the test run
        _host_wide_oom_kill_logged(room.container_id)
        if room_dies:
            await node.runtime.docker.containers.container(room.container_id).kill()
        grade = await grading
    assert grade.status == "infra_error" and grade.reward is None, (grade.status, grade.message)
    assert "the host ran out of memory" in grade.message, grade.message
    await assert_node_healthy(node, hc)


# Run by a root episode: every way into the agent (PID 1) a process of the same uid has without
# CAP_SYS_PTRACE. Through any of them it could make the agent report anything: in a clean room,
# where the code under test runs as root, a passing test run.
REACH_THE_AGENT = r"""
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
seen = {"ptrace": libc.ptrace(16, 1, 0, 0) == 0}  # PTRACE_ATTACH
for path, flags in (("/proc/1/fd/0", os.O_RDONLY), ("/proc/1/fd/1", os.O_WRONLY), ("/proc/1/fd/2", os.O_WRONLY),
                    ("/proc/1/mem", os.O_RDWR), ("/proc/1/environ", os.O_RDONLY)):
    try:
        os.close(os.open(path, flags))
        seen[path] = True
    except OSError:
        seen[path] = False
try:
    seen["readlink /proc/1/fd/1"] = bool(os.readlink("/proc/1/fd/1"))
except OSError:
    seen["readlink /proc/1/fd/1"] = False
print(json.dumps(seen))
"""


async def test_a_root_episode_cannot_reach_the_agent(hc: AsyncClient) -> None:
    """A root episode could trace the agent, read and write its memory and descriptors: on runc
    (dumpable, same uid, same capabilities) all of it worked. The agent makes itself undumpable
    at start, so each needs CAP_SYS_PTRACE, which no sandbox has; its commands are unaffected."""
    async with hc.session("python") as s:
        tried = await s.exec(["python3", "-c", REACH_THE_AGENT])
        assert tried.exit_code == 0, tried.stderr_text
        seen = json.loads(tried.stdout)
        assert len(seen) == 7 and not any(seen.values()), seen
        # What the episode's own commands do with their /proc is as before.
        mine = await s.exec("cat /proc/self/environ | tr '\\0' '\\n' | grep -c = ; ls /proc/self/fd | wc -l")
        assert mine.exit_code == 0 and all(int(n) > 0 for n in mine.stdout.split()), mine.stdout_text
        assert (await s.exec("echo alive")).stdout == b"alive\n"


@pytest.mark.runsc
async def test_writing_to_the_agents_stdout_costs_the_host_disk_a_capped_log(images: dict[str, str]) -> None:
    """What reaches PID 1's stdout and stderr is logged by the engine on the host, outside the
    writable layer (4x over, as JSON lines): 150 MB used to be 600 MB of the node's disk. On runc
    no episode reaches them any more (above); under gVisor the agent's frames pass there (the
    attach stream) and /proc/1/fd stays open to a root episode. The log is capped at 1 MB."""
    pool = PoolConfig(name="gvisor", image=images["python"], min_ready=0, max_total=1, runtime="runsc")
    async with (
        running_daemon(daemon_config(pools=[pool])) as node,
        AsyncClient(node.address, timeout=120) as client,
        client.session("gvisor", acquire_timeout=120) as s,
    ):
        assert (await s.exec("head -c 150000000 /dev/zero > /proc/1/fd/2", timeout=120)).exit_code == 0
        sandbox = node.sessions.get(s.id).sandbox
        assert sandbox is not None
        log_path = (await node.runtime.inspect(sandbox.container_id))["LogPath"]
        kept = sum(p.stat().st_size for p in Path(log_path).parent.glob(Path(log_path).name + "*"))
        assert 0 < kept <= 4 << 20, kept  # 1 MB, and what a rotation under way may hold a moment
        assert (await s.exec("echo alive")).stdout == b"alive\n"


# Forged RESULT frames (exit 0, no error) for every request id, written where the agent answers.
FORGE_ANSWERS = """
import struct
try:
    out = open("/proc/1/fd/1", "wb", 0)
except OSError:
    out = None
if out is not None:
    meta = b'{"exit_code": 0, "signal": null, "results": [], "stats": [], "entries": []}'
    for rid in range(1, 400):
        out.write(struct.pack(">2sBBIII", b"RX", 1, 18, rid, len(meta), 0) + meta)
"""


@pytest.mark.runsc
async def test_a_gvisor_episode_that_forges_its_agents_answers_scores_0(images: dict[str, str]) -> None:
    """Under gVisor a root episode can open /proc/1/fd/1, the attach stream the agent answers on,
    undumpable PID 1 or not: forged RESULT frames there once passed for the agent's own answers
    (tried: a command's exit 0). The stream is keyed now: a forgery ends the sandbox as the
    episode's own doing. The step says so (fault), the grade is reward 0 with it as its limit,
    never an infra error to mask; and the same when the code under test forges in the clean room."""
    textkit = load_tasks(TEXTKIT)[0]
    task = Task(textkit.spec.model_copy(update={"pool": "gvisor"}), textkit.workspace_tar)
    pool = PoolConfig(name="gvisor", image=images["python"], min_ready=0, max_total=2, runtime="runsc")
    async with running_daemon(daemon_config(pools=[pool])) as node, AsyncClient(node.address, timeout=120) as client:
        s = await client.create_session(task=task, acquire_timeout=120)
        assert (await s.exec("true")).exit_code == 0
        with pytest.raises((SandboxAbortedError, NotFoundError)) as died:
            await s.exec(["python3", "-c", FORGE_ANSWERS], timeout=30)
        assert "tampered with" in died.value.fault and "do not mask" in died.value.message, died.value
        grade = await s.grade()
        assert grade.status == "ok" and grade.reward == 0.0 and grade.limits == [died.value.fault], grade

        # The code under test forges, from the clean room, the answers to the grader's own requests.
        s = await client.create_session(task=task, acquire_timeout=120)
        init = "src/textkit/__init__.py"
        original = (await s.read_files([init]))[init].data
        await s.write_files({init: original + FORGE_ANSWERS.encode()})
        grade = await s.grade()
        assert grade.status == "ok" and grade.reward == 0.0, grade
        assert len(grade.limits) == 1 and "the clean room died of the episode's code" in grade.limits[0], grade.limits
        assert "tampered with from inside the sandbox" in grade.limits[0], grade.limits
        await s.close()
        assert node.grader.infra_errors_total == 0


async def test_an_images_declared_volume_is_memory_not_the_hosts_disk(images: dict[str, str], tmp_path: Path) -> None:
    """An image's VOLUME would be an anonymous volume on the host's disk: outside the writable
    layer (the disk guard never sees it) and writable under a read-only root (200 MB written
    there stayed on the host's disk, the layer's size 0). It is a tmpfs volume bounded by the
    sandbox's memory instead; the image's files there are not carried over (Docker mounts the
    tmpfs over what it copied in)."""
    image = "rlsandbox-test/declares-a-volume:latest"
    (tmp_path / "Dockerfile").write_text(f"FROM {images['python']}\nRUN mkdir -p /data && echo seed > /data/seed\nVOLUME /data\n")
    built = await asyncio.to_thread(subprocess.run, ["docker", "build", "-q", "-t", image, str(tmp_path)], capture_output=True)
    assert built.returncode == 0, built.stderr.decode()
    try:
        pool = PoolConfig(name="vol", image=image, min_ready=0, max_total=1, memory_mb=128, read_only_root=True, recycle=False)
        async with (
            running_daemon(daemon_config(pools=[pool])) as node,
            AsyncClient(node.address, timeout=60) as client,
            client.session("vol", acquire_timeout=60) as s,
        ):
            seen = await s.exec("stat -f -c %T /data; df -k /data | tail -1; head -c 1000000 /dev/zero > /data/f")
            lines = seen.stdout_text.split("\n")
            assert seen.exit_code == 0 and lines[0] == "tmpfs", seen.stdout_text
            assert int(lines[1].split()[1]) <= 128 * 1024, seen.stdout_text  # its size: the sandbox's memory
    finally:
        await asyncio.to_thread(subprocess.run, ["docker", "rmi", "-f", image], capture_output=True)
