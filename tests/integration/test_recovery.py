"""Recovery: a daemon killed with SIGKILL and started again re-adopts its live sessions; a Docker
engine restarted under load makes calls fail fast, and the daemon recovers by itself."""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import BUSYBOX, TEST_OWNER, daemon_config, running_daemon
from rlsandbox.client import AsyncClient, NotFoundError, SandboxRPCError
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.errors import SandboxError
from rlsandbox.daemon.events.aggregator import Aggregator
from rlsandbox.daemon.events.nats_server import NatsServer
from rlsandbox.daemon.runtime.docker import LABEL_OWNER, LABEL_POOL, DockerRuntime
from rlsandbox.daemon.server import NodeDaemon

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


IMPOSTOR = """
import socket, struct, threading, time
held = []

def speak(s):  # a fake agent: every request answered, exit 0 and nothing printed
    buf = b""
    meta = b'{"protocol": 1, "agent_version": "1.0", "pid": 1, "exit_code": 0, "signal": null}'
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return
            buf += data
            while len(buf) >= 16:
                _, _, _, rid, ml, bl = struct.unpack(">2sBBIII", buf[:16])
                if len(buf) < 16 + ml + bl:
                    break
                buf = buf[16 + ml + bl:]
                s.sendall(struct.pack(">2sBBIII", b"RX", 1, 18, rid, len(meta), 0) + meta)
    except OSError:
        pass

while True:
    for mode in ("garbage", "reset", "hold", "speak"):
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect("/.rlsandbox/sock/agent.sock")
            if mode == "garbage":
                s.sendall(b"\\xff" * 64)
            elif mode == "reset":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
            elif mode == "speak":
                threading.Thread(target=speak, args=(s,), daemon=True).start()
            else:
                held.append(s)
                del held[:-200]
        except (OSError, RuntimeError):
            pass
    time.sleep(0.005)
"""


async def _container_of(session: object) -> str:
    return (await session.exec("cat /etc/hostname")).stdout.decode().strip()  # type: ignore[attr-defined]


@pytest.fixture
async def aggregator(tmp_path: Path) -> AsyncIterator[tuple[NatsServer, Aggregator]]:
    server = NatsServer(tmp_path / "jetstream")
    await server.start()
    agg = Aggregator(server.url, tmp_path / "agg.sqlite3")
    task = asyncio.create_task(agg.run())
    try:
        await asyncio.wait_for(agg.started.wait(), 30)
        yield server, agg
    finally:
        agg.stop()
        await asyncio.wait_for(task, 30)
        await server.stop()


