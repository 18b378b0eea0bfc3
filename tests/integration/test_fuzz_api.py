"""Property-based fuzzing of every RPC: random values in every field of every request, built from
the protobuf descriptors, sent to a real daemon process. Whatever arrives, the answer is a precise
status (never UNKNOWN or INTERNAL) and the daemon stays healthy."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import TEST_OWNER
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlsandbox.v1 import sandbox_pb2 as pb

pytestmark = pytest.mark.docker

SERVICE = pb.DESCRIPTOR.services_by_name["SandboxService"]
LIVE = "__live_session__"
CONFIG = """
node_id = "{node}"
listen_tcp = "127.0.0.1:{port}"
reconcile_interval = 3600
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = 2
max_total = 12
"""

INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}
NASTY_TEXT = ["", "python", LIVE, "..", "../../etc/passwd", "/etc/shadow", "a\x00b", "x" * 300, "ünïcode ✓", "{}", "true"]


def scalar(f: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = f.type
    if t == FieldDescriptor.TYPE_STRING:
        return st.one_of(st.sampled_from(NASTY_TEXT), st.text(max_size=30))
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        width = 64 if t == FieldDescriptor.TYPE_DOUBLE else 32
        return st.one_of(st.floats(allow_nan=True, allow_infinity=True, width=width), st.sampled_from([-1.0, 0.0, 0.5, 1e9]))
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_ENUM:
        return st.integers(-2, 12)  # proto3 enums are open: unknown numbers arrive too
    if t in INT_RANGES:
        lo, hi = INT_RANGES[t]
        return st.one_of(st.integers(lo, hi), st.sampled_from([max(lo, -1), 0, 1, min(hi, 2**31 - 1)]))
    raise AssertionError(f"no strategy for field type {t}")


def message(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    cls = getattr(pb, descriptor.name, None)
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for f in descriptor.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            parts[f.name] = st.dictionaries(scalar(key), scalar(value), max_size=3)
            continue
        if f.message_type is not None:
            if depth >= 2:
                continue
            elem: st.SearchStrategy[Any] = message(f.message_type, depth + 1)
        else:
            elem = scalar(f)
        parts[f.name] = st.lists(elem, max_size=3) if f.is_repeated else elem

    def build(**values: Any) -> Any:
        msg = (cls or descriptor._concrete_class)()
        for name, v in values.items():
            if v is None:
                continue
            f = descriptor.fields_by_name[name]
            if f.message_type is not None and f.message_type.GetOptions().map_entry:
                getattr(msg, name).update(v)
            elif f.is_repeated:
                if f.message_type is not None:
                    for item in v:
                        getattr(msg, name).add().CopyFrom(item)
                else:
                    getattr(msg, name).extend(v)
            elif f.message_type is not None:
                getattr(msg, name).CopyFrom(v)
            else:
                setattr(msg, name, v)
        return msg

    return st.builds(build, **{k: st.none() | v for k, v in parts.items()})


def _substitute(msg: Any, live: str) -> None:
    """Put the live session's id wherever the fuzzer drew the LIVE marker (to reach deeper code)."""
    for f, value in msg.ListFields():
        if f.type == FieldDescriptor.TYPE_STRING and not f.is_repeated and value == LIVE:
            setattr(msg, f.name, live)
        elif f.message_type is not None and not f.message_type.GetOptions().map_entry:
            for item in value if f.is_repeated else [value]:
                _substitute(item, live)


@pytest.fixture(scope="module")
def daemon_target(images: dict[str, str]) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "daemon.toml"
        config.write_text(CONFIG.format(node=f"{TEST_OWNER}-fuzz", port=port))
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlsandbox.daemon.cli", "--log-level", "WARNING", "daemon", "--config", str(config)],
            stdout=subprocess.DEVNULL,
        )
        target = f"127.0.0.1:{port}"
        try:
            channel = grpc.insecure_channel(target)
            deadline = time.monotonic() + 120
            while True:
                try:
                    grpc.channel_ready_future(channel).result(timeout=1)
                    pb.Session  # noqa: B018 - the module is importable
                    break
                except grpc.FutureTimeoutError:
                    assert time.monotonic() < deadline and proc.poll() is None, "daemon did not start"
            channel.close()
            yield target
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(120) == 0


@pytest.fixture(scope="module")
def live_session(daemon_target: str) -> Iterator[tuple[grpc.Channel, str]]:
    channel = grpc.insecure_channel(daemon_target, options=[("grpc.max_send_message_length", 64 << 20)])
    create = channel.unary_unary(
        "/rlsandbox.v1.SandboxService/CreateSession",
        request_serializer=pb.CreateSessionRequest.SerializeToString,
        response_deserializer=pb.Session.FromString,
    )
    session = create(pb.CreateSessionRequest(pool="python", acquire_timeout=60), timeout=90)
    yield channel, session.session_id
    channel.close()


ALLOWED_FAILURES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.OUT_OF_RANGE,
}


@pytest.mark.parametrize("method", [m.name for m in SERVICE.methods])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_every_rpc_answers_random_requests_precisely(live_session: tuple[grpc.Channel, str], method: str, data: Any) -> None:
    channel, live = live_session
    m = SERVICE.methods_by_name[method]
    request = data.draw(message(m.input_type))
    _substitute(request, live)
    if method == "CloseSession" and request.session_id == live:
        request.session_id = "not-the-live-one"  # keep the live session for the other examples
    if method == "CreateSession":
        request.idle_timeout = 5.0  # whatever it creates is reaped soon: nothing outlives the test
    path = f"/rlsandbox.v1.SandboxService/{method}"
    request_cls = getattr(pb, m.input_type.name)
    response_cls = getattr(pb, m.output_type.name)
    kwargs = {"request_serializer": request_cls.SerializeToString, "response_deserializer": response_cls.FromString}
    try:
        if m.server_streaming:
            for _ in channel.unary_stream(path, **kwargs)(request, timeout=20):
                pass
        else:
            channel.unary_unary(path, **kwargs)(request, timeout=20)
    except grpc.RpcError as e:
        assert e.code() in ALLOWED_FAILURES, f"{method}: {e.code()} {e.details()} for {request}"
        assert e.details(), f"{method}: {e.code()} without a message"


