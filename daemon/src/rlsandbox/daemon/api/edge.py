"""The API's edge: every request is decoded, size-checked and its errors mapped here, in one
place, around every handler.

- grpc decodes a request with the message's deserializer before the handler is called; a decode
  error there (invalid UTF-8 in a string field, corrupt wire bytes) used to escape as UNKNOWN with
  a logged traceback. Requests are decoded leniently here, and one that cannot be decoded, or that
  has a field over its limit (``api/limits.py``), ends INVALID_ARGUMENT with a message that says
  what to do and does not echo the input.
- A :class:`SandboxError` raised by a handler becomes its status code and message, with its
  structured fields (session, container, pool) as trailing metadata ``rlsandbox-<field>`` and in
  the log line; RESOURCE_EXHAUSTED carries ``retry-after``. Anything else is a bug: logged with its
  traceback, INTERNAL. Nothing reaches a client as UNKNOWN.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from rlsandbox.daemon import tracing
from rlsandbox.daemon.api.limits import LimitExceeded, check
from rlsandbox.daemon.errors import ResourceExhausted, SandboxError
from rlsandbox.daemon.logs import log_context
from rlsandbox.daemon.metrics import Metrics

log = logging.getLogger(__name__)

# The span of the call being served, while tracing is on (the edge records the call's status on it).
context_span: contextvars.ContextVar[Any] = contextvars.ContextVar("rlsandbox_call_span", default=None)


def _printable(value: object) -> str:
    """A metadata value: printable ASCII only (gRPC refuses anything else), at most 200 characters."""
    return "".join(c if " " <= c <= "~" else "?" for c in str(value)[:200])


async def abort_with(context: grpc.aio.ServicerContext, error: Exception, method: str) -> None:
    """The one mapping of exceptions to statuses (raises grpc.aio.AbortError)."""
    if isinstance(error, SandboxError):
        metadata = [(f"rlsandbox-{key.replace('_', '-')}", _printable(value)) for key, value in error.fields.items()]
        if isinstance(error, ResourceExhausted) and error.retry_after:
            metadata.append(("retry-after", f"{error.retry_after:.1f}"))
        if metadata:
            context.set_trailing_metadata(tuple(metadata))
        log.info("%s: %s", method, error.message[:300], extra={"code": error.code.name, "fields": error.fields})
        await context.abort(error.code, error.message)
    log.error("internal error in %s", method, exc_info=error)
    await context.abort(grpc.StatusCode.INTERNAL, f"internal error in {method}; see the daemon log")


def _code(context: grpc.aio.ServicerContext, error: BaseException | None) -> str:
    """The status code a call ended with, as its name."""
    if error is None:
        return "OK"
    if isinstance(error, SandboxError):
        return error.code.name
    if isinstance(error, grpc.aio.AbortError):
        status = context.code()
        return status.name if isinstance(status, grpc.StatusCode) else "UNKNOWN"
    if isinstance(error, asyncio.CancelledError):
        return "CANCELLED"
    return "INTERNAL"


def _trace_id(traceparent: Any) -> str:
    """The trace id of a W3C ``traceparent`` header (``00-<32 hex>-<16 hex>-<flags>``), else ''."""
    if not isinstance(traceparent, str):
        return ""
    parts = traceparent.split("-")
    if len(parts) == 4 and len(parts[1]) == 32 and all(c in "0123456789abcdef" for c in parts[1]):
        return parts[1]
    return ""


class _Undecodable:
    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


def _lenient(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserializer is None:
        return None

    def decode(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except (DecodeError, ValueError, UnicodeDecodeError) as e:
            return _Undecodable(type(e).__name__)

    return decode


def _problem(request: Any, method: str) -> str | None:
    if isinstance(request, _Undecodable):
        return (
            f"the request to {method} could not be decoded ({request.why}): a string field holds invalid UTF-8 "
            "or the bytes are not this API's message; send messages built with the generated rlsandbox.v1 code"
        )
    try:
        check(request)
    except LimitExceeded as e:
        return f"{e} (the limits of every field: docs/RELIABILITY.md)"
    return None


def with_behaviour(
    handler: grpc.RpcMethodHandler,
    unary: Callable[..., Any],
    stream: Callable[..., Any],
    request_deserializer: Callable[[bytes], Any] | None = None,
) -> grpc.RpcMethodHandler:
    """``handler`` with its behaviour replaced (the unary or the streaming one, as it has)."""
    des = request_deserializer or handler.request_deserializer
    ser = handler.response_serializer
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, request_deserializer=des, response_serializer=ser)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(stream, request_deserializer=des, response_serializer=ser)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, request_deserializer=des, response_serializer=ser)
    return grpc.stream_stream_rpc_method_handler(stream, request_deserializer=des, response_serializer=ser)


class EdgeInterceptor(grpc.aio.ServerInterceptor):
    """``metrics``: every call's latency by method and status code (metrics.py)."""

    def __init__(self, metrics: Metrics | None = None) -> None:
        self.metrics = metrics
        # Request ids for calls that bring none: a counter under a per-process prefix (every call
        # pays for it; a random id per call was a syscall per call).
        self._prefix = secrets.token_hex(3)
        self._ids = itertools.count(1)

    def _observe(self, method: str, context: grpc.aio.ServicerContext, started: float, error: BaseException | None) -> None:
        if self.metrics is None and not tracing.enabled():
            return
        code = _code(context, error)
        if self.metrics is not None:
            self.metrics.observe_rpc(method, code, time.perf_counter() - started)
        if tracing.enabled():
            current = context_span.get()
            if current is not None:
                tracing.finish(current, code)

    async def _failed(self, method: str, context: grpc.aio.ServicerContext, started: float, error: BaseException) -> None:
        """Count a call that failed and map its error to a status (abort_with raises AbortError);
        an abort or a cancellation already has its status and goes on as it is."""
        self._observe(method, context, started, error)
        if isinstance(error, Exception) and not isinstance(error, grpc.aio.AbortError):
            await abort_with(context, error, method)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = metadata.get("x-request-id")
        request_id = _printable(given) if given else f"{self._prefix}-{next(self._ids):x}"
        trace = _trace_id(metadata.get("traceparent"))
        inner: Any = handler.unary_unary
        stream_inner: Any = handler.unary_stream

        def call_context(request: Any) -> contextlib.AbstractContextManager[None]:
            session = getattr(request, "session_id", "")
            if not tracing.enabled():  # the path of every call when tracing is off: as it was
                return log_context(request=request_id, trace=trace, session=session)
            return traced(session)

        @contextlib.contextmanager
        def traced(session: str) -> Iterator[None]:
            with tracing.server_span(method, metadata, **{"rlsandbox.session": session, "rlsandbox.request": request_id}) as s:
                token = context_span.set(s)
                try:
                    with log_context(request=request_id, trace=tracing.trace_id(s) or trace, session=session):
                        yield
                finally:
                    context_span.reset(token)

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            problem = _problem(request, method)
            if problem is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            started = time.perf_counter()
            with call_context(request):
                try:
                    reply = await inner(request, context)
                except BaseException as e:
                    await self._failed(method, context, started, e)
                    raise
                self._observe(method, context, started, None)
                return reply

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            problem = _problem(request, method)
            if problem is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            started = time.perf_counter()
            with call_context(request):
                try:
                    async for item in stream_inner(request, context):
                        yield item
                except BaseException as e:
                    await self._failed(method, context, started, e)
                    raise
                self._observe(method, context, started, None)

        return with_behaviour(handler, unary, stream, _lenient(handler.request_deserializer))
