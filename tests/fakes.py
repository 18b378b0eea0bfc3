"""Fakes for the fast tier: a pool and sandboxes with no engine behind them.

They stand in for :class:`WarmPool` and the agent channel only where the session manager's own
logic is under test (admission, idempotency, tombstones, step dedup, reaping, recovery); the
real pool and agent are tested against Docker in tests/integration.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from rlsandbox.daemon.api.edge import EdgeInterceptor
from rlsandbox.daemon.api.servicer import SandboxServicer
from rlsandbox.daemon.config import DaemonConfig
from rlsandbox.daemon.errors import SandboxDied
from rlsandbox.daemon.events.model import Event
from rlsandbox.daemon.journal import JournalEntry
from rlsandbox.daemon.model import ContainerSpec, ExecRequest, ExecResult, FileRead, FileWrite, FileWriteResult
from rlsandbox.daemon.pool.spec import PoolSpec
from rlsandbox.daemon.sandbox import Sandbox
from rlsandbox.daemon.session import SessionManager
from rlsandbox.v1 import sandbox_pb2_grpc


def result(stdout: bytes = b"", exit_code: int = 0) -> ExecResult:
    return ExecResult(exit_code, None, False, stdout, b"", len(stdout), 0, False, False, 0.001)


class FakeChannel:
    """Runs nothing: ``exec`` asks the test's ``run`` what a command returns."""

    def __init__(self, run: Callable[[ExecRequest], Any]) -> None:
        self.run = run
        self.closed_reason: str | None = None
        self.info: dict[str, Any] = {}
        self.execs: list[ExecRequest] = []
        self.files: dict[str, bytes] = {}

    @property
    def alive(self) -> bool:
        return self.closed_reason is None

    def die(self, reason: str) -> None:
        self.closed_reason = reason

    async def exec(self, req: ExecRequest, on_chunk: Any = None) -> ExecResult:
        if self.closed_reason is not None:
            raise SandboxDied(f"sandbox died: {self.closed_reason}")
        self.execs.append(req)
        out = self.run(req)
        if asyncio.iscoroutine(out):
            out = await out
        return out if isinstance(out, ExecResult) else result(str(out).encode())

    async def write_files(self, files: Sequence[FileWrite], timeout: float) -> list[FileWriteResult]:
        for f in files:
            self.files[f.path] = f.data
        return [FileWriteResult(f.path) for f in files]

    async def read_files(self, paths: Sequence[str], max_bytes: int, timeout: float) -> list[FileRead]:
        return [
            FileRead(p, self.files[p][:max_bytes], len(self.files[p]), len(self.files[p]) > max_bytes)
            if p in self.files
            else FileRead(p, b"", 0, False, "not found")
            for p in paths
        ]


class FakePool:
    """The narrow pool interface of session/ports.py, with counters a test can assert on."""

    def __init__(self, name: str = "default", run: Callable[[ExecRequest], Any] = lambda r: "") -> None:
        self.name = name
        self.spec = PoolSpec(name=name, container=ContainerSpec(image="fake:latest", workdir="/work"))
        self.run = run
        self.leased: list[Sandbox] = []
        self.released: list[tuple[str, str]] = []  # (sandbox name, reason)
        self.reused: list[bool] = []  # per release: whether the pool may recycle it
        self.gate: asyncio.Event | None = None  # when set: acquire waits for it
        self.fail_acquire: Exception | None = None
        self.death = ("OOM-killed at its memory limit", "oom")
        self.death_told: asyncio.Event | None = None  # when set: death_cause waits for it (a slow engine)
        self.adoptable: set[str] = set()
        self._n = 0

    def _sandbox(self, name: str) -> Sandbox:
        channel = FakeChannel(self.run)
        return Sandbox(
            container_id=f"id-{name}", name=name, pool=self.name, channel=channel, mode="agent",  # type: ignore[arg-type]
            runtime="runc", image="fake:latest", transport="dial",
        )  # fmt: skip

    async def acquire(self, timeout: float, *, warm: bool | None = None) -> Sandbox:
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_acquire is not None:
            raise self.fail_acquire
        self._n += 1
        sandbox = self._sandbox(f"{self.name}-{self._n}")
        self.leased.append(sandbox)
        return sandbox

    def release(self, sandbox: Sandbox, reason: str = "released", *, reuse: bool = False) -> None:
        self.leased.remove(sandbox)
        self.released.append((sandbox.name, reason))
        self.reused.append(reuse)

    async def adopt(self, entry: JournalEntry, state: str | None) -> Sandbox:
        if entry.container not in self.adoptable:
            raise SandboxDied("its container is gone")
        sandbox = self._sandbox(entry.container)
        self.leased.append(sandbox)
        return sandbox

    async def death_cause(self, sandbox: Sandbox) -> tuple[str, str]:
        if self.death_told is not None:
            await self.death_told.wait()
        return self.death


class FakePublisher:
    """Collects events; each flush makes everything emitted so far durable (JetStream's ack)."""

    def __init__(self, *, acks: bool = True) -> None:
        self.events: list[Event] = []
        self.node_events: list[tuple[str, dict[str, Any]]] = []
        self.on_durable: Callable[[list[Event]], None] | None = None
        self.acks = acks
        self._unacked: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)
        self._unacked.append(event)

    def emit_node(self, type_: str, data: dict[str, Any]) -> None:
        self.node_events.append((type_, data))

    def flush_soon(self) -> None:
        if self.acks and self.on_durable is not None:
            batch, self._unacked = self._unacked, []
            asyncio.get_running_loop().call_soon(self.on_durable, batch)

    def of(self, session: str) -> list[tuple[int, str]]:
        return [(e.seq, e.type) for e in self.events if e.session == session]


@contextlib.asynccontextmanager
async def serving(manager: SessionManager) -> AsyncIterator[str]:
    """The real gRPC server, edge interceptor and servicer on a real port over ``manager``
    (whose pools are fakes): the API as a client sees it, without Docker. Yields the address."""
    config = DaemonConfig.model_validate({"node_id": manager.node_id, "pools": []})
    servicer = SandboxServicer(manager, config, docker_ok=lambda: True, status=lambda: None)  # type: ignore[arg-type,return-value]
    server = grpc.aio.server(interceptors=[EdgeInterceptor()])
    sandbox_pb2_grpc.add_SandboxServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(0)
        await manager.close_all("test over")


__all__ = ["FakeChannel", "FakePool", "FakePublisher", "result", "serving"]