def test_daemon_is_healthy_after_the_fuzzing(live_session: tuple[grpc.Channel, str]) -> None:
    channel, _ = live_session
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    # Close whatever the fuzzer created (it also idles out in 5 s).
    listing = channel.unary_unary(
        "/rlsandbox.v1.SandboxService/ListSessions",
        request_serializer=pb.ListSessionsRequest.SerializeToString,
        response_deserializer=pb.ListSessionsResponse.FromString,
    )(pb.ListSessionsRequest(), timeout=10)
    close = channel.unary_unary(
        "/rlsandbox.v1.SandboxService/CloseSession",
        request_serializer=pb.CloseSessionRequest.SerializeToString,
        response_deserializer=pb.CloseSessionResponse.FromString,
    )
    for s in listing.sessions:
        close(pb.CloseSessionRequest(session_id=s.session_id), timeout=60)
    assert os.getpid() > 0


@pytest.mark.parametrize("method", [m.name for m in SERVICE.methods])
def test_undecodable_requests_are_invalid_argument(live_session: tuple[grpc.Channel, str], method: str) -> None:
    """Corrupt wire bytes and invalid UTF-8 in a string field: INVALID_ARGUMENT saying what to do."""
    channel, _ = live_session
    m = SERVICE.methods_by_name[method]
    identity = {"request_serializer": lambda b: b, "response_deserializer": lambda b: b}
    path = f"/rlsandbox.v1.SandboxService/{method}"
    first_string = next((f for f in m.input_type.fields if f.type == FieldDescriptor.TYPE_STRING), None)
    bad_utf8 = bytes([(first_string.number << 3) | 2, 2, 0xFF, 0xFE]) if first_string else b"\xff\xff\xff"
    for raw in (b"\xff\xff\xff\xff\x0f", bad_utf8):
        call = channel.unary_stream(path, **identity) if m.server_streaming else channel.unary_unary(path, **identity)
        with pytest.raises(grpc.RpcError) as err:
            result = call(raw, timeout=20)
            if m.server_streaming:
                list(result)
        if m.input_type.fields or raw == bad_utf8:
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err.value.code(), err.value.details())
            assert "could not be decoded" in (err.value.details() or "")


def test_oversized_fields_are_named_not_echoed(live_session: tuple[grpc.Channel, str]) -> None:
    channel, _ = live_session
    get = channel.unary_unary(
        "/rlsandbox.v1.SandboxService/GetSession",
        request_serializer=pb.GetSessionRequest.SerializeToString,
        response_deserializer=pb.Session.FromString,
    )
    huge = "z" * (1 << 20)
    with pytest.raises(grpc.RpcError) as err:
        get(pb.GetSessionRequest(session_id=huge), timeout=20)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert "GetSessionRequest.session_id" in details and "256" in details and len(details) < 500
    create = channel.unary_unary(
        "/rlsandbox.v1.SandboxService/CreateSession",
        request_serializer=pb.CreateSessionRequest.SerializeToString,
        response_deserializer=pb.Session.FromString,
    )
    for request, field in (
        (pb.CreateSessionRequest(pool="python", labels={"big": "v" * (10 << 20)}), "labels"),
        (pb.CreateSessionRequest(pool="python", env={"BIG": "v" * (10 << 20)}), "env"),
        (pb.CreateSessionRequest(pool="python", labels={f"k{i}": "v" for i in range(1000)}), "labels"),
    ):
        with pytest.raises(grpc.RpcError) as err:
            create(request, timeout=20)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in (err.value.details() or "")
        assert len(err.value.details() or "") < 500


def test_domain_errors_carry_their_fields(live_session: tuple[grpc.Channel, str]) -> None:
    """One interceptor maps every error: the status, the message, and the error's structured
    fields as trailing metadata (here the session an exec ran into)."""
    channel, _ = live_session
    create = channel.unary_unary(
        "/rlsandbox.v1.SandboxService/CreateSession",
        request_serializer=pb.CreateSessionRequest.SerializeToString,
        response_deserializer=pb.Session.FromString,
    )
    execute = channel.unary_unary(
        "/rlsandbox.v1.SandboxService/Exec",
        request_serializer=pb.ExecRequest.SerializeToString,
        response_deserializer=pb.ExecResult.FromString,
    )
    close = channel.unary_unary(
        "/rlsandbox.v1.SandboxService/CloseSession",
        request_serializer=pb.CloseSessionRequest.SerializeToString,
        response_deserializer=pb.CloseSessionResponse.FromString,
    )
    sid = create(pb.CreateSessionRequest(pool="python", acquire_timeout=60), timeout=90).session_id
    try:
        execute(pb.ExecRequest(session_id=sid, shell="true", seq=1), timeout=20)
        with pytest.raises(grpc.RpcError) as err:
            execute(pb.ExecRequest(session_id=sid, shell="false", seq=1), timeout=20)
    finally:
        close(pb.CloseSessionRequest(session_id=sid), timeout=60)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    trailing = dict(err.value.trailing_metadata() or ())
    assert trailing.get("rlsandbox-session-id") == sid, trailing
