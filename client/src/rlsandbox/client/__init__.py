"""rlsandbox client: sandboxed, multi-turn episode sessions on rlsandbox node daemons.

Depends on grpcio and protobuf only::

    async with AsyncClient("127.0.0.1:7420") as client:
        async with client.session(pool="python") as s:
            r = await s.exec("pytest -q")
"""

from rlsandbox.client._client import AsyncClient, AsyncSession, exec_request
from rlsandbox.client._errors import (
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    ResourceExhaustedError,
    SandboxAbortedError,
    SandboxRPCError,
    TransportSecurityError,
    UnauthenticatedError,
    UnavailableError,
)
from rlsandbox.client._sync import Client, Session
from rlsandbox.client._types import ExecResult, FileData, GradeResult, SessionInfo, TestOutcome, task_message

__all__ = [
    "AsyncClient",
    "AsyncSession",
    "Client",
    "DeadlineExceededError",
    "ExecResult",
    "FailedPreconditionError",
    "FileData",
    "GradeResult",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "ResourceExhaustedError",
    "SandboxAbortedError",
    "SandboxRPCError",
    "Session",
    "SessionInfo",
    "TestOutcome",
    "TransportSecurityError",
    "UnauthenticatedError",
    "UnavailableError",
    "exec_request",
    "task_message",
]
