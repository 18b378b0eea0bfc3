"""Every sandbox operation, in real containers, through the agent and through the exec fallback.

The same assertions run on both paths: the fallback must give the same results, only slower.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

import pytest
from helpers import STOP_LOOP
from rlsandbox.daemon.agent.socket_transport import AgentListener, accept_agent
from rlsandbox.daemon.errors import FailedPrecondition, SandboxDied
from rlsandbox.daemon.model import AgentMode, ContainerSpec, ExecRequest, FileWrite
from rlsandbox.daemon.pool import PoolSpec, SandboxFactory
from rlsandbox.daemon.pool.factory import DEFAULT_SOCKET_ROOT
from rlsandbox.daemon.runtime.docker import DockerRuntime
from rlsandbox.daemon.sandbox import Sandbox

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module", params=["agent", "agent-attach", "fallback"])
async def sandbox(
    request: pytest.FixtureRequest, docker_runtime: DockerRuntime, images: dict[str, str]
) -> AsyncIterator[Sandbox]:
    """agent: the agent on its unix socket (runc default); agent-attach: the agent on the
    container's attach stream (what runsc sandboxes use); fallback: Engine API exec."""
    image = images["busybox"] if request.param == "fallback" else images["python"]
    factory = SandboxFactory(docker_runtime, socket_root=None if request.param == "agent-attach" else DEFAULT_SOCKET_ROOT)
    sb = await factory.create(PoolSpec(name=f"ops-{request.param}", container=ContainerSpec(image=image)))
    assert sb.mode == ("exec" if request.param == "fallback" else "agent")
    transport = type(getattr(sb.channel, "_transport", None)).__name__
    assert transport == {"agent": "UnixSocketTransport", "agent-attach": "AttachTransport", "fallback": "NoneType"}[request.param]
    yield sb
    await factory.destroy(sb)


async def test_exit_codes_and_stderr(sandbox: Sandbox) -> None:
    r = await sandbox.exec(ExecRequest(shell="echo out; echo err >&2; exit 7"))
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (7, b"out\n", b"err\n", False)
    r = await sandbox.exec(ExecRequest(argv=("sh", "-c", "kill -TERM $$")))
    assert r.signal == 15 or r.exit_code == 143


async def test_cwd_env_and_stdin(sandbox: Sandbox) -> None:
    r = await sandbox.exec(
        ExecRequest(argv=("sh", "-c", "pwd; echo $GREETING; cat"), cwd="/tmp", env={"GREETING": "hello"}, stdin=b"from stdin")
    )
    assert r.stdout == b"/tmp\nhello\nfrom stdin"


async def test_timeout_kills_grandchildren(sandbox: Sandbox) -> None:
    tag = os.urandom(4).hex()
    r = await sandbox.exec(ExecRequest(shell=f"(sleep 1000{tag[:0]} &) ; sh -c 'sleep 1001' & sleep 1002", timeout=1))
    assert r.timed_out and r.exit_code is None and r.signal == 9
    assert r.duration < 5
    ps = await sandbox.exec(ExecRequest(argv=("ps", "-o", "args")))
    leftovers = [line for line in ps.stdout.decode().splitlines() if "sleep 100" in line]
    assert not leftovers, f"processes survived the timeout: {leftovers}"


async def test_a_rooms_last_command_leaves_no_process_that_acts_after_it(sandbox: Sandbox) -> None:
    """The clean room's tests run with ``end_leftovers``: whatever they started (in the
    background, in a session of its own, double-forked, deaf to SIGTERM and SIGHUP) is ended as
    they exit, before their result comes back, so nothing can write after them. The result names
    what was ended. Other commands leave theirs running, as an episode's must."""
    if sandbox.mode == "exec":
        pytest.skip("the Engine API exec fallback has no agent to end them (docs/GRADING.md)")
    late = f"/tmp/late-{os.urandom(4).hex()}"
    leave = (
        f"(trap '' TERM HUP; sleep 2; echo late > {late}-a) & "
        f"setsid sh -c '(sleep 2; echo late > {late}-b) &' ; "
        f"nohup sh -c 'sleep 2; echo late > {late}-c' >/dev/null 2>&1 & "
        "echo done"
    )
    ended = await sandbox.exec(ExecRequest(shell=leave, timeout=30, end_leftovers=True))
    assert ended.exit_code == 0 and ended.stdout == b"done\n" and ended.duration < 5
    assert ended.ended >= 3 and sum("sleep 2" in name for name in ended.ended_names) >= 2, ended.ended_names
    kept = await sandbox.exec(ExecRequest(shell=f"(sleep 0.3; echo late > {late}-d) >/dev/null 2>&1 & echo done"))
    assert kept.ended == 0
    await asyncio.sleep(2.5)
    found = await sandbox.exec(ExecRequest(shell=f"ls {late}-* 2>/dev/null"))
    assert found.stdout.decode().split() == [f"{late}-d"]


