"""OpenTelemetry tracing: the real edge and servicer on a real port over a fake pool, spans through
the real OTLP exporter to a real OTLP/gRPC receiver. A call continues the trainer's trace (the
client sends the trace context as metadata), steps inside a call are child spans, a failed call's
span says how it failed, and events and log lines carry the trace id."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator

import orjson
import pytest
from fakes import FakePool, FakePublisher, serving
from opentelemetry import trace as otel
from otlp import Receiver, attributes, otlp_receiver
from rlsandbox.client import AsyncClient, NotFoundError, opentelemetry_metadata
from rlsandbox.daemon import tracing
from rlsandbox.daemon.config import DaemonConfig
from rlsandbox.daemon.session import SessionManager

TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
PARENT_SPAN = 0x00F067AA0BA902B7


@pytest.fixture
async def node() -> AsyncIterator[tuple[str, FakePublisher]]:
    events = FakePublisher()
    manager = SessionManager("n1", {"busybox": FakePool("busybox")}, max_sessions=4, events=events)  # type: ignore[arg-type]
    async with serving(manager) as address:
        yield address, events


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with otlp_receiver() as (receiver, endpoint):
        tracing.configure(endpoint, node_id="n1")
        try:
            yield receiver
        finally:
            await asyncio.to_thread(tracing.shutdown)


async def test_calls_continue_the_trainers_trace_with_child_spans_and_ids_in_events_and_logs(
    node: tuple[str, FakePublisher], receiver: Receiver, captured: io.StringIO
) -> None:
    address, events = node
    parent = otel.SpanContext(TRACE_ID, PARENT_SPAN, is_remote=False, trace_flags=otel.TraceFlags(otel.TraceFlags.SAMPLED))
    async with AsyncClient(address, timeout=10, metadata=opentelemetry_metadata) as client:
        with otel.use_span(otel.NonRecordingSpan(parent)):
            s = await client.create_session("busybox")
            assert (await s.exec("echo hi")).exit_code == 0
            with pytest.raises(NotFoundError):
                await client.exec("n1-nope", "true")
        await s.close()  # outside the trainer's span: a trace of its own
    await asyncio.to_thread(tracing.shutdown)  # exports what is buffered

    [create] = receiver.named("CreateSession")
    [ok_exec, failed_exec] = sorted(receiver.named("Exec"), key=lambda sp: sp.start_time_unix_nano)
    [close] = receiver.named("CloseSession")
    for span in (create, ok_exec, failed_exec):
        assert int.from_bytes(span.trace_id, "big") == TRACE_ID
        assert int.from_bytes(span.parent_span_id, "big") == PARENT_SPAN
        assert span.kind == span.SPAN_KIND_SERVER
    assert int.from_bytes(close.trace_id, "big") != TRACE_ID and not close.parent_span_id
    assert attributes(create)["rpc.grpc.status_code"] == "OK" and attributes(create)["rpc.method"] == "CreateSession"
    assert attributes(ok_exec)["rlsandbox.session"] == s.id
    assert attributes(failed_exec)["rpc.grpc.status_code"] == "NOT_FOUND"
    assert (
        failed_exec.status.code == failed_exec.status.STATUS_CODE_ERROR
        and ok_exec.status.code != ok_exec.status.STATUS_CODE_ERROR
    )
    [acquire] = receiver.named("pool.acquire")  # a step of CreateSession, as its child
    assert acquire.parent_span_id == create.span_id and attributes(acquire)["rlsandbox.pool"] == "busybox"
    assert receiver.resources[0]["service.name"] == "rlsandbox-daemon" and receiver.resources[0]["service.instance.id"] == "n1"

    trace_hex = f"{TRACE_ID:032x}"
    by_type = {e.type: e for e in events.events if e.session == s.id}
    assert by_type["created"].data["trace"] == trace_hex and by_type["step"].data["trace"] == trace_hex
    assert by_type["closed"].data["trace"] == f"{int.from_bytes(close.trace_id, 'big'):032x}"  # the node's own trace
    lines = [orjson.loads(line) for line in captured.getvalue().splitlines()]
    refused = [line for line in lines if line.get("code") == "NOT_FOUND"]
    assert refused and refused[-1]["trace"] == trace_hex


async def test_off_means_no_span_no_trace_field_and_the_shared_no_op(node: tuple[str, FakePublisher]) -> None:
    address, events = node
    assert not tracing.enabled()
    assert tracing.span("grade.tests", a=1) is tracing.span("pool.acquire")  # one shared no-op, nothing allocated
    async with AsyncClient(address, timeout=10) as client, client.session("busybox") as s:
        await s.exec("true")
    assert all("trace" not in e.data for e in events.events)


def test_an_endpoint_that_is_not_a_url_is_refused_at_configuration() -> None:
    with pytest.raises(ValueError, match=r"tracing_otlp_endpoint '127\.0\.0\.1:4317' must be http://host:port"):
        DaemonConfig.model_validate({"tracing_otlp_endpoint": "127.0.0.1:4317"})
