"""Typed errors mirroring the daemon's gRPC status codes."""

from __future__ import annotations

import socket
import ssl
from typing import Any

import grpc


class SandboxRPCError(Exception):
    """Base of every error the client raises for a failed call.

    Attributes:
        code: the gRPC status code.
        message: the daemon's message (it says what to do).
        retryable: whether repeating the same call later may succeed.
        fault: set when the session's sandbox died of its episode's own doing (its processes used
            up its memory, or wrote past its disk budget while the node's disk ran low): not an
            infra error, never to be masked; ``grade()`` of that session
            scores it reward 0 with this as its limit.
    """

    retryable = False

    def __init__(self, code: grpc.StatusCode, message: str, retry_after: float | None = None, fault: str = "") -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.fault = fault


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
    """The sandbox died (killed, OOM); retry the episode with a new session, unless ``fault`` is
    set: the episode killed it itself, and ``grade()`` scores it reward 0 (never mask that)."""


class DeadlineExceededError(SandboxRPCError):
    """The call's deadline passed."""


class UnauthenticatedError(SandboxRPCError):
    """Missing or wrong credentials."""


class InternalError(SandboxRPCError):
    """A bug in the daemon; its log has the traceback."""


class TransportSecurityError(SandboxRPCError):
    """Client and daemon disagree about TLS (a plaintext client on a TLS listener, a CA that did
    not sign the daemon's certificate, TLS to a plaintext listener). Not retryable: the
    configuration must change; the message says how."""


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


def error_for(code: grpc.StatusCode, message: str, retry_after: float | None = None, fault: str = "") -> SandboxRPCError:
    return _BY_CODE.get(code, InternalError)(code, message, retry_after, fault)


_TLS_HINTS = (
    ("CERTIFICATE_VERIFY_FAILED", "the daemon's certificate is not signed by the CA given as tls_ca (or has expired)"),
    ("WRONG_VERSION_NUMBER", "the listener does not speak TLS: connect without tls_ca, or to the daemon's TLS port"),
    ("certificate", "the daemon's certificate does not match the address (see tls_server_name)"),
)
_probed: dict[str, bool] = {}


def _speaks_tls(target: str) -> bool:
    """Whether ``host:port`` completes a TLS handshake (asked once per target, only after a
    plaintext connection was closed on us: never on a call that works)."""
    if target in _probed:
        return _probed[target]
    host, _, port = target.rpartition(":")
    answer = False
    if host and port.isdigit() and not target.startswith("unix:"):
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            with (
                socket.create_connection((host.strip("[]"), int(port)), timeout=1.0) as raw,
                context.wrap_socket(raw, server_hostname=None),
            ):
                answer = True
        except (OSError, ValueError):
            answer = False
    _probed[target] = answer
    return answer


def transport_security(code: grpc.StatusCode, details: str, target: str = "", tls: bool | None = None) -> str | None:
    """What is wrong with TLS between client and daemon, if that is why the call failed."""
    if code is not grpc.StatusCode.UNAVAILABLE:
        return None
    if "handshake failed" in details.lower():
        hint = next((h for key, h in _TLS_HINTS if key in details), "the TLS handshake failed")
        return f"TLS with {target or 'the daemon'} failed: {hint} ({details[-200:]})"
    if tls is False and target and "Socket closed" in details and _speaks_tls(target):
        return f"the daemon at {target} listens with TLS: pass tls_ca (and token) to the client"
    return None


def from_rpc_error(error: grpc.RpcError, target: str = "", tls: bool | None = None, node: str = "") -> SandboxRPCError:
    """The typed error of a failed call (``target`` and ``tls``: the client's, to tell TLS set-up
    mistakes, which are not retryable, from a daemon that is down; ``node``: the daemon's node id
    when known (cluster clients), named in the message: in a cluster, which node failed)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN  # type: ignore[attr-defined]
    details = error.details() if hasattr(error, "details") else str(error)  # type: ignore[attr-defined]
    if node:
        details = f"node {node} ({target}): {details}"
    security = transport_security(code, details or "", target, tls)
    if security is not None:
        return TransportSecurityError(code, security)
    retry_after = None
    fault = ""
    trailing: Any = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None  # type: ignore[attr-defined]
    for key, value in trailing or ():
        if key == "retry-after":
            try:
                retry_after = float(value)
            except ValueError:
                pass
        elif key == "rlsandbox-fault":
            fault = str(value)
    return error_for(code, details or "", retry_after, fault)


def error_from_name(name: str, message: str) -> SandboxRPCError:
    code = getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN)
    return error_for(code, message)
