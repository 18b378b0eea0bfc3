"""Calls that change a node rather than a session, refused unless meant precisely (issue 46): a
Drain names the node it drains, a Prefetch keeps sandboxes for a bounded time. The real server,
edge and servicer on a real port over a fake pool (no Docker)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import grpc
import pytest
from fakes import FakePool, serving
from rlsandbox.daemon.api.limits import MAX_PREFETCH_TTL
from rlsandbox.daemon.session import SessionManager
from rlsandbox.v1 import sandbox_pb2 as pb
from rlsandbox.v1 import sandbox_pb2_grpc

Node = tuple[SessionManager, sandbox_pb2_grpc.SandboxServiceStub]


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    manager = SessionManager("n1", {"busybox": FakePool("busybox")}, max_sessions=4)
    async with serving(manager) as address, grpc.aio.insecure_channel(address) as channel:
        yield manager, sandbox_pb2_grpc.SandboxServiceStub(channel)


async def test_an_empty_or_misdirected_drain_drains_nothing(node: Node) -> None:
    """Before, an empty DrainRequest drained the node: any client on a node without tokens."""
    manager, stub = node
    for request in (pb.DrainRequest(), pb.DrainRequest(node_id="n2")):
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Drain(request)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "name the node to drain" in str(e.value.details())
        assert not manager.draining
    answer = await stub.Drain(pb.DrainRequest(node_id="n1"))
    assert answer.draining and manager.draining
    await stub.Drain(pb.DrainRequest(node_id="n1", undo=True))
    assert not manager.draining


@pytest.mark.parametrize("ttl", [math.inf, math.nan, -1.0, MAX_PREFETCH_TTL + 1])
async def test_a_prefetch_keeps_sandboxes_for_a_bounded_time(node: Node, ttl: float) -> None:
    """ttl = inf was accepted: sandboxes held for ever, whatever the node's budget for idle ones."""
    _, stub = node
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await stub.Prefetch(pb.PrefetchRequest(task=pb.Task(ref="sha256:" + "0" * 64), count=1, ttl=ttl))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "ttl must be between 0" in str(e.value.details())
