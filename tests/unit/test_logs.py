"""Structured logs: JSON lines with the node, session, request and trace ids; a text format for
terminals; levels per component. The API test runs the real gRPC server, edge interceptor and
servicer on a real port over a session manager with a fake pool (no Docker)."""

from __future__ import annotations

import io
import logging
from collections.abc import AsyncIterator

import grpc
import orjson
import pytest
from fakes import FakePool, serving
from rlsandbox.client import AsyncClient, NotFoundError
from rlsandbox.daemon import logs
from rlsandbox.daemon.session import SessionManager
from rlsandbox.v1 import sandbox_pb2, sandbox_pb2_grpc


def lines(out: io.StringIO) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in out.getvalue().splitlines()]


def test_json_lines_carry_node_context_and_extra_fields(captured: io.StringIO) -> None:
    logs.set_node_fields(node="n7")
    log = logging.getLogger("rlsandbox.daemon.session.manager")
    with logs.log_context(request="r1", session="s-from-context"):
        log.info("closed: %s", "done", extra={"session": "s-explicit", "pool": "py"})
    logging.getLogger("rlsandbox.daemon.pool.warm_pool").info("hidden: pool logs at WARNING and above")
    [line] = lines(captured)
    assert line["msg"] == "closed: done" and line["level"] == "INFO" and line["logger"] == "rlsandbox.daemon.session.manager"
    assert (line["node"], line["request"], line["session"], line["pool"]) == ("n7", "r1", "s-explicit", "py")
    assert str(line["ts"]).endswith("+00:00")


def test_text_format_and_level_specs() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        logs.configure("WARNING", "text", stream=out)
        logging.getLogger("x").warning("slow disk", extra={"session": "s1"})
        logging.getLogger("x").info("not shown")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert out.getvalue().rstrip().endswith("WARNING x: slow disk [session=s1]")
    assert logs.parse_levels("DEBUG,grading=ERROR") == (logging.DEBUG, {"rlsandbox.daemon.grading": logging.ERROR})
    with pytest.raises(ValueError, match="unknown log level 'LOUD'"):
        logs.parse_levels("LOUD")


@pytest.fixture
async def api(captured: io.StringIO) -> AsyncIterator[str]:
    async with serving(SessionManager("n1", {"busybox": FakePool("busybox")}, max_sessions=4)) as address:
        yield address


async def test_an_error_reaches_the_client_typed_and_the_log_with_its_ids(api: str, captured: io.StringIO) -> None:
    async with AsyncClient(api, timeout=10) as client:
        s = await client.create_session("busybox")
        assert (await s.exec("echo hi")).exit_code == 0
        await s.close()
        with pytest.raises(NotFoundError, match="ended 0 s ago: closed by client"):
            await s.exec("echo again")
    async with grpc.aio.insecure_channel(api) as channel:
        stub = sandbox_pb2_grpc.SandboxServiceStub(channel)
        traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        call = stub.GetSession(
            sandbox_pb2.GetSessionRequest(session_id="n1-nope"),
            metadata=(("x-request-id", "req-42"), ("traceparent", traceparent)),
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() is grpc.StatusCode.NOT_FOUND
        assert ("rlsandbox-session-id", "n1-nope") in tuple(await call.trailing_metadata())
    refused = [line for line in lines(captured) if line.get("code") == "NOT_FOUND"]
    assert refused[-1]["request"] == "req-42" and refused[-1]["trace"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert refused[-1]["session"] == "n1-nope" and refused[-1]["session_id"] == "n1-nope"
    assert any(line["msg"].startswith("session closed") and line["session"] == s.id for line in lines(captured))  # type: ignore[union-attr]
