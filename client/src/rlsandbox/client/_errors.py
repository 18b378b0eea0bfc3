"""Typed errors mirroring the daemon's gRPC status codes."""

from __future__ import annotations

from typing import Any

import grpc


class SandboxRPCError(Exception):
    """Base of every error the client raises for a failed call.

    Attributes:
        code: the gRPC status code.
        message: the daemon's message (it says what to do).
        retryable: whether repeating the same call later may succeed.
    """

    retryable = False

    def __init__(self, code: grpc.StatusCode, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.retry_after = retry_after


class InvalidArgumentError(SandboxRPCError):
    """The request is malformed; fix it, do not retry."""


class NotFoundError(SandboxRPCError):
    """Unknown or ended session, or unknown pool; the message says when and why it ended."""


class FailedPreconditionError(SandboxRPCError):
    """The call cannot succeed in the current state; do not retry."""


class ResourceExhaustedError(SandboxRPCError):
    """The node or pool is full; retry after ``retry_after`` seconds or on another node."""

    retryable = True


class UnavailableError(SandboxRPCError):
    """The daemon or its Docker engine is unreachable or shutting down; retry the call."""

    retryable = True


class SandboxAbortedError(SandboxRPCError):
    """The sandbox died (killed, OOM); retry the episode with a new session."""


class DeadlineExceededError(SandboxRPCError):
    """The call's deadline passed."""


class UnauthenticatedError(SandboxRPCError):
    """Missing or wrong credentials."""


class InternalError(SandboxRPCError):
    """A bug in the daemon; its log has the traceback."""


_BY_CODE: dict[grpc.StatusCode, type[SandboxRPCError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPreconditionError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.ABORTED: SandboxAbortedError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
}


def error_for(code: grpc.StatusCode, message: str, retry_after: float | None = None) -> SandboxRPCError:
    return _BY_CODE.get(code, InternalError)(code, message, retry_after)


def from_rpc_error(error: grpc.RpcError) -> SandboxRPCError:
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
    details = error.details() if hasattr(error, "details") else str(error)  # type: ignore[attr-defined]
    retry_after = None
    trailing: Any = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None  # type: ignore[attr-defined]
    for key, value in trailing or ():
        if key == "retry-after":
            try:
                retry_after = float(value)
            except ValueError:
                pass
    return error_for(code, details or "", retry_after)


def error_from_name(name: str, message: str) -> SandboxRPCError:
    code = getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN)
    return error_for(code, message)
