"""The in-sandbox agent run as a host subprocess: its semantics without Docker."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_local import SubprocessTransport
from rlsandbox.daemon.agent import AGENT_PATH
from rlsandbox.daemon.agent import protocol as p
from rlsandbox.daemon.agent.channel import AgentChannel
from rlsandbox.daemon.agent.socket_transport import AgentListener, accept_agent
from rlsandbox.daemon.errors import InvalidArgument, SandboxDied
from rlsandbox.daemon.model import ExecRequest, OutputChunk


@pytest.fixture(params=[False, True], ids=["plain", "keyed"])
async def channel(request: pytest.FixtureRequest) -> AsyncIterator[AgentChannel]:
    ch = AgentChannel(await SubprocessTransport.start(), name="local-agent", keyed=request.param)
    await ch.start(timeout=10)
    yield ch
    await ch.close()


async def test_hello_reports_protocol_and_python(channel: AgentChannel) -> None:
    assert channel.info["protocol"] == p.PROTOCOL_VERSION
    assert channel.info["python"].count(".") == 2


async def test_invalid_utf8_output_is_returned_as_bytes(channel: AgentChannel) -> None:
    r = await channel.exec(ExecRequest(shell="printf '\\303\\050\\377ok'"))
    assert r.stdout == b"\xc3\x28\xffok"


@pytest.mark.processes
async def test_cancelling_the_caller_kills_the_command(channel: AgentChannel, tmp_path: object) -> None:
    marker = f"/tmp/rls-cancel-{os.getpid()}"
    task = asyncio.create_task(channel.exec(ExecRequest(shell=f"sleep 0.5; touch {marker}", timeout=30)))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.6)
    assert not os.path.exists(marker), "the command kept running after its caller was cancelled"


@pytest.mark.processes
async def test_stream_delivers_chunks_while_running(channel: AgentChannel) -> None:
    arrivals: list[tuple[float, OutputChunk]] = []
    started = time.monotonic()
    r = await channel.exec(
        ExecRequest(shell="echo first; sleep 0.5; echo second"),
        on_chunk=lambda c: arrivals.append((time.monotonic() - started, c)),
    )
    assert r.stdout == b"first\nsecond\n"
    assert arrivals[0][1].data == b"first\n" and arrivals[0][0] < 0.4


async def test_bad_request_is_an_error_not_a_crash(channel: AgentChannel) -> None:
    with pytest.raises(InvalidArgument, match="non-empty argv"):
        await channel.request(p.K_EXEC, {"argv": []}, timeout=5)
    with pytest.raises(InvalidArgument, match="unknown request kind"):
        await channel.request(77, {}, timeout=5)
    assert (await channel.exec(ExecRequest(argv=("true",)))).exit_code == 0


async def test_unknown_protocol_version_gets_an_error_and_the_agent_lives_on() -> None:
    transport = await SubprocessTransport.start()
    ch = AgentChannel(transport, name="v")
    await ch.start(timeout=10)
    frame = bytearray(p.encode_frame(p.K_PING, 999, b"{}"))
    frame[2] = 42
    await transport.send(bytes(frame))
    assert (await ch.exec(ExecRequest(argv=("echo", "alive")))).stdout == b"alive\n"
    await ch.close()


@pytest.mark.processes
async def test_garbage_on_the_wire_ends_the_agent_and_fails_callers() -> None:
    transport = await SubprocessTransport.start()
    ch = AgentChannel(transport, name="g")
    await ch.start(timeout=10)
    pending = asyncio.create_task(ch.exec(ExecRequest(shell="sleep 5")))
    await asyncio.sleep(0.1)
    await transport.send(b"this is not a frame at all")
    with pytest.raises(SandboxDied):
        await pending
    assert not ch.alive
    await ch.close()


async def test_shutdown_exits_cleanly() -> None:
    transport = await SubprocessTransport.start()
    ch = AgentChannel(transport, name="s")
    await ch.start(timeout=10)
    await ch.request(p.K_SHUTDOWN, {}, timeout=5)
    assert await asyncio.wait_for(transport.proc.wait(), 5) == 0
    await ch.close()


@pytest.mark.processes
async def test_socket_agent_survives_its_daemon_and_serves_the_next_one(tmp_path: Path) -> None:
    """What crash recovery rests on: the agent outlives a dropped connection, cancels the commands
    of the connection that went away (a reconnecting daemon numbers requests from 1 again), and
    keeps its persistent shells for the next connection."""
    path = tmp_path / "agent.sock"
    listener = await AgentListener.open(path)
    agent = subprocess.Popen([sys.executable, str(AGENT_PATH), "--connect", str(path)])
    try:
        first = await accept_agent(listener, "first", 10)
        await listener.close()
        assert (await first.exec(ExecRequest(shell="export KEPT=yes", shell_session="main", timeout=10))).exit_code == 0
        marker = tmp_path / "finished"
        orphan = asyncio.create_task(first.exec(ExecRequest(shell=f"sleep 2; touch {marker}", timeout=30)))
        await asyncio.sleep(0.3)
        await first.close("daemon died")
        with pytest.raises(SandboxDied):
            await orphan
        await asyncio.sleep(0.3)
        assert agent.poll() is None, "the agent exited with its daemon's connection"

        listener = await AgentListener.open(path)  # a restarted daemon: the agent dials it again
        second = await accept_agent(listener, "second", 10)
        await listener.close()
        shell = await second.exec(ExecRequest(shell="echo $KEPT", shell_session="main", timeout=10))
        assert shell.stdout == b"yes\n"
        # Request ids start at 1 again and get their own answers.
        results = await asyncio.gather(*(second.exec(ExecRequest(argv=("echo", str(i)), timeout=10)) for i in range(20)))
        assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(20)]
        await asyncio.sleep(2.5)
        assert not marker.exists(), "the orphaned command was not cancelled"
        assert agent.poll() is None
        await second.close("done")
    finally:
        agent.kill()
        agent.wait()


async def test_commands_start_like_popen_would_start_them(channel: AgentChannel, tmp_path: Path) -> None:
    """posix_spawn in the agent keeps Popen's semantics: SIGPIPE default again in the child (the
    agent ignores it), the request's PATH used to find the program, cwd honoured, stdin fed, the
    command a session leader, and 127/126 for a missing program or folder."""
    piped = await channel.exec(ExecRequest(shell="yes | head -n 1", timeout=10))
    assert piped.stdout == b"y\n" and piped.stderr == b"", piped.stderr  # yes died of SIGPIPE, silently
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "hello-from-path").write_text("#!/bin/sh\necho found via PATH\n")
    (bindir / "hello-from-path").chmod(0o755)
    found = await channel.exec(ExecRequest(argv=("hello-from-path",), env={"PATH": f"{bindir}:/usr/bin:/bin"}, timeout=10))
    assert found.stdout == b"found via PATH\n"
    here = await channel.exec(ExecRequest(argv=("pwd",), cwd=str(tmp_path), timeout=10))
    assert here.stdout.decode().strip() == str(tmp_path)
    fed = await channel.exec(ExecRequest(argv=("cat",), stdin=b"fed\n", timeout=10))
    assert fed.stdout == b"fed\n"
    leader = await channel.exec(ExecRequest(shell="ps -o pid=,sid= -p $$", timeout=10))
    pid, sid = leader.stdout.split()
    assert pid == sid
    assert (await channel.exec(ExecRequest(argv=("no-such-program-rls",), timeout=10))).exit_code == 127
    assert (await channel.exec(ExecRequest(argv=("true",), cwd=str(tmp_path / "missing"), timeout=10))).exit_code == 126
    assert (await channel.exec(ExecRequest(argv=("hello-from-path",), timeout=10))).exit_code == 127  # not on the agent's PATH


@pytest.mark.processes
async def test_agent_survives_its_daemon_vanishing_mid_output(tmp_path: Path) -> None:
    """A daemon SIGKILLed while a command streams: the agent's write fails (EPIPE), it drops the
    output, keeps running, and serves the next daemon."""
    path = tmp_path / "agent.sock"
    listener = await AgentListener.open(path)
    agent = subprocess.Popen([sys.executable, str(AGENT_PATH), "--connect", str(path)], stderr=subprocess.PIPE)
    try:
        first = await accept_agent(listener, "first", 10)
        await listener.close()
        endless = ExecRequest(shell="yes 0123456789abcdef", timeout=30, stdout_cap=1 << 30)
        streaming = asyncio.create_task(first.exec(endless))
        await asyncio.sleep(0.5)
        first._transport._writer.transport.abort()  # type: ignore[attr-defined]  # no FIN dance: like a kill
        with pytest.raises(SandboxDied):
            await streaming
        await first.close("gone")
        await asyncio.sleep(0.5)
        assert agent.poll() is None, agent.stderr.read().decode()[-2000:] if agent.stderr else ""
        listener = await AgentListener.open(path)
        second = await accept_agent(listener, "second", 10)
        await listener.close()
        assert (await second.exec(ExecRequest(argv=("echo", "still here"), timeout=10))).stdout == b"still here\n"
        await second.close("done")
    finally:
        agent.kill()
        agent.wait()
        if agent.stderr:
            agent.stderr.close()


async def test_impostors_on_the_agent_socket_are_refused(tmp_path: Path) -> None:
    """Programs in a sandbox can reach its socket: garbage, a reset and a silent connection come
    first, and the daemon still ends up talking to the real agent."""
    path = tmp_path / "agent.sock"
    listener = await AgentListener.open(path)
    _, garbage = await asyncio.open_unix_connection(str(path))
    garbage.write(b"\xff" * 64 + b"not the protocol\n")
    _, reset = await asyncio.open_unix_connection(str(path))
    reset.transport.abort()
    _, silent = await asyncio.open_unix_connection(str(path))
    agent = subprocess.Popen([sys.executable, str(AGENT_PATH), "--connect", str(path)])
    try:
        channel = await accept_agent(listener, "real", 15)
        await listener.close()
        assert channel.info.get("protocol") is not None
        assert (await channel.exec(ExecRequest(argv=("echo", "real"), timeout=10))).stdout == b"real\n"
        await channel.close("done")
    finally:
        garbage.close()
        silent.close()
        agent.kill()
        agent.wait()


@pytest.mark.processes
async def test_at_adoption_only_the_agents_own_process_may_answer(tmp_path: Path) -> None:
    """After a restart the sandbox's programs run while the daemon waits for its agent: one that
    speaks the protocol (here: another agent, dialling first) passed the handshake and would have
    answered for the agent. With the agent's PID given, only its connection is taken."""
    path = tmp_path / "agent.sock"
    listener = await AgentListener.open(path)
    impostor = subprocess.Popen([sys.executable, str(AGENT_PATH), "--connect", str(path)])
    await asyncio.sleep(0.5)  # connected, waiting for its handshake
    agent = subprocess.Popen([sys.executable, str(AGENT_PATH), "--connect", str(path)])
    try:
        channel = await accept_agent(listener, "adopted", 15, agent_pid=agent.pid)
        impostor.kill()  # it dials again and again: no connection left half-made at the close
        impostor.wait()
        await listener.close()
        assert channel.info["pid"] == agent.pid, (channel.info, agent.pid, impostor.pid)
        await channel.close("done")
    finally:
        for proc in (impostor, agent):
            proc.kill()
            proc.wait()