async def test_a_fork_bomb_a_rooms_last_command_leaves_is_ended_with_it(sandbox: Sandbox) -> None:
    """The same at the sandbox's pids limit, where commands run as root: the agent kills from PID 1
    (no fork needed), answers, and the sandbox runs commands again."""
    if sandbox.mode == "exec":
        pytest.skip("the Engine API exec fallback has no agent to end them (docs/GRADING.md)")
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    await sandbox.write_files([FileWrite("/tmp/bomb.py", bomb.encode())])
    left = "nohup python3 /tmp/bomb.py >/dev/null 2>&1 & sleep 0.5; echo done"
    ended = await sandbox.exec(ExecRequest(shell=left, timeout=30, end_leftovers=True))
    assert ended.stdout == b"done\n" and ended.ended > 10, (ended.ended, ended.ended_names)
    # Hundreds killed at once take a moment to finish exiting; a live bomb would never be gone.
    for _ in range(50):
        ps = await sandbox.exec(ExecRequest(argv=("ps", "-eo", "stat,args")))
        if ps.exit_code == 0 and b"bomb.py" not in ps.stdout:
            break
        await asyncio.sleep(0.1)
    assert ps.exit_code == 0 and b"bomb.py" not in ps.stdout, ps.stdout


async def test_output_caps_report_truncation_and_total(sandbox: Sandbox) -> None:
    r = await sandbox.exec(
        ExecRequest(shell="head -c 300000 /dev/zero; head -c 5000 /dev/zero >&2", stdout_cap=1000, stderr_cap=10_000)
    )
    assert (len(r.stdout), r.stdout_total, r.stdout_truncated) == (1000, 300_000, True)
    assert (len(r.stderr), r.stderr_total, r.stderr_truncated) == (5000, 5000, False)


async def test_binary_output(sandbox: Sandbox) -> None:
    await sandbox.write_files([FileWrite("/tmp/all-bytes", bytes(range(256)))])
    r = await sandbox.exec(ExecRequest(argv=("cat", "/tmp/all-bytes")))
    assert r.stdout == bytes(range(256))


async def test_ten_megabyte_file_round_trip(sandbox: Sandbox) -> None:
    data = os.urandom(10 << 20)
    results = await sandbox.write_files([FileWrite("/tmp/deep/er/big.bin", data, 0o600)])
    assert results[0].error is None
    [read] = await sandbox.read_files(["/tmp/deep/er/big.bin"], max_bytes=20 << 20)
    assert read.data == data and read.size == len(data) and not read.truncated
    [capped] = await sandbox.read_files(["/tmp/deep/er/big.bin"], max_bytes=1000)
    assert capped.data == data[:1000] and capped.truncated and capped.size == len(data)
    [st] = await sandbox.stat(["/tmp/deep/er/big.bin"])
    assert (st.exists, st.type, st.size, st.mode) == (True, "file", len(data), 0o600)


async def test_many_files_list_and_missing(sandbox: Sandbox) -> None:
    files = [FileWrite(f"/tmp/proj/pkg{i % 3}/m{i}.py", f"x = {i}\n".encode()) for i in range(30)]
    files.append(FileWrite("/tmp/proj/run.sh", b"#!/bin/sh\necho ran\n", 0o755))
    assert all(r.error is None for r in await sandbox.write_files(files))
    assert (await sandbox.exec(ExecRequest(argv=("/tmp/proj/run.sh",)))).stdout == b"ran\n"
    entries, truncated = await sandbox.list_dir("/tmp/proj", recursive=True)
    names = {e.path for e in entries}
    assert {"pkg0", "pkg1/m1.py", "run.sh"} <= names and len(names) == 34 and not truncated
    top, _ = await sandbox.list_dir("/tmp/proj")
    assert {e.path for e in top} == {"pkg0", "pkg1", "pkg2", "run.sh"}
    [missing] = await sandbox.read_files(["/tmp/proj/nope"])
    assert missing.error and not missing.data
    [st] = await sandbox.stat(["/tmp/proj/nope"])
    assert not st.exists