@pytest.mark.slow
async def test_sigkilled_daemon_restarts_and_readopts_its_sessions(
    tmp_path: Path, docker_runtime: DockerRuntime, images: object, aggregator: tuple[NatsServer, Aggregator]
) -> None:
    node = f"{TEST_OWNER}-crash"
    sock = tmp_path / "daemon.sock"
    config = tmp_path / "daemon.toml"
    nats, agg = aggregator
    nats_url = nats.url
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
        # A sandbox that attacks its agent socket: garbage, resets, held connections and a fake
        # agent that answers every request (exit 0, nothing printed), forever.
        hostile = await client.create_session("python")
        flood = await hostile.exec(f"nohup python3 -c {shlex.quote(IMPOSTOR)} >/dev/null 2>&1 &")
        assert flood.exit_code == 0
        py_container = await _container_of(py)
        in_flight = asyncio.create_task(py.exec("sleep 77"))
        await asyncio.sleep(0.5)
        # NATS stalls; a session is handed out all the same (CreateSession does not wait for
        # JetStream), so its `created` event is in the daemon's memory only when it dies.
        assert nats.process is not None
        nats.process.send_signal(signal.SIGSTOP)
        try:
            late = await client.create_session("busybox", labels={"run": "crash"})
            before = {c.name for c in await docker_runtime.list_containers({LABEL_OWNER: node})}
            first.send_signal(signal.SIGKILL)
            await first.wait()
        finally:
            nats.process.send_signal(signal.SIGCONT)
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
        assert (await client.exec(late.id, "echo late")).stdout == b"late\n"
        # The hostile sandbox did not stop the node from starting; its own agent still won (the
        # fake one would have answered with nothing printed).
        assert (await client.exec(hostile.id, "echo adopted")).stdout == b"adopted\n"
        assert await client.close_session(hostile.id)
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
            # Closed sessions' containers (the hostile one's) are removed behind the answer: wait for them too.
            settled = len(names & before) <= 3 and all(pools[n].ready >= 1 for n in ("python", "busybox"))
            if settled or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        assert pools["python"].in_use == 1 and pools["busybox"].in_use == 2
        assert all(pools[n].ready >= 1 for n in ("python", "busybox")), "the pools did not refill"
        survivors = names & before
        assert len(survivors) == 3, f"only the three adopted sandboxes may be left of the first run: {survivors}"
        assert all(c.state == "running" for c in owned)
        assert {c.labels[LABEL_POOL] for c in owned if c.name in survivors} == {"python", "busybox"}

        assert await client.close_session(py.id)
        assert await client.close_session(box.id)
        assert await client.close_session(late.id)
    assert await docker_runtime.list_containers({LABEL_OWNER: node}) == []

    # The events tell the story: the adopted session goes on above its reserved block, the lost
    # one ends with a `failed` event saying why, and nothing counts as a gap or a duplicate.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        timeline = agg.store.timeline(py.id)
        late_closed = [e["type"] for e in agg.store.timeline(late.id)[-1:]] == ["closed"]
        if timeline and timeline[-1]["type"] == "closed" and agg.store.timeline(doomed.id)[-1:] and late_closed:
            break
        await asyncio.sleep(0.2)
    types = [e["type"] for e in timeline]
    assert types[0] == "created" and types[-1] == "closed" and types.count("adopted") == 1, types
    adopted = timeline[types.index("adopted")]
    assert adopted["seq"] == adopted["data"]["unused_seq_window"][1] + 1
    # Every answered step counted across the crash: 3 before it (the one cut by it is not), 5 after.
    assert timeline[-1]["data"]["steps"] == 8 == types.count("step"), timeline[-1]["data"]
    # The session answered while NATS stalled: its `created` event, published again from the
    # journal by the next life, comes first.
    late_timeline = agg.store.timeline(late.id)
    late_types = [(e["type"], e["seq"]) for e in late_timeline]
    assert late_types[:2] == [("created", 1), ("adopted", late_timeline[1]["seq"])], late_types
    assert late_timeline[0]["data"]["container"] == late_timeline[1]["data"]["container"]
    assert late_types[-1][0] == "closed", late_types
    lost = agg.store.timeline(doomed.id)[-1]
    assert lost["type"] == "failed" and "lost when the daemon restarted" in lost["data"]["reason"]
    integrity = agg.store.integrity()
    assert integrity["missing_events"] == 0 and integrity["duplicates"] == 0, integrity


