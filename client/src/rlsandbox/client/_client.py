"""The asynchronous client and its session handle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional, Tuple, TypeVar

import grpc
from rlsandbox.client import _policy
from rlsandbox.client._errors import SandboxRPCError, error_from_name, from_rpc_error
from rlsandbox.client._requests import (
    Command,
    ExecOptions,
    FileContents,
    SessionOptions,
    create_session_request,
    evaluate_request,
    exec_request,
    task_message,
    write_files_request,
)
from rlsandbox.client._types import BatchCommand, ExecResult, FileData, GradeResult, NodeStatus, PrefetchInfo, SessionInfo
from rlsandbox.v1 import sandbox_pb2 as pb
from rlsandbox.v1 import sandbox_pb2_grpc

if TYPE_CHECKING:
    from typing_extensions import Unpack

T = TypeVar("T")
# Called before every call; what it returns goes as gRPC metadata (e.g. a W3C ``traceparent``).
MetadataHook = Callable[[], Iterable[Tuple[str, str]]]
DEFAULT_TIMEOUT = 60.0
MAX_MESSAGE = 128 << 20


def opentelemetry_metadata() -> list[tuple[str, str]]:
    """The caller's current OpenTelemetry trace context as gRPC metadata (``traceparent``,
    ``tracestate``), so the daemon's spans join the trainer's trace. Pass it as ``metadata=``;
    without the ``opentelemetry-api`` package installed it sends nothing."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return []
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return list(carrier.items())


def call_metadata(hook: Optional[MetadataHook]) -> Optional[Tuple[Tuple[str, str], ...]]:
    return tuple(hook()) if hook is not None else None


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