# -- a keyed stream: what a root process in a gVisor sandbox can do to the attach stream -------------
# It can open the agent's /proc/1/fd/0 and /proc/1/fd/1. Here the agent is a host process and the
# commands it runs open its /proc/<pid>/fd the same way.


async def _keyed() -> tuple[AgentChannel, SubprocessTransport]:
    transport = await SubprocessTransport.start()
    ch = AgentChannel(transport, name="keyed", keyed=True)
    await ch.start(timeout=10)
    return ch, transport


def _forger(fd: int, frames: bytes) -> ExecRequest:
    """A command that writes ``frames`` into the agent's own fd ``fd`` (its stdin or stdout)."""
    code = f"import os, sys; f = open('/proc/{{}}/fd/{fd}'.format(os.getppid()), 'wb', 0); f.write(bytes.fromhex(sys.argv[1]))"
    return ExecRequest(argv=(sys.executable, "-c", code, frames.hex()), timeout=10)


@pytest.mark.processes
async def test_forged_answers_on_a_keyed_stream_end_the_channel_as_tampered() -> None:
    """Forged RESULT frames (exit 0) for every request id a command could have: without the key
    none can carry a good tag, so the daemon takes none as an answer, and says why it stopped."""
    ch, _ = await _keyed()
    forged = b"".join(p.encode_frame(p.K_RESULT, rid, b'{"exit_code": 0}') for rid in range(1, 40))
    with pytest.raises(SandboxDied, match="tampered with from inside the sandbox"):
        await ch.exec(_forger(1, forged))
    assert ch.tampered is not None and "forged or cut header" in ch.tampered
    await ch.close()


