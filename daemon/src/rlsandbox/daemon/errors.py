"""The daemon's one exception hierarchy.

Every error a user can see is a subclass of :class:`SandboxError` that carries its gRPC status code
and structured fields; the gRPC layer maps them in one place. Anything else is a bug and becomes
INTERNAL there.
"""

from __future__ import annotations

from typing import Any, ClassVar

import grpc


class SandboxError(Exception):
    """Base of every error the daemon reports to a caller."""

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = {k: v for k, v in fields.items() if v is not None}

    def __str__(self) -> str:
        return self.message


class InvalidArgument(SandboxError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(SandboxError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(SandboxError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(SandboxError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, *, retry_after: float | None = None, **fields: Any) -> None:
        super().__init__(message, retry_after=retry_after, **fields)
        self.retry_after = retry_after


class Unavailable(SandboxError):
    """Retry the same call later (Docker unreachable, node shutting down)."""

    code = grpc.StatusCode.UNAVAILABLE


class Aborted(SandboxError):
    """Retry at a higher level: the sandbox is gone, start a new session."""

    code = grpc.StatusCode.ABORTED


class DeadlineExceeded(SandboxError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class DockerError(SandboxError):
    """The Docker engine answered with an error we did not expect."""

    code = grpc.StatusCode.INTERNAL

    def __init__(self, message: str, *, status: int | None = None, **fields: Any) -> None:
        super().__init__(message, status=status, **fields)
        self.status = status


class DockerUnavailable(Unavailable):
    """The Docker engine cannot be reached or did not answer in time."""


class ContainerNotFound(DockerError):
    code = grpc.StatusCode.ABORTED


class FileTooLarge(SandboxError):
    """A file or folder read from a sandbox is over the size limit of the operation."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class ArchiveCutShort(FailedPrecondition):
    """The engine's tarball of a path came back cut short, every time it was asked: something in
    the sandbox kept shrinking a file while it was read (the engine ends such a stream early, with
    no error, after the file it could not copy whole)."""


class ImageNotFound(DockerError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class SandboxDied(Aborted):
    """The sandbox's container or its agent went away."""


class AgentProtocolError(Aborted):
    """The in-sandbox agent sent something that is not the protocol; the sandbox is unusable."""


class PoolUnhealthy(Unavailable):
    """A pool keeps failing to create sandboxes and is backing off."""


class IllegalTransition(SandboxError):
    code = grpc.StatusCode.FAILED_PRECONDITION
