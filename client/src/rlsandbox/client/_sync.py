"""The synchronous client, on grpc's blocking channel (grpc.aio must not be driven from a second
event loop in a process that already runs one, so this is not a wrapper around AsyncClient)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

import grpc
from rlsandbox.client import _policy
from rlsandbox.client._client import (
    DEFAULT_TIMEOUT,
    MetadataHook,
    _batch_item,
    _files,
    call_metadata,
    channel_credentials,
    channel_options,
)
from rlsandbox.client._errors import SandboxRPCError, from_rpc_error
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


class Client:
    """Blocking client of one node daemon (the same calls as :class:`AsyncClient`).

    Args:
        target: ``host:port`` or ``unix:/path``.
        timeout: default deadline of a call in seconds.
        token, tls_ca, tls_server_name, metadata: as in :class:`AsyncClient`.
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
        self._tls = creds is not None
        options = channel_options(tls_server_name)
        if creds is None:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            self._channel = grpc.secure_channel(target, creds, options=options)
        self._stub = sandbox_pb2_grpc.SandboxServiceStub(self._channel)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def _call(self, method: str, request: Any) -> Any:
        """One call with its deadline and retry rule from the policy table (_policy.py)."""
        stub: Callable[..., Any] = getattr(self._stub, method)
        timeout = _policy.deadline(method, request, self.timeout)
        attempt = 0
        while True:
            try:
                return stub(request, timeout=timeout, metadata=call_metadata(self._metadata))
            except grpc.RpcError as e:
                error = from_rpc_error(e, self.target, self._tls, self.node_id)
                attempt += 1
                pause = _policy.retry_after(method, request, error, attempt)
                if pause is None:
                    raise error from None
                time.sleep(pause)

    def create_session(self, pool: str = "", **options: Unpack[SessionOptions]) -> Session:
        """Start a session on a sandbox of ``pool`` (options: :class:`SessionOptions`)."""
        return Session(self, SessionInfo.from_pb(self._call("CreateSession", create_session_request(pool, **options))))

    def session(self, pool: str = "", **options: Unpack[SessionOptions]) -> Session:
        """``with client.session(pool="python") as s:``; the session is closed on exit."""
        return self.create_session(pool, **options)

    def exec(self, session_id: str, command: Command, **options: Unpack[ExecOptions]) -> ExecResult:
        return ExecResult.from_pb(self._call("Exec", exec_request(session_id, command, **options)))

    def exec_batch(self, commands: Iterable[BatchCommand]) -> list[ExecResult | SandboxRPCError]:
        """One command in each of many sessions in one call; per item an ExecResult or its error."""
        request = pb.ExecBatchRequest(requests=[exec_request(c.session_id, c.command, **c.options) for c in commands])
        response = self._call("ExecBatch", request)
        return [_batch_item(i) for i in response.items]

    def write_files(self, session_id: str, files: Mapping[str, FileContents]) -> None:
        self._call("WriteFiles", write_files_request(session_id, files))

    def read_files(self, session_id: str, paths: Sequence[str], *, max_bytes: int = 0) -> dict[str, FileData]:
        return _files(self._call("ReadFiles", pb.ReadFilesRequest(session_id=session_id, paths=list(paths), max_bytes=max_bytes)))

    def close_session(self, session_id: str) -> bool:
        return bool(self._call("CloseSession", pb.CloseSessionRequest(session_id=session_id)).closed)

    def get_session(self, session_id: str) -> SessionInfo:
        return SessionInfo.from_pb(self._call("GetSession", pb.GetSessionRequest(session_id=session_id)))

    def list_sessions(self, labels: Mapping[str, str] | None = None, pool: str = "") -> list[SessionInfo]:
        response = self._call("ListSessions", pb.ListSessionsRequest(labels=dict(labels or {}), pool=pool))
        return [SessionInfo.from_pb(s) for s in response.sessions]

    def evaluate(self, session_id: str, *, task: Any = None, mode: str = "clean_room", timeout: float = 0.0) -> GradeResult:
        return GradeResult.from_pb(self._call("Evaluate", evaluate_request(session_id, task=task, mode=mode, timeout=timeout)))

    def prefetch(self, task: Any, count: int, *, ttl: float = 0.0) -> PrefetchInfo:
        """Have the node keep ``count`` sandboxes prepared for ``task`` (its workspace, git reset and
        setup done), replacing those taken, until ``ttl`` seconds (0: the node's default) after the
        task was last asked for. Sessions from the task (pass the returned info as ``task=``) and
        their clean rooms then start from a prepared sandbox. ``count=0`` stops it."""
        request = pb.PrefetchRequest(task=task_message(task), count=count, ttl=ttl)
        r = self._call("Prefetch", request)
        return PrefetchInfo(r.ref, r.ready, r.preparing, r.target, r.last_error)

    def fork(self, session_id: str, count: int, *, labels: Optional[Mapping[str, str]] = None) -> list[Session]:
        """``count`` new sessions whose filesystem equals this session's now (see :meth:`Session.fork`)."""
        r = self._call("Fork", pb.ForkRequest(session_id=session_id, count=count, labels=dict(labels or {})))
        return [Session(self, SessionInfo.from_pb(s)) for s in r.sessions]

    def node_status(self) -> NodeStatus:
        return NodeStatus.from_pb(self._call("GetNodeStatus", pb.GetNodeStatusRequest()))


class Session:
    """Blocking session handle; a context manager that closes the session."""

    def __init__(self, client: Client, info: SessionInfo) -> None:
        self.client = client
        self.info = info
        self.id = info.session_id

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def exec(self, command: Command, **options: Unpack[ExecOptions]) -> ExecResult:
        return self.client.exec(self.id, command, **options)

    def write_files(self, files: Mapping[str, FileContents]) -> None:
        self.client.write_files(self.id, files)

    def read_files(self, paths: Sequence[str], *, max_bytes: int = 0) -> dict[str, FileData]:
        return self.client.read_files(self.id, paths, max_bytes=max_bytes)

    def grade(self, *, task: Any = None, mode: str = "clean_room", timeout: float = 0.0) -> GradeResult:
        return self.client.evaluate(self.id, task=task, mode=mode, timeout=timeout)

    def fork(self, count: int, *, labels: Optional[Mapping[str, str]] = None) -> list[Session]:
        """``count`` new sessions whose filesystem equals this one's now, with its options and task
        (as :meth:`AsyncSession.fork`). Processes and memory are not copied."""
        return self.client.fork(self.id, count, labels=labels)

    def close(self) -> bool:
        return self.client.close_session(self.id)
