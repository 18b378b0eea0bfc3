"""The daemon as a real process: systemd notifications, SIGTERM grace, a second signal forcing
exit, the unix-socket listener, and nothing left behind either way."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from helpers import TEST_OWNER, daemon_config
from rlsandbox.client import AsyncClient, UnavailableError
from rlsandbox.daemon.agent import AGENT_PATH
from rlsandbox.daemon.errors import FailedPrecondition
from rlsandbox.daemon.runtime.docker import LABEL_OWNER, DockerRuntime
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

CONFIG = """
node_id = "{node}"
listen_tcp = ""
listen_unix = "{sock}"
session_journal = "{sock}.journal"
shutdown_grace = 60.0
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = 1
max_total = 4
"""


async def _receive(sock: socket.socket, want: str, timeout: float) -> list[str]:
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got += sock.recv(4096).decode().split("\n")
        except BlockingIOError:
            await asyncio.sleep(0.05)
            continue
        if want in got:
            return got
    raise AssertionError(f"no {want} from the daemon within {timeout} s (got {got})")


async def test_sigterm_waits_for_in_flight_calls_and_a_second_signal_forces_exit(
    tmp_path: Path, docker_runtime: DockerRuntime, images: object
) -> None:
    node = f"{TEST_OWNER}-proc"
    sock_path = tmp_path / "daemon.sock"
    config = tmp_path / "daemon.toml"
    config.write_text(CONFIG.format(node=node, sock=sock_path))
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.setblocking(False)
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "2000000"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "rlsandbox.daemon.cli",
        "daemon",
        "--config",
        str(config),
        env=env,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await _receive(notify, "READY=1", 60)
        await _receive(notify, "WATCHDOG=1", 5)
        async with AsyncClient(f"unix:{sock_path}", timeout=120) as client:
            session = await client.create_session("python")
            assert (await session.exec("echo over-unix")).stdout == b"over-unix\n"
            long_call = asyncio.create_task(session.exec("sleep 50; echo done"))
            await asyncio.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            await _receive(notify, "STOPPING=1", 10)
            await asyncio.sleep(1.0)
            assert proc.returncode is None, "the daemon did not wait for the in-flight call"
            with pytest.raises(UnavailableError):
                await client.create_session("python")
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
            assert time.monotonic() - started < 20, "the second signal did not cut the grace short"
            with pytest.raises(Exception):  # noqa: B017 - cut off by the forced stop: any status
                await long_call
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        notify.close()
    assert not sock_path.exists(), "the unix socket was left behind"
    assert await docker_runtime.list_containers({LABEL_OWNER: node}) == []


async def test_unix_socket_listener_in_process(tmp_path: Path, images: object) -> None:
    sock_path = tmp_path / "d.sock"
    daemon = NodeDaemon(daemon_config(node_id=f"{TEST_OWNER}-unix", listen_tcp=None, listen_unix=str(sock_path)))
    await daemon.start()
    try:
        assert daemon.address == f"unix:{sock_path}"
        async with AsyncClient(daemon.address) as client:
            status = await client.node_status()
            assert status.serving and {p.name for p in status.pools} == {"python", "busybox"}
    finally:
        await daemon.stop()
    assert not sock_path.exists()


async def test_the_agent_is_bound_from_agent_host_dir(tmp_path: Path, images: object) -> None:
    """A daemon in a container (a Kubernetes DaemonSet) binds its agent from a folder the engine
    sees too: a digest-named copy, unchanged by a restart, serving real sandboxes."""
    folder = tmp_path / "agent"
    config = daemon_config(node_id=f"{TEST_OWNER}-agentdir", agent_host_dir=str(folder))
    for _ in range(2):  # the second start finds its copy there
        daemon = NodeDaemon(config)
        await daemon.start()
        try:
            async with AsyncClient(daemon.address) as client, client.session("python") as s:
                assert (await s.exec("cat /.rlsandbox/agent.py | sha256sum")).stdout_text.split()[0] == hashlib.sha256(
                    AGENT_PATH.read_bytes()
                ).hexdigest()
                info = await daemon.runtime.inspect(daemon.sessions.get(s.id).sandbox.container_id)  # type: ignore[union-attr]
                [source] = [m["Source"] for m in info["Mounts"] if m["Destination"] == "/.rlsandbox/agent.py"]
                assert Path(source).parent == folder and source.startswith(str(folder) + "/sandbox_agent-")
        finally:
            await daemon.stop()
    assert [p.name for p in folder.iterdir()] == [Path(source).name]
    broken = daemon_config(node_id=f"{TEST_OWNER}-agentdir2", agent_host_dir="/proc/no/such/place")
    daemon = NodeDaemon(broken)
    with pytest.raises(FailedPrecondition, match="agent_host_dir"):
        await daemon.start()
