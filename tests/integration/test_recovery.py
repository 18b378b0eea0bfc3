"""Crash recovery: a daemon killed with SIGKILL and started again re-adopts its live sessions."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from helpers import TEST_OWNER
from rlsandbox.client import AsyncClient, NotFoundError, SandboxRPCError
from rlsandbox.daemon.events.aggregator import Aggregator
from rlsandbox.daemon.events.nats_server import NatsServer
from rlsandbox.daemon.runtime.docker import LABEL_OWNER, LABEL_POOL, DockerRuntime

pytestmark = pytest.mark.docker

CONFIG = """
node_id = "{node}"
listen_tcp = ""
listen_unix = "{sock}"
session_journal = "{journal}"
nats_url = "{nats}"
events_outbox = "{outbox}"
shutdown_grace = 10.0
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = 1
max_total = 8
[[pools]]
name = "busybox"
image = "rlsandbox/busybox:latest"
min_ready = 1
max_total = 8
memory_mb = 64
"""


@asynccontextmanager
async def daemon_process(config: Path, notify_path: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """``rlsandbox daemon`` as a child process, yielded once it told systemd's socket READY=1."""
    notify_path.unlink(missing_ok=True)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    notify.settimeout(0.1)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlsandbox.daemon.cli", "daemon", "--config", str(config),
        env={**os.environ, "NOTIFY_SOCKET": str(notify_path)}, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while True:
            assert time.monotonic() < deadline, "the daemon did not become ready"
            assert proc.returncode is None, f"the daemon exited with {proc.returncode}"
            try:
                if b"READY=1" in notify.recv(4096):
                    break
            except TimeoutError:
                await asyncio.sleep(0.05)
        yield proc
    finally:
        notify.close()
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), 60)


async def _container_of(session: object) -> str:
    return (await session.exec("cat /etc/hostname")).stdout.decode().strip()  # type: ignore[attr-defined]


@pytest.fixture
async def aggregator(tmp_path: Path) -> AsyncIterator[tuple[str, Aggregator]]:
    server = NatsServer(tmp_path / "jetstream")
    await server.start()
    agg = Aggregator(server.url, tmp_path / "agg.sqlite3")
    task = asyncio.create_task(agg.run())
    try:
        await asyncio.wait_for(agg.started.wait(), 30)
        yield server.url, agg
    finally:
        agg.stop()
        await asyncio.wait_for(task, 30)
        await server.stop()


async def test_sigkilled_daemon_restarts_and_readopts_its_sessions(
    tmp_path: Path, docker_runtime: DockerRuntime, images: object, aggregator: tuple[str, Aggregator]
) -> None:
    node = f"{TEST_OWNER}-crash"
    sock = tmp_path / "daemon.sock"
    config = tmp_path / "daemon.toml"
    nats_url, agg = aggregator
    config.write_text(
        CONFIG.format(node=node, sock=sock, journal=tmp_path / "sessions.sqlite3", nats=nats_url, outbox=tmp_path / "outbox")
    )
    notify = tmp_path / "notify"

    async with daemon_process(config, notify) as first, AsyncClient(f"unix:{sock}", timeout=60) as client:
        py = await client.create_session("python", labels={"run": "crash"}, env={"FROM_SESSION": "kept"})
        await py.write_files({"/workspace/state.txt": "before the crash"})
        assert (await py.exec("export COUNTER=41", shell_session="main")).exit_code == 0
        assert (await py.exec("nohup sleep 300 >/dev/null 2>&1 &")).exit_code == 0
        box = await client.create_session("busybox")
        assert (await box.exec("echo kept > /tmp/box.txt")).exit_code == 0
        doomed = await client.create_session("python")
        doomed_container = await _container_of(doomed)
        py_container = await _container_of(py)
        in_flight = asyncio.create_task(py.exec("sleep 77"))
        await asyncio.sleep(0.5)
        before = {c.name for c in await docker_runtime.list_containers({LABEL_OWNER: node})}

        first.send_signal(signal.SIGKILL)
        await first.wait()
        with pytest.raises(SandboxRPCError):
            await in_flight
        # While no daemon runs, one sandbox dies.
        await docker_runtime.docker.containers.container(doomed_container).kill()

    async with daemon_process(config, notify), AsyncClient(f"unix:{sock}", timeout=60) as client:
        # The same session ids work again, with their files, shells, processes and env.
        assert (await client.exec(py.id, "cat /workspace/state.txt")).stdout == b"before the crash"
        assert (await client.exec(py.id, "echo $COUNTER", shell_session="main")).stdout == b"41\n"
        assert (await client.exec(py.id, "echo $FROM_SESSION")).stdout == b"kept\n"
        procs = (await client.exec(py.id, "ps -eo args")).stdout.decode().splitlines()
        assert "sleep 300" in procs, "a background process did not survive the daemon's crash"
        assert "sleep 77" not in procs, "the command in flight at the crash was not cancelled"
        assert (await client.exec(py.id, "cat /etc/hostname")).stdout.decode().strip() == py_container
        assert (await client.exec(box.id, "cat /tmp/box.txt")).stdout == b"kept\n"
        info = await client.get_session(py.id)
        assert info.state == "ready" and info.labels["run"] == "crash"

        # The sandbox that died meanwhile ended the session, and says so.
        with pytest.raises(NotFoundError, match="lost when the daemon restarted"):
            await client.exec(doomed.id, "true")

        # No orphans: the old warm sandboxes and the dead one are gone; the pools refilled.
        deadline = time.monotonic() + 60
        while True:
            owned = await docker_runtime.list_containers({LABEL_OWNER: node})
            names = {c.name for c in owned}
            pools = {p.name: p for p in (await client.node_status()).pools}
            if all(pools[n].ready >= 1 for n in ("python", "busybox")) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert pools["python"].in_use == 1 and pools["busybox"].in_use == 1
        assert all(pools[n].ready >= 1 for n in ("python", "busybox")), "the pools did not refill"
        survivors = names & before
        assert len(survivors) == 2, f"only the two adopted sandboxes may be left of the first run: {survivors}"
        assert all(c.state == "running" for c in owned)
        assert {c.labels[LABEL_POOL] for c in owned if c.name in survivors} == {"python", "busybox"}

        assert await client.close_session(py.id)
        assert await client.close_session(box.id)
    assert await docker_runtime.list_containers({LABEL_OWNER: node}) == []

    # The events tell the story: the adopted session goes on above its reserved block, the lost
    # one ends with a `failed` event saying why, and nothing counts as a gap or a duplicate.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        timeline = agg.store.timeline(py.id)
        if timeline and timeline[-1]["type"] == "closed" and agg.store.timeline(doomed.id)[-1:]:
            break
        await asyncio.sleep(0.2)
    types = [e["type"] for e in timeline]
    assert types[0] == "created" and types[-1] == "closed" and types.count("adopted") == 1, types
    adopted = timeline[types.index("adopted")]
    assert adopted["seq"] == adopted["data"]["unused_seq_window"][1] + 1
    lost = agg.store.timeline(doomed.id)[-1]
    assert lost["type"] == "failed" and "lost when the daemon restarted" in lost["data"]["reason"]
    integrity = agg.store.integrity()
    assert integrity["missing_events"] == 0 and integrity["duplicates"] == 0, integrity
