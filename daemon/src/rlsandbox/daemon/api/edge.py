"""The API's edge: every request is decoded and size-checked here, before any handler runs.

grpc decodes a request with the message's deserializer before the handler is called; a decode
error there (invalid UTF-8 in a string field, corrupt wire bytes) used to escape as UNKNOWN with a
logged traceback. This interceptor decodes leniently, and a request that cannot be decoded, or
that has a field over its limit (``api/limits.py``), ends INVALID_ARGUMENT with a message that
says what to do and does not echo the input.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from rlsandbox.daemon.api.limits import LimitExceeded, check


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


class EdgeInterceptor(grpc.aio.ServerInterceptor):
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        method = handler_call_details.method.rsplit("/", 1)[-1]
        des, ser = _lenient(handler.request_deserializer), handler.response_serializer
        if handler.unary_unary:
            inner: Any = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                problem = _problem(request, method)
                if problem is not None:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
                return await inner(request, context)

            return grpc.unary_unary_rpc_method_handler(unary, request_deserializer=des, response_serializer=ser)
        stream_inner: Any = handler.unary_stream

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            problem = _problem(request, method)
            if problem is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
            async for item in stream_inner(request, context):
                yield item

        return grpc.unary_stream_rpc_method_handler(stream, request_deserializer=des, response_serializer=ser)