@pytest.mark.processes
async def test_a_request_written_into_a_keyed_stream_stops_the_agent_as_tampered() -> None:
    """A forged request in the agent's stdin: the agent stops, tells the daemon (a tagged frame),
    and exits with EXIT_TAMPERED, which the container's exit status would keep."""
    ch, transport = await _keyed()
    injected = p.encode_frame(p.K_EXEC, 7, b'{"argv": ["true"]}')
    with pytest.raises(SandboxDied):
        await ch.exec(_forger(0, injected))
    assert ch.tampered is not None and "input stream was tampered with" in ch.tampered
    assert await asyncio.wait_for(transport.proc.wait(), 5) == p.EXIT_TAMPERED
    await ch.close()


@pytest.mark.processes
async def test_a_request_read_away_from_a_keyed_stream_shows_as_tampering(tmp_path: Path) -> None:
    """A background process reads the agent's stdin, so a request never reaches the agent. The
    caller's deadline passes; the probe that follows breaks the agent's numbering, and the channel
    ends as tampered with instead of a plain timeout (which a grader would count as the node's)."""
    ch, transport = await _keyed()
    stolen = tmp_path / "stolen"
    thief = (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    f = open('/proc/{{}}/fd/0'.format(int(sys.argv[1])), 'rb', 0)\n"
        f"    open({str(stolen)!r}, 'wb').write(f.read(65536))\n"
    )
    agent_pid = str(transport.proc.pid)
    assert (await ch.exec(ExecRequest(argv=(sys.executable, "-c", thief, agent_pid), timeout=10))).exit_code == 0
    outcomes = []
    for _ in range(100):  # until the thief, once blocked in its read, wins a request
        try:
            await ch.stat(["/"], timeout=1.0)
            outcomes.append("answered")
        except SandboxDied:
            outcomes.append("died")
            break
        await asyncio.sleep(0.05)
    assert stolen.exists() and stolen.stat().st_size > 0, outcomes
    assert outcomes[-1] == "died", outcomes
    assert ch.tampered is not None or await asyncio.wait_for(transport.proc.wait(), 5) == p.EXIT_TAMPERED
    await ch.close()


def test_a_leftovers_name_is_its_command_line_without_control_characters() -> None:
    """What the agent names when it ends a clean room's leftovers: the episode chose those command
    lines, so no newline or terminal escape reaches a grade's message, and a long one is cut."""
    from rlsandbox.daemon.agent import sandbox_agent

    weird = "\x1b[31mred\nsecond line\x07" + "x" * 500
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", weird])
    try:
        deadline = time.monotonic() + 10
        while "second line" not in sandbox_agent._cmdline(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # until the child has exec'd
        name = sandbox_agent._cmdline(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert name.startswith(f"{sys.executable} -c import time; time.sleep(30)  [31mred second line ")
    assert name.isprintable() and len(name) == sandbox_agent.LEFTOVER_NAME_CHARS and name.endswith("...")
    assert sandbox_agent._cmdline(proc.pid) == ""  # gone (reaped)