class Engine:
    """A Docker engine of the test's own (its own socket, data and exec roots, network namespace),
    so that restarting it hits nothing but the daemon under test. Started and stopped by its PID.
    (Without a network namespace of its own, a second dockerd deletes the host's docker0 bridge.)"""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = root / "docker.sock"
        self.proc: asyncio.subprocess.Process | None = None
        (root / "daemon.json").write_text("{}")

    async def start(self) -> None:
        with (self.root / "dockerd.log").open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                "unshare", "--net", "dockerd", "--host", f"unix://{self.socket}", "--data-root", str(self.root / "data"),
                "--exec-root", str(self.root / "exec"), "--pidfile", str(self.root / "docker.pid"),
                "--config-file", str(self.root / "daemon.json"), "--bridge", "none", "--iptables=false",
                stdout=asyncio.subprocess.DEVNULL, stderr=log,
            )  # fmt: skip
        deadline = time.monotonic() + 60
        async with DockerRuntime(owner="engine-probe", socket_path=str(self.socket)) as probe:
            while True:
                try:
                    await probe.ping(timeout=2)
                    return
                except SandboxError:
                    assert time.monotonic() < deadline and self.proc.returncode is None, "the test's dockerd did not start"
                    await asyncio.sleep(0.2)

    async def stop(self) -> None:
        """SIGTERM, as `systemctl restart docker` does; it stops its containers on the way out."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            await asyncio.wait_for(self.proc.wait(), 60)


@pytest.fixture
async def engine(tmp_path: Path, images: object) -> AsyncIterator[Engine]:
    root = Path(tempfile.mkdtemp(prefix="rls-engine-", dir="/var/tmp"))
    host_bridge = Path("/sys/class/net/docker0").exists()
    engine = Engine(root)
    await engine.start()
    try:
        # The busybox image, from the main engine (docker save | docker load; 2 MB).
        save = await asyncio.create_subprocess_shell(
            f"docker save {BUSYBOX} | docker -H unix://{engine.socket} load -q", stdout=asyncio.subprocess.DEVNULL
        )
        assert await save.wait() == 0
        yield engine
    finally:
        await engine.stop()
        # Containers an aborted test may have left, then the engine's files (its own, by path).
        subprocess.run(["umount", "-R", str(root / "exec")], stderr=subprocess.DEVNULL, check=False)
        shutil.rmtree(root, ignore_errors=True)
    assert Path("/sys/class/net/docker0").exists() == host_bridge, "the test's dockerd touched the host's docker0"


@pytest.mark.slow
async def test_docker_engine_restart_mid_load_fails_fast_and_recovers(engine: Engine) -> None:
    node_id = f"{TEST_OWNER}-engine"
    config = daemon_config(
        node_id=node_id,
        docker_socket=str(engine.socket),
        pools=[PoolConfig(name="busybox", image=BUSYBOX, min_ready=4, max_total=32, memory_mb=64)],
    )
    unexpected: list[str] = []
    outcomes: list[tuple[str, float]] = []  # (status, seconds) of every call made during the outage
    stop_load = asyncio.Event()

    async def load(client: AsyncClient, session_id: str) -> None:
        while not stop_load.is_set():
            started = time.monotonic()
            try:
                await client.exec(session_id, "true", timeout=30)
                status = "OK"
            except SandboxRPCError as e:
                status = e.code.name
                if status not in ("UNAVAILABLE", "ABORTED", "NOT_FOUND"):
                    unexpected.append(str(e))
            outcomes.append((status, time.monotonic() - started))
            await asyncio.sleep(0.01)

    async with running_daemon(config) as node, AsyncClient(node.address, timeout=30) as client:
        sessions = [await client.create_session("busybox") for _ in range(4)]
        workers = [asyncio.create_task(load(client, s.id)) for s in sessions]
        await asyncio.sleep(1.0)
        assert outcomes and all(status == "OK" for status, _ in outcomes)

        outcomes.clear()
        await engine.stop()
        down_at = time.monotonic()
        # Health follows the engine: NOT_SERVING within a few failed pings.
        while node.docker_ok:
            assert time.monotonic() - down_at < 30, "health did not notice the engine was gone"
            await asyncio.sleep(0.2)
        assert await _health(node) == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(SandboxRPCError) as refused:
            await client.create_session("busybox", acquire_timeout=2)
        assert refused.value.code.name == "UNAVAILABLE" and "Docker engine" in str(refused.value)
        await asyncio.sleep(2.0)

        await engine.start()
        stop_load.set()
        await asyncio.gather(*workers)
        # Every call during the outage failed fast with a retryable status; none hung.
        statuses = {status for status, _ in outcomes}
        assert statuses <= {"OK", "UNAVAILABLE", "ABORTED", "NOT_FOUND"}, unexpected[:3]
        assert "UNAVAILABLE" in statuses or "ABORTED" in statuses
        assert max(seconds for _, seconds in outcomes) < 10, "a call hung while the engine was down"

        # Recovery by itself: health SERVING again, new sessions work, the dead ones say why.
        deadline = time.monotonic() + 90
        while not (node.docker_ok and await _health(node) == health_pb2.HealthCheckResponse.SERVING):
            assert time.monotonic() < deadline, "health did not come back"
            await asyncio.sleep(0.2)
        while True:
            try:
                fresh = await client.create_session("busybox", acquire_timeout=10)
                break
            except SandboxRPCError:
                assert time.monotonic() < deadline, "no new session after the engine came back"
        assert (await fresh.exec("echo back")).stdout == b"back\n"
        for s in sessions:
            with pytest.raises((NotFoundError, SandboxRPCError)):
                await client.exec(s.id, "true")
                raise AssertionError(f"session {s.id} outlived its sandbox")
    async with DockerRuntime(owner="check", socket_path=str(engine.socket)) as runtime:
        assert await runtime.list_containers({LABEL_OWNER: node_id}) == []


async def _health(node: NodeDaemon) -> int:
    async with grpc.aio.insecure_channel(node.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        return int(reply.status)


async def test_a_failed_start_undoes_itself_and_keeps_what_an_earlier_life_left(
    tmp_path: Path, docker_runtime: DockerRuntime, images: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start-up is all or nothing: a port in use (before recovery) and a fault after recovery
    both leave no listener, task or open journal behind, and never destroy a session an earlier
    life left; the next good start re-adopts it with its files."""
    node = f"{TEST_OWNER}-startfail"
    sock = tmp_path / "daemon.sock"
    config = tmp_path / "daemon.toml"
    journal = tmp_path / "sessions.sqlite3"
    config.write_text(
        CONFIG.format(node=node, sock=sock, journal=journal, nats="", outbox=tmp_path / "outbox").replace('nats_url = ""\n', "")
    )
    async with daemon_process(config, tmp_path / "notify") as first, AsyncClient(f"unix:{sock}", timeout=60) as client:
        s = await client.create_session("busybox")
        await s.write_files({"/tmp/kept.txt": "from the first life"})
        container = (await s.exec("cat /etc/hostname")).stdout.decode().strip()
        first.send_signal(signal.SIGKILL)
        await first.wait()

    def config_with(**kw: object) -> object:
        pools = [PoolConfig(name="busybox", image=BUSYBOX, min_ready=0, max_total=8, memory_mb=64)]
        return daemon_config(node_id=node, session_journal=str(journal), pools=pools, **kw)

    async def running(hostname: str) -> bool:
        owned = await docker_runtime.list_containers({LABEL_OWNER: node})
        return any(c.id.startswith(hostname) and c.state == "running" for c in owned)

    # 1. The port is taken: the start fails before it adopts anything.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        d = NodeDaemon(config_with(listen_tcp=f"127.0.0.1:{port}"))  # type: ignore[arg-type]
        with pytest.raises(SandboxError, match=f"cannot listen on 127.0.0.1:{port}"):
            await d.start()
    assert d.background.names == [] and d.journal is not None and d.journal._db is None and d.runtime._docker is None
    assert await running(container)

    # 2. A fault after recovery (simulated: the sweep fails): the adopted session is let go, not ended.
    d = NodeDaemon(config_with())  # type: ignore[arg-type]

    async def broken_sweep(grace: float = 0) -> list[str]:
        raise OSError("simulated fault after recovery")

    monkeypatch.setattr(d.reconciler, "sweep", broken_sweep)
    with pytest.raises(OSError, match="simulated fault"):
        await d.start()
    assert d.sessions.adopted_total == 1 and not d.sessions.sessions and d.background.names == []
    assert await running(container)

    # 3. A good start re-adopts it, files intact.
    async with running_daemon(config_with()) as good, AsyncClient(good.address, timeout=60) as client:
        assert (await client.exec(s.id, "cat /tmp/kept.txt")).stdout == b"from the first life"
        assert await client.close_session(s.id)
    assert not await running(container)