async def test_missing_program_is_exit_127(sandbox: Sandbox) -> None:
    r = await sandbox.exec(ExecRequest(argv=("/no/such/program",)))
    assert r.exit_code in (126, 127)


async def test_concurrent_commands_in_one_sandbox(sandbox: Sandbox) -> None:
    n = 1000 if sandbox.mode == "agent" else 40  # the fallback costs an Engine API exec each
    results = await asyncio.gather(*(sandbox.exec(ExecRequest(argv=("echo", str(i)))) for i in range(n)))
    bad = [(i, r) for i, r in enumerate(results) if r.stdout != f"{i}\n".encode()]
    assert not bad, bad[:3]


async def test_persistent_shell_keeps_cwd_env_and_functions(sandbox: Sandbox) -> None:
    if sandbox.mode != "agent":
        with pytest.raises(FailedPrecondition, match="python3"):
            await sandbox.exec(ExecRequest(shell="pwd", shell_session="main"))
        return
    await sandbox.exec(
        ExecRequest(shell="mkdir -p /tmp/w && cd /tmp/w && export K=v1 && greet() { echo hi $1; }", shell_session="main")
    )
    r = await sandbox.exec(ExecRequest(shell="pwd; echo $K; greet you; false", shell_session="main"))
    assert (r.stdout, r.exit_code) == (b"/tmp/w\nv1\nhi you\n", 1)
    r = await sandbox.exec(ExecRequest(shell="sleep 100", shell_session="main", timeout=0.5))
    assert r.timed_out
    r = await sandbox.exec(ExecRequest(shell="echo $K; pwd", shell_session="main"))
    assert r.stdout == b"v1\n/tmp/w\n", "a timed-out command must not take the shell's state with it"
    other = await sandbox.exec(ExecRequest(shell="echo ${K:-unset}", shell_session="other"))
    assert other.stdout == b"unset\n"
    assert await sandbox.close_shell("main")


async def test_agent_reaps_zombies(sandbox: Sandbox) -> None:
    if sandbox.mode != "agent":
        pytest.skip("zombie reaping of the fallback is docker-init's job")
    for _ in range(5):
        await sandbox.exec(ExecRequest(shell="(sleep 0.1 &) ; true"))
    await asyncio.sleep(0.5)
    r = await sandbox.exec(ExecRequest(argv=("ps", "-eo", "stat,args")))
    zombies = [line for line in r.stdout.decode().splitlines() if line.strip().startswith("Z")]
    assert not zombies, zombies


async def test_hardened_container_config(sandbox: Sandbox, docker_runtime: DockerRuntime) -> None:
    info = await docker_runtime.inspect(sandbox.container_id)
    host = info["HostConfig"]
    assert host["NetworkMode"] == "none" and "no-new-privileges:true" in host["SecurityOpt"]
    assert host["CapDrop"] == ["ALL"] and host["PidsLimit"] > 0 and host["Memory"] > 0
    assert info["Config"]["Labels"]["rlsandbox.owner"] == docker_runtime.owner
    r = await sandbox.exec(ExecRequest(shell="cat /proc/self/status | grep -i nonewprivs"))
    assert b"1" in r.stdout


