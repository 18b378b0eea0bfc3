"""OpenTelemetry tracing of the node's calls: off by default, and then free.

With ``tracing_otlp_endpoint`` set, every RPC is a server span named after its method, child of
the trainer's span when the call carries a W3C ``traceparent`` (gRPC metadata; the client sends
it with ``AsyncClient(metadata=opentelemetry_metadata)``). The steps worth seeing inside a call
are child spans: taking a sandbox from the pool and preparing a task's workspace in
CreateSession, and each clean-room step of Evaluate (room, archive, plan, apply, tests, report).
Spans go to an OTLP/gRPC collector in batches, off the event loop (the SDK's exporter thread).
The span's trace id is the ``trace`` field of the call's log lines and of the events it emits.

Off, nothing of OpenTelemetry is imported: :func:`span` returns one shared no-op context manager
and the edge takes its untraced path (measured: docs/BENCHMARKS.md, "Tracing").
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger(__name__)

_tracer: Any = None  # an opentelemetry Tracer while tracing is on
_provider: Any = None
_NOOP = contextlib.nullcontext()


def enabled() -> bool:
    return _tracer is not None


def configure(endpoint: str, *, node_id: str, sample_ratio: float = 1.0, service: str = "rlsandbox-daemon") -> None:
    """Start exporting spans to the OTLP/gRPC collector at ``endpoint`` (``http://host:4317``
    plaintext, ``https://`` with TLS). Raises RuntimeError if OpenTelemetry is not installed."""
    global _tracer, _provider
    try:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as e:
        raise RuntimeError(
            f"tracing_otlp_endpoint is set but OpenTelemetry is not installed ({e.name}); "
            "pip install 'rlsandbox-daemon[tracing]' or unset tracing_otlp_endpoint"
        ) from None
    resource = Resource.create({"service.name": service, "service.instance.id": node_id})
    provider = TracerProvider(resource=resource, sampler=ParentBased(TraceIdRatioBased(sample_ratio)))
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    _provider = provider
    _tracer = provider.get_tracer("rlsandbox.daemon")
    log.info("tracing: spans to %s (sampled %.0f%%)", endpoint, sample_ratio * 100)


def shutdown() -> None:
    """Export what is buffered (the SDK bounds this by its own timeout) and turn tracing off."""
    global _tracer, _provider
    provider, _tracer, _provider = _provider, None, None
    if provider is not None:
        provider.shutdown()


def span(name: str, **attributes: Any) -> contextlib.AbstractContextManager[Any]:
    """A child span of the current one around a block; the shared no-op when tracing is off."""
    if _tracer is None:
        return _NOOP
    return _tracer.start_as_current_span(name, attributes={k: v for k, v in attributes.items() if v not in (None, "")})


@contextlib.contextmanager
def server_span(method: str, metadata: Mapping[str, Any], **attributes: Any) -> Iterator[Any]:
    """The span of one RPC, continuing the caller's trace from ``metadata`` (W3C trace context).
    Yields the span (``.get_span_context().trace_id``); the edge sets its status code."""
    from opentelemetry.propagate import extract
    from opentelemetry.trace import SpanKind

    parent = extract({k: v for k, v in metadata.items() if isinstance(v, str)})
    attrs = {"rpc.system": "grpc", "rpc.service": "rlsandbox.v1.SandboxService", "rpc.method": method}
    attrs.update({k: v for k, v in attributes.items() if v not in (None, "")})
    with _tracer.start_as_current_span(method, context=parent, kind=SpanKind.SERVER, attributes=attrs) as s:
        yield s


def finish(s: Any, code: str) -> None:
    """Record the call's gRPC status on its span (an error status for anything but OK)."""
    from opentelemetry.trace import Status, StatusCode

    s.set_attribute("rpc.grpc.status_code", code)
    if code != "OK":
        s.set_status(Status(StatusCode.ERROR, code))


def trace_id(s: Any) -> str:
    ctx = s.get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.trace_id else ""
