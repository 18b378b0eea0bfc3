"""A real OTLP/gRPC trace receiver on a real port, for the tracing tests: it keeps every span the
daemon's exporter sends (what a collector such as Jaeger or the OpenTelemetry Collector gets)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[Any] = []  # opentelemetry.proto.trace.v1.Span
        self.resources: list[dict[str, str]] = []

    async def Export(self, request: Any, context: Any) -> Any:
        for rs in request.resource_spans:
            self.resources.append({a.key: a.value.string_value for a in rs.resource.attributes})
            for ss in rs.scope_spans:
                self.spans.extend(ss.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def named(self, name: str) -> list[Any]:
        return [s for s in self.spans if s.name == name]


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span.attributes:
        v = a.value
        out[a.key] = getattr(v, v.WhichOneof("value"))
    return out


@asynccontextmanager
async def otlp_receiver() -> AsyncIterator[tuple[Receiver, str]]:
    """``(receiver, "http://127.0.0.1:<port>")``."""
    receiver = Receiver()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield receiver, f"http://127.0.0.1:{port}"
    finally:
        await server.stop(0)