class AsyncClient:
    """Asynchronous client of one rlsandbox node daemon.

    Args:
        target: ``host:port`` or ``unix:/path/to/socket``.
        timeout: default deadline of a call in seconds (a command's own timeout is added to it).
        token: bearer token, for a daemon with ``auth_token_file`` (sent over TLS only).
        tls_ca: the CA certificate (PEM bytes, or a file path) that signed the daemon's
            certificate; with it the channel uses TLS. ``tls_server_name`` overrides the name checked.
        metadata: called before each call; its pairs go as gRPC metadata. With
            :func:`opentelemetry_metadata` the daemon's spans continue the caller's trace.

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
        metadata: MetadataHook | None = None,
    ) -> None:
        self.target = target
        # The node this daemon is, when known (cluster clients set it): named in every error.
        self.node_id = ""
        self.timeout = timeout
        self._metadata = metadata
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

    async def _call(self, method: str, request: Any) -> Any:
        """One call with its deadline and retry rule from the policy table (_policy.py)."""
        stub: Callable[..., Awaitable[Any]] = getattr(self._stub, method)
        timeout = _policy.deadline(method, request, self.timeout)
        attempt = 0
        while True:
            try:
                return await stub(request, timeout=timeout, metadata=call_metadata(self._metadata))
            except grpc.RpcError as e:
                error = from_rpc_error(e, self.target, self._tls, self.node_id)
                attempt += 1
                pause = _policy.retry_after(method, request, error, attempt)
                if pause is None:
                    raise error from None
                await asyncio.sleep(pause)

    async def create_session(self, pool: str = "", **options: Unpack[SessionOptions]) -> AsyncSession:
        """Start a session on a sandbox of ``pool`` (options: :class:`SessionOptions`). Retried on
        UNAVAILABLE only with an idempotency key.

        With ``task`` (see :class:`SessionOptions`), the session starts from the task's workspace and
        setup, in the task's pool, and :meth:`AsyncSession.grade` grades against it.

        Raises:
            NotFoundError: no such pool. ResourceExhaustedError: node or pool full.
        """
        info = await self._call("CreateSession", create_session_request(pool, **options))
        return AsyncSession(self, SessionInfo.from_pb(info))

    def session(self, pool: str = "", **options: Unpack[SessionOptions]) -> _SessionContext:
        """``async with client.session(pool="python") as s:``; the session is closed on exit."""
        return _SessionContext(self, pool, options)

    async def exec(self, session_id: str, command: Command, **options: Unpack[ExecOptions]) -> ExecResult:
        """Run one command in a session (see :meth:`AsyncSession.exec`)."""
        return ExecResult.from_pb(await self._call("Exec", exec_request(session_id, command, **options)))

    async def exec_stream(
        self, session_id: str, command: Command, **options: Unpack[ExecOptions]
    ) -> AsyncIterator[tuple[str, bytes | ExecResult]]:
        """Yield ``("stdout", bytes)`` / ``("stderr", bytes)`` while the command runs, then ``("result", ExecResult)``."""
        request = exec_request(session_id, command, **options)
        timeout = _policy.deadline("ExecStream", request, self.timeout)
        call = self._stub.ExecStream(request, timeout=timeout, metadata=call_metadata(self._metadata))
        try:
            async for event in call:
                which = event.WhichOneof("event")
                if which == "result":
                    yield "result", ExecResult.from_pb(event.result)
                elif which is not None:
                    yield which, getattr(event, which)
        except grpc.RpcError as e:
            raise from_rpc_error(e, self.target, self._tls, self.node_id) from None

    async def exec_batch(self, commands: Iterable[BatchCommand]) -> list[ExecResult | SandboxRPCError]:
        """One command in each of many sessions in one call; per item an ExecResult or the error of that item."""
        request = pb.ExecBatchRequest(requests=[exec_request(c.session_id, c.command, **c.options) for c in commands])
        return [_batch_item(i) for i in (await self._call("ExecBatch", request)).items]

    async def write_files(self, session_id: str, files: Mapping[str, FileContents]) -> None:
        """Write files: ``{path: data}`` or ``{path: (data, mode)}``; parents are created."""
        await self._call("WriteFiles", write_files_request(session_id, files))

    async def read_files(self, session_id: str, paths: Sequence[str], *, max_bytes: int = 0) -> dict[str, FileData]:
        """Read files (each capped at ``max_bytes``); missing ones come back with ``error`` set."""
        request = pb.ReadFilesRequest(session_id=session_id, paths=list(paths), max_bytes=max_bytes)
        return _files(await self._call("ReadFiles", request))

    async def close_session(self, session_id: str) -> bool:
        """End a session (idempotent); False when it had already ended."""
        return bool((await self._call("CloseSession", pb.CloseSessionRequest(session_id=session_id))).closed)

    async def get_session(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_pb(await self._call("GetSession", pb.GetSessionRequest(session_id=session_id)))

    async def list_sessions(self, labels: Mapping[str, str] | None = None, pool: str = "") -> list[SessionInfo]:
        response = await self._call("ListSessions", pb.ListSessionsRequest(labels=dict(labels or {}), pool=pool))
        return [SessionInfo.from_pb(s) for s in response.sessions]

    async def evaluate(self, session_id: str, *, task: Any = None, mode: str = "clean_room", timeout: float = 0.0) -> GradeResult:
        """Grade a session (see :meth:`AsyncSession.grade`)."""
        request = evaluate_request(session_id, task=task, mode=mode, timeout=timeout)
        return GradeResult.from_pb(await self._call("Evaluate", request))

    async def prefetch(self, task: Any, count: int, *, ttl: float = 0.0) -> PrefetchInfo:
        """Have the node keep ``count`` sandboxes prepared for ``task`` (its workspace, git reset and
        setup done), replacing those taken, until ``ttl`` seconds (0: the node's default) after the
        task was last asked for. Sessions from the task (pass the returned info as ``task=``) and
        their clean rooms then start from a prepared sandbox. ``count=0`` stops it."""
        request = pb.PrefetchRequest(task=task_message(task), count=count, ttl=ttl)
        r = await self._call("Prefetch", request)
        return PrefetchInfo(r.ref, r.ready, r.preparing, r.target, r.last_error)

    async def fork(self, session_id: str, count: int, *, labels: Optional[Mapping[str, str]] = None) -> list[AsyncSession]:
        """``count`` new sessions whose filesystem equals this session's now (see
        :meth:`AsyncSession.fork`)."""
        r = await self._call("Fork", pb.ForkRequest(session_id=session_id, count=count, labels=dict(labels or {})))
        return [AsyncSession(self, SessionInfo.from_pb(s)) for s in r.sessions]

    async def drain(self, *, undo: bool = False, node_id: Optional[str] = None) -> Tuple[bool, int]:
        """Stop the node taking new sessions while the open ones go on (``undo``: take them
        again); returns (draining, sessions still open). The request names the node (``node_id``,
        else the one this client reaches, asked first): a node refuses a drain meant for another."""
        if node_id is None:
            node_id = (await self.node_status()).node_id
        r = await self._call("Drain", pb.DrainRequest(undo=undo, node_id=node_id))
        return r.draining, r.sessions

    async def node_status(self) -> NodeStatus:
        """Pools (ready, in use, creating, failures), sessions, capacity, load, version, events."""
        return NodeStatus.from_pb(await self._call("GetNodeStatus", pb.GetNodeStatusRequest()))


def _batch_item(item: pb.ExecBatchItem) -> ExecResult | SandboxRPCError:
    if item.WhichOneof("outcome") == "result":
        return ExecResult.from_pb(item.result)
    return error_from_name(item.error.code, item.error.message)


def _files(response: pb.ReadFilesResponse) -> dict[str, FileData]:
    return {f.path: FileData(f.path, f.data, f.size, f.truncated, f.error or None) for f in response.files}


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

    async def exec(self, command: Command, **options: Unpack[ExecOptions]) -> ExecResult:
        """Run ``command`` (a shell string or an argv list); options: :class:`ExecOptions`."""
        return await self.client.exec(self.id, command, **options)

    def exec_stream(self, command: Command, **options: Unpack[ExecOptions]) -> AsyncIterator[tuple[str, bytes | ExecResult]]:
        return self.client.exec_stream(self.id, command, **options)

    async def write_files(self, files: Mapping[str, FileContents]) -> None:
        await self.client.write_files(self.id, files)

    async def read_files(self, paths: Sequence[str], *, max_bytes: int = 0) -> dict[str, FileData]:
        return await self.client.read_files(self.id, paths, max_bytes=max_bytes)

    async def grade(self, *, task: Any = None, mode: str = "clean_room", timeout: float = 0.0) -> GradeResult:
        """The reward of this session's work, from its task (or ``task``). ``mode="in_place"`` runs
        the tests in this sandbox: faster, and weaker against an agent that tampered with it."""
        return await self.client.evaluate(self.id, task=task, mode=mode, timeout=timeout)

    async def fork(self, count: int, *, labels: Optional[Mapping[str, str]] = None) -> list[AsyncSession]:
        """``count`` new sessions, each on its own sandbox, whose filesystem (the workspace and
        everything else this session changed) equals this one's now, with its options and task
        (each can be graded) and ``labels`` on top of its labels: a GRPO group, or branches of a
        tree search. Processes and memory are not copied (persistent shells start afresh). All
        or nothing; never retried (a retry would fork twice). Close the forks when done. A session
        in which nothing has run yet forks into new sessions of its pool, or of its task as far as
        the task has prefetched sandboxes ready: a group from a fresh task session is hand-outs."""
        return await self.client.fork(self.id, count, labels=labels)

    async def refresh(self) -> SessionInfo:
        self.info = await self.client.get_session(self.id)
        return self.info

    async def close(self) -> bool:
        return await self.client.close_session(self.id)


class _SessionContext:
    def __init__(self, client: AsyncClient, pool: str, options: SessionOptions) -> None:
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
