"""The synchronous client, on grpc's blocking channel (grpc.aio must not be driven from a second
event loop in a process that already runs one, so this is not a wrapper around AsyncClient)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from rlsandbox.client._client import (
    RETRY_ATTEMPTS,
    Command,
    channel_credentials,
    channel_options,
    evaluate_request,
    exec_request,
    write_files_request,
)
from rlsandbox.client._errors import UnavailableError, from_rpc_error
from rlsandbox.client._types import ExecResult, FileData, GradeResult, SessionInfo, task_message
from rlsandbox.v1 import sandbox_pb2 as pb
from rlsandbox.v1 import sandbox_pb2_grpc

T = TypeVar("T")


class Client:
    """Blocking client of one node daemon (the same calls as :class:`AsyncClient`).

    Args:
        target: ``host:port`` or ``unix:/path``.
        timeout: default deadline of a call in seconds.
        token, tls_ca, tls_server_name: as in :class:`AsyncClient`.
    """

    def __init__(
        self,
        target: str = "127.0.0.1:7420",
        *,
        timeout: float = 60.0,
        token: str | None = None,
        tls_ca: str | bytes | None = None,
        tls_server_name: str | None = None,
    ) -> None:
        self.target = target
        self.timeout = timeout
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

    def _call(self, method: Callable[..., T], request: Any, *, timeout: float, retry: bool) -> T:
        attempt = 0
        while True:
            try:
                return method(request, timeout=timeout)
            except grpc.RpcError as e:
                error = from_rpc_error(e, self.target, self._tls)
                attempt += 1
                if not (retry and isinstance(error, UnavailableError) and attempt < RETRY_ATTEMPTS):
                    raise error from None
                time.sleep(min(2.0, 0.1 * 2**attempt) * (0.5 + random.random()))

    def create_session(self, pool: str = "", *, acquire_timeout: float = 0.0, task: Any = None, **options: Any) -> Session:
        """Start a session on a sandbox of ``pool`` (options as in AsyncClient.create_session)."""
        if task is not None:
            options["task"] = task_message(task)
        request = pb.CreateSessionRequest(pool=pool, acquire_timeout=acquire_timeout, **options)
        info = self._call(
            self._stub.CreateSession,
            request,
            timeout=self.timeout + acquire_timeout + (600.0 if task is not None else 0.0),
            retry=bool(request.idempotency_key),
        )
        return Session(self, SessionInfo.from_pb(info))

    def session(self, pool: str = "", **options: Any) -> Session:
        """``with client.session(pool="python") as s:``; the session is closed on exit."""
        return self.create_session(pool, **options)

    def exec(self, session_id: str, command: Command, **options: Any) -> ExecResult:
        request = exec_request(session_id, command, **options)
        result = self._call(self._stub.Exec, request, timeout=self.timeout + (request.timeout or 300.0), retry=request.seq > 0)
        return ExecResult.from_pb(result)

    def write_files(self, session_id: str, files: Mapping[str, bytes | str | tuple[bytes, int]]) -> None:
        request = write_files_request(session_id, files)
        self._call(self._stub.WriteFiles, request, timeout=self.timeout, retry=True)

    def read_files(self, session_id: str, paths: Sequence[str], *, max_bytes: int = 0) -> dict[str, FileData]:
        request = pb.ReadFilesRequest(session_id=session_id, paths=list(paths), max_bytes=max_bytes)
        response = self._call(self._stub.ReadFiles, request, timeout=self.timeout, retry=True)
        return {f.path: FileData(f.path, f.data, f.size, f.truncated, f.error or None) for f in response.files}

    def close_session(self, session_id: str) -> bool:
        request = pb.CloseSessionRequest(session_id=session_id)
        return bool(self._call(self._stub.CloseSession, request, timeout=self.timeout, retry=True).closed)

    def get_session(self, session_id: str) -> SessionInfo:
        request = pb.GetSessionRequest(session_id=session_id)
        return SessionInfo.from_pb(self._call(self._stub.GetSession, request, timeout=self.timeout, retry=True))

    def list_sessions(self, labels: Mapping[str, str] | None = None, pool: str = "") -> list[SessionInfo]:
        request = pb.ListSessionsRequest(labels=dict(labels or {}), pool=pool)
        response = self._call(self._stub.ListSessions, request, timeout=self.timeout, retry=True)
        return [SessionInfo.from_pb(s) for s in response.sessions]

    def evaluate(self, session_id: str, *, task: Any = None, mode: str = "clean_room", timeout: float = 0.0) -> GradeResult:
        request = evaluate_request(session_id, task=task, mode=mode, timeout=timeout)
        result = self._call(self._stub.Evaluate, request, timeout=self.timeout + (timeout or 900.0), retry=True)
        return GradeResult.from_pb(result)

    def node_status(self) -> pb.NodeStatus:
        return self._call(self._stub.GetNodeStatus, pb.GetNodeStatusRequest(), timeout=self.timeout, retry=True)


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

    def exec(self, command: Command, **options: Any) -> ExecResult:
        return self.client.exec(self.id, command, **options)

    def write_files(self, files: Mapping[str, bytes | str | tuple[bytes, int]]) -> None:
        self.client.write_files(self.id, files)

    def read_files(self, paths: Sequence[str], *, max_bytes: int = 0) -> dict[str, FileData]:
        return self.client.read_files(self.id, paths, max_bytes=max_bytes)

    def grade(self, *, task: Any = None, mode: str = "clean_room", timeout: float = 0.0) -> GradeResult:
        return self.client.evaluate(self.id, task=task, mode=mode, timeout=timeout)

    def close(self) -> bool:
        return self.client.close_session(self.id)
