"""The gRPC API end to end: a real daemon on a real port, the real client, real containers."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers import daemon_config
from rlsandbox.client import (
    AsyncClient,
    BatchCommand,
    Client,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from rlsandbox.client._requests import exec_request
from rlsandbox.daemon.runtime.docker import EXEC_CONCURRENCY, LABEL_OWNER
from rlsandbox.daemon.server import NodeDaemon
from rlsandbox.v1 import sandbox_pb2 as pb
from rlsandbox.v1 import sandbox_pb2_grpc

pytestmark = pytest.mark.docker


async def test_full_episode(client: AsyncClient) -> None:
    async with client.session(pool="python", labels={"run": "r1", "task": "t1"}) as s:
        assert s.info.mode == "agent" and s.info.workdir == "/workspace"
        await s.write_files(
            {
                "pkg/m.py": "def f():\n    return 41\n",
                "test_m.py": "from pkg.m import f\n\ndef test_f():\n    assert f() == 42\n",
            }
        )
        failing = await s.exec("python3 -m pytest -q")
        assert failing.exit_code == 1 and b"1 failed" in failing.stdout
        await s.write_files({"pkg/m.py": "def f():\n    return 42\n"})
        passing = await s.exec(["python3", "-m", "pytest", "-q"])
        assert passing.ok and b"1 passed" in passing.stdout
        files = await s.read_files(["pkg/m.py", "nope.txt"])
        assert files["pkg/m.py"].data == b"def f():\n    return 42\n" and files["nope.txt"].error
        listed = await client.list_sessions(labels={"run": "r1"})
        assert [x.session_id for x in listed] == [s.id]
        info = await s.refresh()
        assert info.steps == 2 and info.state == "ready"
    with pytest.raises(NotFoundError, match=r"ended .* closed by client"):
        await client.exec(s.id, "true")


async def test_exec_stream_delivers_output_while_running(client: AsyncClient) -> None:
    async with client.session(pool="python") as s:
        started = time.monotonic()
        events = []
        async for kind, value in s.exec_stream("echo one; sleep 1; echo two >&2; echo three"):
            events.append((time.monotonic() - started, kind, value))
        assert events[0][1:] == ("stdout", b"one\n") and events[0][0] < 0.8
        assert ("stderr", b"two\n") in [e[1:] for e in events]
        assert events[-1][1] == "result" and events[-1][2].exit_code == 0 and events[-1][0] >= 1.0


async def test_retried_step_does_not_run_twice(client: AsyncClient) -> None:
    async with client.session(pool="python") as s:
        first = await s.exec("echo x >> /tmp/count; wc -l < /tmp/count", seq=7)
        again = await s.exec("echo x >> /tmp/count; wc -l < /tmp/count", seq=7)
        assert first.stdout == again.stdout == b"1\n" and again.replayed and not first.replayed
        both = await asyncio.gather(*(s.exec("echo y >> /tmp/c2; wc -l < /tmp/c2", seq=8) for _ in range(5)))
        assert {r.stdout for r in both} == {b"1\n"}
        assert (await s.exec("wc -l < /tmp/count")).stdout == b"1\n"
        # The same seq with another command is a mistake of the caller, never a silent replay.
        with pytest.raises(FailedPreconditionError, match=r"seq 7 .* already ran a different command"):
            await s.exec("rm -rf /tmp/count", seq=7)
        assert (await s.exec("wc -l < /tmp/count")).stdout == b"1\n"


async def test_exec_batch_isolates_failures(client: AsyncClient) -> None:
    a = await client.create_session("busybox")
    b = await client.create_session("busybox")
    try:
        results = await client.exec_batch(
            [
                BatchCommand(a.id, ["echo", "a"]),
                BatchCommand("no-such-session", ["echo", "x"]),
                BatchCommand(b.id, "echo b; exit 3", {"timeout": 5}),
                BatchCommand(a.id, []),
            ]
        )
        assert results[0].stdout == b"a\n"  # type: ignore[union-attr]
        assert isinstance(results[1], NotFoundError)
        assert results[2].exit_code == 3  # type: ignore[union-attr]
        assert isinstance(results[3], InvalidArgumentError)
    finally:
        await a.close()
        await b.close()


async def test_five_hundred_concurrent_sessions(client: AsyncClient, daemon: NodeDaemon) -> None:
    async def episode(i: int) -> bytes:
        async with client.session(pool="busybox", labels={"run": "load"}, acquire_timeout=240) as s:
            await s.write_files({f"/tmp/in{i}.txt": f"{i}\n"})
            r1 = await s.exec(["cat", f"/tmp/in{i}.txt"])
            r2 = await s.exec(f"echo $(( {i} * 2 ))")
            r3 = await s.exec("ls /nonexistent")
            assert r3.exit_code != 0 and r3.stderr
            return r1.stdout + r2.stdout

    client.timeout = 300
    outputs = await asyncio.gather(*(episode(i) for i in range(500)))
    assert outputs == [f"{i}\n{i * 2}\n".encode() for i in range(500)]
    assert await client.list_sessions(labels={"run": "load"}) == []
    status = await client.node_status()
    busy = next(p for p in status.pools if p.name == "busybox")
    assert busy.in_use == 0 and busy.failed_total == 0


async def test_bad_inputs_get_precise_statuses(client: AsyncClient, daemon: NodeDaemon) -> None:
    with pytest.raises(NotFoundError, match=r"unknown pool 'gpu'.*python"):
        await client.create_session("gpu")
    with pytest.raises(InvalidArgumentError, match="pool or image is required"):
        await client.create_session("")
    with pytest.raises(NotFoundError, match="not found"):
        await client.exec("missing-session", "true")
    async with client.session(pool="busybox") as s:
        cases = [
            ({"command": []}, "argv is empty"),
            ({"command": "   "}, "shell command is empty"),
            ({"command": "true", "timeout": -1}, "positive number"),
            ({"command": "true", "timeout": 10**9}, "over this node's limit"),
            ({"command": "true", "stdout_cap": 1 << 40}, "stdout_cap"),
            ({"command": "true", "cwd": "/proc/1"}, "outside what sandboxes may change"),
            ({"command": ["ls"], "shell_session": "main"}, "use shell, not argv"),
            ({"command": "true", "shell_session": "bad name!"}, "shell_session"),
            ({"command": "true", "env": {"A=B": "x"}}, "environment"),
        ]
        for options, message in cases:
            command = options.pop("command")
            with pytest.raises(InvalidArgumentError, match=message):
                await s.exec(command, **options)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentError, match="no files"):
            await s.write_files({})
        with pytest.raises(InvalidArgumentError, match="mode"):
            await s.write_files({"/tmp/x": (b"", 0o77777)})
        with pytest.raises(InvalidArgumentError, match="over this node's limit"):
            await s.read_files(["/tmp/x"], max_bytes=1 << 40)
        with pytest.raises(FailedPreconditionError, match="python3"):
            await s.exec("pwd", shell_session="main")
        assert (await s.exec("echo still fine")).stdout == b"still fine\n"
    async with grpc.aio.insecure_channel(daemon.address) as channel:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Exec(pb.ExecRequest(session_id="x"))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.CloseSession(pb.CloseSessionRequest())
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (await client.node_status()).serving


async def test_health_and_reflection_answer(daemon: NodeDaemon) -> None:
    async with grpc.aio.insecure_channel(daemon.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "rlsandbox.v1.SandboxService"):
            reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = set()
        async for response in responses:
            names |= {s.name for s in response.list_services_response.service}
        assert {"rlsandbox.v1.SandboxService", "grpc.health.v1.Health"} <= names


async def test_sync_client(daemon: NodeDaemon) -> None:
    def episode() -> tuple[bytes, bytes]:
        with Client(daemon.address) as client, client.session(pool="python") as s:
            s.write_files({"a.bin": b"\x00\x01"})
            return s.exec("echo sync").stdout, s.read_files(["a.bin"])["a.bin"].data

    # A blocking client belongs in a thread when an event loop (here: the daemon's) runs.
    assert await asyncio.to_thread(episode) == (b"sync\n", b"\x00\x01")


async def test_idle_reaping_and_graceful_shutdown_leave_nothing(docker_runtime: object, images: object) -> None:
    node = NodeDaemon(daemon_config(node_id=f"{daemon_config().node_id}-reap", reap_interval=0.2))
    await node.start()
    try:
        async with AsyncClient(node.address) as client:
            idle = await client.create_session("busybox", idle_timeout=1)
            busy = await client.create_session("python")
            slow = asyncio.create_task(busy.exec("sleep 2; echo finished"))
            await asyncio.sleep(2.0)
            with pytest.raises(NotFoundError, match="idle timeout after 1 s"):
                await idle.exec("true")
            stopping = asyncio.create_task(node.stop(grace=10))
            result = await slow
            assert result.stdout == b"finished\n", "an in-flight call was cut off instead of finishing"
            await stopping
    finally:
        await node.stop()
    runtime = node.runtime
    await runtime.start()
    left = await runtime.list_containers({LABEL_OWNER: node.config.node_id})
    await runtime.close()
    assert left == []


async def test_idempotency_key_returns_the_same_session(client: AsyncClient) -> None:
    twins = await asyncio.gather(*(client.create_session("busybox", idempotency_key="episode-42") for _ in range(3)))
    assert len({t.id for t in twins}) == 1 and twins[0].info.state == "ready"
    again = await client.create_session("busybox", idempotency_key="episode-42")
    assert again.id == twins[0].id
    await again.close()
    with pytest.raises(FailedPreconditionError, match="which ended: closed by client"):
        await client.create_session("busybox", idempotency_key="episode-42")


async def test_call_deadline_caps_the_command_timeout(client: AsyncClient, daemon: NodeDaemon) -> None:
    session = await client.create_session("python")
    try:
        async with grpc.aio.insecure_channel(daemon.address) as channel:
            stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
            started = time.monotonic()
            # The command asks for 60 s; the caller will only wait 1.5 s. The daemon must answer
            # in time with a timed-out result, not let the call die with DEADLINE_EXCEEDED.
            reply = await stub.Exec(exec_request(session.id, "sleep 30", timeout=60), timeout=1.5)
            assert reply.timed_out and time.monotonic() - started < 1.5
    finally:
        await session.close()


async def test_engine_exec_commands_queue_and_their_kills_do_not(client: AsyncClient, daemon: NodeDaemon) -> None:
    """Images without python3 run each command as an Engine API exec. They queue for a fixed
    number of slots (2,000 at once had thrashed the node so that 19 finished in 35 s); a command
    that times out is killed by an exec that skips the queue, so that a queue full of timed-out
    commands cannot wait forever for their own kills."""
    slots = EXEC_CONCURRENCY
    sessions = [await client.create_session("busybox") for _ in range(8)]
    try:
        started = time.monotonic()
        stuck = await asyncio.gather(*(sessions[i % 8].exec("sleep 30", timeout=1) for i in range(slots + 8)))
        assert all(r.timed_out and r.signal == 9 for r in stuck)
        assert time.monotonic() - started < 25, "timed-out commands waited for their kills"
        many = await asyncio.gather(*(sessions[i % 8].exec(["echo", str(i)], timeout=60) for i in range(400)))
        assert [r.stdout for r in many] == [f"{i}\n".encode() for i in range(400)]
    finally:
        await asyncio.gather(*(s.close() for s in sessions))
