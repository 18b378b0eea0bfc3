"""The asynchronous client and its session handle."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import (
    Any,
    TypeVar,
    Union,
)

import grpc
from rlsandbox.client._errors import SandboxRPCError, UnavailableError, error_from_name, from_rpc_error
from rlsandbox.client._types import ExecResult, FileData, GradeResult, SessionInfo, task_message
from rlsandbox.v1 import sandbox_pb2 as pb
from rlsandbox.v1 import sandbox_pb2_grpc

T = TypeVar("T")
Command = Union[str, Sequence[str]]
DEFAULT_TIMEOUT = 60.0
RETRY_ATTEMPTS = 4
MAX_MESSAGE = 128 << 20


def _command(msg: pb.ExecRequest, command: Command) -> None:
    if isinstance(command, str):
        msg.shell = command
    else:
        msg.argv.args.extend(command)


def exec_request(
    session_id: str,
    command: Command,
    *,
    shell_session: str = "",
    cwd: str = "",
    env: Mapping[str, str] | None = None,
    stdin: bytes = b"",
    timeout: float = 0.0,
    stdout_cap: int = 0,
    stderr_cap: int = 0,
    seq: int = 0,
) -> pb.ExecRequest:
    """Build an ExecRequest message (a string runs in a shell, a list is an argv)."""
    msg = pb.ExecRequest(
        session_id=session_id,
        shell_session=shell_session,
        cwd=cwd,
        env=dict(env or {}),
        stdin=stdin,
        timeout=timeout,
        stdout_cap=stdout_cap,
        stderr_cap=stderr_cap,
        seq=seq,
    )
    _command(msg, command)
    return msg


def write_files_request(session_id: str, files: Mapping[str, Union[bytes, str, tuple[bytes, int]]]) -> pb.WriteFilesRequest:
    """Build a WriteFilesRequest from ``{path: data}`` or ``{path: (data, mode)}`` (str is UTF-8)."""
    request = pb.WriteFilesRequest(session_id=session_id)
    for path, value in files.items():
        data, mode = value if isinstance(value, tuple) else (value, 0)
        request.files.add(path=path, data=data.encode() if isinstance(data, str) else data, mode=mode)
    return request


def channel_credentials(*, token: str | None, tls_ca: str | bytes | None) -> grpc.ChannelCredentials | None:
    """TLS (with the given CA) and, with a token, bearer-token call credentials; None: plaintext."""
    if tls_ca is None:
        if token is not None:
            raise ValueError("a token is only sent over TLS: pass tls_ca (the daemon's CA certificate) too")
        return None
    if isinstance(tls_ca, str):
        with open(tls_ca, "rb") as f:
            tls_ca = f.read()
    creds = grpc.ssl_channel_credentials(root_certificates=tls_ca)
    if token is not None:
        creds = grpc.composite_channel_credentials(creds, grpc.access_token_call_credentials(token))
    return creds


def channel_options(tls_server_name: str | None = None) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.max_send_message_length", MAX_MESSAGE),
    ]
    if tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls_server_name))
    return options


def evaluate_request(session_id: str, *, task: Any = None, mode: str = "clean_room", timeout: float = 0.0) -> pb.EvaluateRequest:
    if mode not in ("clean_room", "in_place"):
        raise ValueError(f"mode must be 'clean_room' or 'in_place', not {mode!r}")
    return pb.EvaluateRequest(
        session_id=session_id,
        task=task_message(task) if task is not None else None,
        mode=pb.EVALUATE_MODE_IN_PLACE if mode == "in_place" else pb.EVALUATE_MODE_CLEAN_ROOM,
        timeout=timeout,
    )


class AsyncClient:
    """Asynchronous client of one rlsandbox node daemon.

    Args:
        target: ``host:port`` or ``unix:/path/to/socket``.
        timeout: default deadline of a call in seconds (a command's own timeout is added to it).
        token: bearer token, for a daemon with ``auth_token_file`` (sent over TLS only).
        tls_ca: the CA certificate (PEM bytes, or a file path) that signed the daemon's
            certificate; with it the channel uses TLS. ``tls_server_name`` overrides the name checked.

    Use as ``async with AsyncClient("127.0.0.1:7420") as client:``.
    """

    def __init__(
        self,
        target: str = "127.0.0.1:7420",
        *,
        timeout: float = DEFAULT_TIMEOUT,
        token: str | None = None,
        tls_ca: str | bytes | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
        creds = channel_credentials(token=token, tls_ca=tls_ca)
        options = channel_options(tls_server_name)
        self._tls = creds is not None
        if creds is None:
            self._channel = grpc.aio.insecure_channel(target, options=options)
        else:
            self._channel = grpc.aio.secure_channel(target, creds, options=options)
        self._stub = sandbox_pb2_grpc.SandboxServiceStub(self._channel)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the channel."""
        await self._channel.close()  # type: ignore[call-arg]

    async def _call(self, method: Callable[..., Awaitable[T]], request: Any, *, timeout: float, retry: bool) -> T:
        attempt = 0
        while True:
            try:
                return await method(request, timeout=timeout)
            except grpc.RpcError as e:
                error = from_rpc_error(e, self.target, self._tls)
                attempt += 1
                if not (retry and isinstance(error, UnavailableError) and attempt < RETRY_ATTEMPTS):
                    raise error from None
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt) * (0.5 + random.random()))

    async def create_session(
        self,
        pool: str = "",
        *,
        task: Any = None,
        env: Mapping[str, str] | None = None,
        workdir: str = "",
        idle_timeout: float = 0.0,
        max_lifetime: float = 0.0,
        labels: Mapping[str, str] | None = None,
        idempotency_key: str = "",
        acquire_timeout: float = 0.0,
    ) -> AsyncSession:
        """Start a session on a sandbox of ``pool``. Retried on UNAVAILABLE only with an idempotency key.

        With ``task`` (see :func:`task_message`), the session starts from the task's workspace and
        setup, in the task's pool, and :meth:`AsyncSession.grade` grades against it.

        Raises:
            NotFoundError: no such pool. ResourceExhaustedError: node or pool full.
        """
        request = pb.CreateSessionRequest(
            pool=pool,
            env=dict(env or {}),
            workdir=workdir,
            idle_timeout=idle_timeout,
            max_lifetime=max_lifetime,
            labels=dict(labels or {}),
            idempotency_key=idempotency_key,
            acquire_timeout=acquire_timeout,
            task=task_message(task) if task is not None else None,
        )
        deadline = self.timeout + acquire_timeout + (600.0 if task is not None else 0.0)
        info = await self._call(self._stub.CreateSession, request, timeout=deadline, retry=bool(idempotency_key))
        return AsyncSession(self, SessionInfo.from_pb(info))

    def session(self, pool: str = "", **options: Any) -> _SessionContext:
        """``async with client.session(pool="python") as s:``; the session is closed on exit."""
        return _SessionContext(self, pool, options)

    async def exec(self, session_id: str, command: Command, **options: Any) -> ExecResult:
        """Run one command in a session (see :meth:`AsyncSession.exec`)."""
        request = exec_request(session_id, command, **options)
        call_timeout = self.timeout + (request.timeout or 300.0)
        result = await self._call(self._stub.Exec, request, timeout=call_timeout, retry=request.seq > 0)
        return ExecResult.from_pb(result)

    async def exec_stream(
        self, session_id: str, command: Command, **options: Any
    ) -> AsyncIterator[tuple[str, bytes | ExecResult]]:
        """Yield ``("stdout", bytes)`` / ``("stderr", bytes)`` while the command runs, then ``("result", ExecResult)``."""
        request = exec_request(session_id, command, **options)
        call = self._stub.ExecStream(request, timeout=self.timeout + (request.timeout or 300.0))
        try:
            async for event in call:
                which = event.WhichOneof("event")
                if which == "result":
                    yield "result", ExecResult.from_pb(event.result)
                elif which is not None:
                    yield which, getattr(event, which)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.target, self._tls) from None

    async def exec_batch(self, requests: Iterable[pb.ExecRequest]) -> list[ExecResult | SandboxRPCError]:
        """One command in each of many sessions; per item an ExecResult or the error of that item."""
        reqs = list(requests)
        longest = max((r.timeout or 300.0 for r in reqs), default=0.0)
        response = await self._call(
            self._stub.ExecBatch,
            pb.ExecBatchRequest(requests=reqs),
            timeout=self.timeout + longest,
            retry=all(r.seq > 0 for r in reqs),
        )
        out: list[ExecResult | SandboxRPCError] = []
        for item in response.items:
            if item.WhichOneof("outcome") == "result":
                out.append(ExecResult.from_pb(item.result))
            else:
                out.append(error_from_name(item.error.code, item.error.message))
        return out

    async def write_files(self, session_id: str, files: Mapping[str, bytes | str | tuple[bytes, int]]) -> None:
        """Write files: ``{path: data}`` or ``{path: (data, mode)}``; parents are created."""
        request = write_files_request(session_id, files)
        await self._call(self._stub.WriteFiles, request, timeout=self.timeout, retry=True)

    async def read_files(self, session_id: str, paths: Sequence[str], *, max_bytes: int = 0) -> dict[str, FileData]:
        """Read files (each capped at ``max_bytes``); missing ones come back with ``error`` set."""
        request = pb.ReadFilesRequest(session_id=session_id, paths=list(paths), max_bytes=max_bytes)
        response = await self._call(self._stub.ReadFiles, request, timeout=self.timeout, retry=True)
        return {
            f.path: FileData(path=f.path, data=f.data, size=f.size, truncated=f.truncated, error=f.error or None)
            for f in response.files
        }

    async def close_session(self, session_id: str) -> bool:
        """End a session (idempotent); False when it had already ended."""
        request = pb.CloseSessionRequest(session_id=session_id)
        response = await self._call(self._stub.CloseSession, request, timeout=self.timeout, retry=True)
        return bool(response.closed)

    async def get_session(self, session_id: str) -> SessionInfo:
        request = pb.GetSessionRequest(session_id=session_id)
        return SessionInfo.from_pb(await self._call(self._stub.GetSession, request, timeout=self.timeout, retry=True))

    async def list_sessions(self, labels: Mapping[str, str] | None = None, pool: str = "") -> list[SessionInfo]:
        request = pb.ListSessionsRequest(labels=dict(labels or {}), pool=pool)
        response = await self._call(self._stub.ListSessions, request, timeout=self.timeout, retry=True)
        return [SessionInfo.from_pb(s) for s in response.sessions]

    async def evaluate(self, session_id: str, *, task: Any = None, mode: str = "clean_room", timeout: float = 0.0) -> GradeResult:
        """Grade a session (see :meth:`AsyncSession.grade`)."""
        request = evaluate_request(session_id, task=task, mode=mode, timeout=timeout)
        # Grading does not change the agent's sandbox: safe to repeat on UNAVAILABLE.
        result = await self._call(self._stub.Evaluate, request, timeout=self.timeout + (timeout or 900.0), retry=True)
        return GradeResult.from_pb(result)

    async def node_status(self) -> pb.NodeStatus:
        """Pools (ready, in use, creating, failures), sessions, capacity, load, version."""
        return await self._call(self._stub.GetNodeStatus, pb.GetNodeStatusRequest(), timeout=self.timeout, retry=True)


