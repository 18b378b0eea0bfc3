"""rlsandbox client: sandboxed, multi-turn episode sessions on rlsandbox node daemons.

Depends on grpcio and protobuf only::

    async with AsyncClient("127.0.0.1:7420") as client:
        async with client.session(pool="python") as s:
            r = await s.exec("pytest -q")
"""

from rlsandbox.client._client import AsyncClient, AsyncSession, opentelemetry_metadata
from rlsandbox.client._cluster import BlockingClusterClient, ClusterClient, ClusterNode
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
from rlsandbox.client._requests import Command, ExecOptions, SessionOptions
from rlsandbox.client._sync import Client, Session
from rlsandbox.client._types import (
    BatchCommand,
    EventsStatus,
    ExecResult,
    FileData,
    GradeResult,
    NodeStatus,
    PoolStatus,
    PrefetchInfo,
    SessionInfo,
    TaskRef,
    TestOutcome,
)

__all__ = [
    "AsyncClient",
    "AsyncSession",
    "BatchCommand",
    "BlockingClusterClient",
    "Client",
    "ClusterClient",
    "ClusterNode",
    "Command",
    "DeadlineExceededError",
    "EventsStatus",
    "ExecOptions",
    "ExecResult",
    "FailedPreconditionError",
    "FileData",
    "GradeResult",
    "InternalError",
    "InvalidArgumentError",
    "NodeStatus",
    "NotFoundError",
    "PoolStatus",
    "PrefetchInfo",
    "ResourceExhaustedError",
    "SandboxAbortedError",
    "SandboxRPCError",
    "Session",
    "SessionInfo",
    "SessionOptions",
    "TaskRef",
    "TestOutcome",
    "TransportSecurityError",
    "UnauthenticatedError",
    "UnavailableError",
    "opentelemetry_metadata",
]