@pytest.mark.runsc
async def test_agent_under_gvisor(docker_runtime: DockerRuntime, images: dict[str, str], no_leaks: None) -> None:
    factory = SandboxFactory(docker_runtime)
    spec = PoolSpec(name="gvisor", container=ContainerSpec(image=images["python"], runtime="runsc", agent=AgentMode.AGENT))
    sb = await factory.create(spec)
    try:
        r = await sb.exec(ExecRequest(shell="dmesg 2>/dev/null | head -1; echo done"))
        assert r.exit_code == 0 and b"done" in r.stdout
        assert b"gVisor" in r.stdout or b"Starting" in r.stdout, r.stdout
        # A fork's diff walked on the host sees what gVisor wrote, as the engine's does.
        r = await sb.exec(ExecRequest(shell="mkdir -p /srv/g && echo x > /srv/g/f && rm /etc/issue"))
        assert r.exit_code == 0, r.stderr
        info = await docker_runtime.inspect(sb.container_id)
        walked = await docker_runtime.changes(sb.container_id, info=info)
        assert sorted(walked) == sorted(await docker_runtime.changes(sb.container_id))
        assert {("/srv/g/f", 1), ("/etc/issue", 2)} <= set(walked), walked
        # An episode stopping its own processes (kill -STOP -1) never freezes the agent here either
        # (its spawns and shells through the spawner thread, gVisor's /proc).
        loop = ExecRequest(argv=("python3", "-c", STOP_LOOP), env={"SECONDS_": "4"}, timeout=30)
        attacker = asyncio.ensure_future(sb.exec(loop))
        commands = 0
        while not attacker.done():
            shell = f"s{commands}" if commands % 3 == 2 else None
            await asyncio.wait_for(sb.exec(ExecRequest(shell="true", shell_session=shell, timeout=3)), 15)
            commands += 1
        assert (await attacker).exit_code == 0 and commands > 0
        assert (await sb.exec(ExecRequest(shell="echo ok"))).stdout == b"ok\n"
    finally:
        await factory.destroy(sb)


async def test_socket_agent_outlives_its_daemon_connection(docker_runtime: DockerRuntime, images: dict[str, str]) -> None:
    """A daemon that goes away (crash, restart) does not take the sandbox with it: processes the
    commands started in the background live on, the command the daemon was waiting for is
    cancelled (nobody is left to read its result; a retry after re-adoption must not race it), and
    the agent accepts the next connection."""
    factory = SandboxFactory(docker_runtime)
    sb = await factory.create(PoolSpec(name="reconnect", container=ContainerSpec(image=images["python"])))
    try:
        started = await sb.exec(ExecRequest(shell="(sleep 1; echo survived > /tmp/background) >/dev/null 2>&1 &"))
        assert started.exit_code == 0
        waited = asyncio.create_task(sb.exec(ExecRequest(shell="sleep 1; echo finished > /tmp/waited")))
        await asyncio.sleep(0.3)
        await sb.channel.close("daemon crashed")
        with pytest.raises(SandboxDied):
            await waited
        listener = await AgentListener.open(factory.socket_folder(sb.name) / "agent.sock")  # the next daemon
        sb.channel = await accept_agent(listener, sb.name, 10)
        await listener.close()
        await asyncio.sleep(1.2)
        background, waited_mark = await sb.channel.read_files(["/tmp/background", "/tmp/waited"], 100, 10)
        assert background.data == b"survived\n", "a background process died with the daemon's connection"
        assert waited_mark.error is not None, "the command in flight when the daemon went away was not cancelled"
    finally:
        await factory.destroy(sb)


async def test_the_sandbox_cannot_write_its_host_folder(docker_runtime: DockerRuntime, images: dict[str, str]) -> None:
    """The agent's socket folder is the daemon's, read-only inside: nothing can be created, filled,
    replaced or redirected there, and the host folder holds the daemon's socket and nothing else."""
    factory = SandboxFactory(docker_runtime)
    sb = await factory.create(PoolSpec(name="hostdir", container=ContainerSpec(image=images["python"])))
    host = factory.socket_folder(sb.name)
    try:
        attempts = {
            "create": "echo x > /.rlsandbox/sock/file",
            "fill": "head -c 10000000 /dev/zero > /.rlsandbox/sock/big",
            "replace": "rm -f /.rlsandbox/sock/agent.sock",
            "redirect": "ln -sf /var/run/docker.sock /.rlsandbox/sock/agent.sock",
            "rename": "mv /.rlsandbox/sock/agent.sock /.rlsandbox/sock/old",
            "remount": "mount -o remount,rw /.rlsandbox/sock",
        }
        for what, command in attempts.items():
            r = await sb.exec(ExecRequest(shell=command))
            assert r.exit_code != 0, f"{what} worked: {r.stdout!r} {r.stderr!r}"
        assert sorted(p.name for p in host.iterdir()) == ["agent.sock"]
        assert host.joinpath("agent.sock").is_socket() and not host.joinpath("agent.sock").is_symlink()
        assert (await sb.exec(ExecRequest(argv=("echo", "still answering")))).stdout == b"still answering\n"
    finally:
        await factory.destroy(sb)
    assert not host.exists(), "the folder outlived its sandbox"