class AsyncSession:
    """A handle on one session; every method forwards to the client with this session's id."""

    def __init__(self, client: AsyncClient, info: SessionInfo) -> None:
        self.client = client
        self.info = info
        self.id = info.session_id

    async def __aenter__(self) -> AsyncSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def exec(self, command: Command, **options: Any) -> ExecResult:
        """Run ``command`` (a shell string or an argv list).

        Keyword options: shell_session, cwd, env, stdin, timeout (seconds), stdout_cap,
        stderr_cap, seq (a retried step with the same seq does not run twice).
        """
        return await self.client.exec(self.id, command, **options)

    def exec_stream(self, command: Command, **options: Any) -> AsyncIterator[tuple[str, bytes | ExecResult]]:
        return self.client.exec_stream(self.id, command, **options)

    async def write_files(self, files: Mapping[str, bytes | str | tuple[bytes, int]]) -> None:
        await self.client.write_files(self.id, files)

    async def read_files(self, paths: Sequence[str], *, max_bytes: int = 0) -> dict[str, FileData]:
        return await self.client.read_files(self.id, paths, max_bytes=max_bytes)

    async def grade(self, *, task: Any = None, mode: str = "clean_room", timeout: float = 0.0) -> GradeResult:
        """The reward of this session's work, from its task (or ``task``). ``mode="in_place"`` runs
        the tests in this sandbox: faster, and weaker against an agent that tampered with it."""
        return await self.client.evaluate(self.id, task=task, mode=mode, timeout=timeout)

    async def refresh(self) -> SessionInfo:
        self.info = await self.client.get_session(self.id)
        return self.info

    async def close(self) -> bool:
        return await self.client.close_session(self.id)


class _SessionContext:
    def __init__(self, client: AsyncClient, pool: str, options: dict[str, Any]) -> None:
        self._client = client
        self._pool = pool
        self._options = options
        self._session: AsyncSession | None = None

    async def __aenter__(self) -> AsyncSession:
        self._session = await self._client.create_session(self._pool, **self._options)
        return self._session

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await asyncio.shield(self._session.close())
