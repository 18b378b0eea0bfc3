"""Authentication of API calls: TLS on TCP listeners and bearer tokens from a file.

A TCP listener on a non-loopback address must have TLS and tokens (the daemon refuses to start
otherwise); loopback TCP and the unix socket may be open by configuration. Tokens are compared in
constant time; a missing or wrong token is UNAUTHENTICATED, before any handler runs.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from rlsandbox.daemon.api.edge import with_behaviour
from rlsandbox.daemon.errors import InvalidArgument


def load_tokens(path: str | Path) -> list[bytes]:
    """One token per line (blank lines and '#' comments skipped); at least one, 16+ characters."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise InvalidArgument(f"cannot read auth_token_file {path}: {e}") from None
    tokens = [line.strip().encode() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not tokens:
        raise InvalidArgument(f"auth_token_file {path} holds no token")
    short = [t for t in tokens if len(t) < 16]
    if short:
        raise InvalidArgument(f"auth_token_file {path}: tokens must be at least 16 characters")
    return tokens


def is_loopback(listen: str) -> bool:
    host = listen.rsplit(":", 1)[0].strip("[]") or "0.0.0.0"
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_credentials(cert: str, key: str) -> grpc.ServerCredentials:
    try:
        pair = (Path(key).read_bytes(), Path(cert).read_bytes())
    except OSError as e:
        raise InvalidArgument(f"cannot read tls_cert/tls_key: {e}") from None
    return grpc.ssl_server_credentials([pair])


class BearerTokenInterceptor(grpc.aio.ServerInterceptor):
    """Lets a call through only with ``authorization: Bearer <one of the tokens>``."""

    def __init__(self, tokens: list[bytes]) -> None:
        self._tokens = tokens

    def _allowed(self, metadata: Any) -> bool:
        for key, value in metadata or ():
            if key == "authorization":
                raw = value.encode() if isinstance(value, str) else bytes(value)
                if raw.startswith(b"Bearer "):
                    presented = raw[7:].strip()
                    # Compare with every token, always: no early exit that times the match.
                    return any([hmac.compare_digest(presented, t) for t in self._tokens])
        return False

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if (
            handler is None
            or handler_call_details.method.startswith(OPEN_PREFIX)
            or self._allowed(handler_call_details.invocation_metadata)
        ):
            return handler
        return _denied(handler)


# The standard health service answers without a token: probes (kubelet's gRPC probe, load
# balancers) send no metadata, and SERVING or not tells nothing about sessions.
OPEN_PREFIX = "/grpc.health.v1.Health/"


_MESSAGE = "missing or wrong bearer token: send 'authorization: Bearer <token>' (client: token=...) over TLS"


def _denied(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, _MESSAGE)

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, _MESSAGE)
        yield  # pragma: no cover - abort raises

    return with_behaviour(handler, unary, stream)
