"""The client's call table and typed options: one deadline and retry rule per call, shared by the
async and blocking clients; public results are the client's own types, never protobuf."""

from __future__ import annotations

import dataclasses
import inspect

import grpc
import pytest
import rlsandbox.client as client_api
from rlsandbox.client import NodeStatus, UnavailableError
from rlsandbox.client._errors import NotFoundError
from rlsandbox.client._policy import COMMAND_TIMEOUT, GRADE_TIMEOUT, POLICIES, TASK_SETUP, deadline, retry_after
from rlsandbox.client._requests import create_session_request, evaluate_request, exec_request
from rlsandbox.v1 import sandbox_pb2 as pb
from rlsandbox.v1 import sandbox_pb2_grpc


def test_every_rpc_has_a_policy() -> None:
    methods = {m for m in dir(sandbox_pb2_grpc.SandboxServiceServicer) if m[0].isupper()}
    assert methods == set(POLICIES)


def test_deadlines_add_what_the_node_may_take() -> None:
    assert deadline("Exec", exec_request("s", "ls", timeout=5), 60) == 65
    assert deadline("Exec", exec_request("s", "ls"), 60) == 60 + COMMAND_TIMEOUT
    assert deadline("CreateSession", create_session_request("p", acquire_timeout=7), 60) == 67
    with_task = create_session_request("p", task={"id": "t", "pool": "p"})
    assert deadline("CreateSession", with_task, 60) == 60 + TASK_SETUP
    assert deadline("Evaluate", evaluate_request("s"), 60) == 60 + GRADE_TIMEOUT
    batch = pb.ExecBatchRequest(requests=[exec_request("a", "x", timeout=3), exec_request("b", "y", timeout=9)])
    assert deadline("ExecBatch", batch, 10) == 19
    assert deadline("GetNodeStatus", pb.GetNodeStatusRequest(), 10) == 10


def test_only_calls_that_cannot_act_twice_are_retried() -> None:
    down = UnavailableError(grpc.StatusCode.UNAVAILABLE, "node restarting")
    assert retry_after("Exec", exec_request("s", "rm x"), down, 1) is None  # a step without seq may have run
    assert retry_after("Exec", exec_request("s", "rm x", seq=4), down, 1) is not None
    assert retry_after("CreateSession", create_session_request("p"), down, 1) is None
    assert retry_after("CreateSession", create_session_request("p", idempotency_key="k"), down, 1) is not None
    assert retry_after("ExecStream", exec_request("s", "ls", seq=1), down, 1) is None
    assert retry_after("ReadFiles", pb.ReadFilesRequest(), down, 1) is not None
    assert retry_after("ReadFiles", pb.ReadFilesRequest(), down, 4) is None  # attempts are bounded
    assert retry_after("ReadFiles", pb.ReadFilesRequest(), NotFoundError(grpc.StatusCode.NOT_FOUND, "gone"), 1) is None


def test_unknown_options_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="unknown exec options: timout"):
        exec_request("s", "ls", timout=5)
    with pytest.raises(TypeError, match="unknown session options: idle"):
        create_session_request("p", idle=5)


def test_node_status_is_the_clients_own_type() -> None:
    m = pb.NodeStatus(node_id="n", version="1", sessions=3, max_sessions=9, serving=True, load1=0.5)
    m.pools.add(name="py", image="img", ready=2, in_use=1, waiting=4, last_error="boom", acquired_waited_total=7)
    status = NodeStatus.from_pb(m)
    assert status.events is None and status.pools[0].waiting == 4 and status.pools[0].last_error == "boom"
    assert status.pools[0].acquired_waited_total == 7 and status.sessions == 3 and status.serving
    m.events.outbox_events = 5
    assert NodeStatus.from_pb(m).events.outbox_events == 5  # type: ignore[union-attr]


def test_no_protobuf_type_in_the_public_signatures() -> None:
    for name in client_api.__all__:
        obj = getattr(client_api, name)
        members = [obj] if inspect.isfunction(obj) else [m for _, m in inspect.getmembers(obj, inspect.isfunction)]
        for fn in members:
            if fn.__name__.startswith("_") or fn.__name__ == "from_pb":
                continue
            text = str(inspect.signature(fn))
            assert "pb." not in text and "_pb2" not in text, f"{name}.{fn.__name__}{text}"
        if dataclasses.is_dataclass(obj):
            for f in dataclasses.fields(obj):
                assert "pb." not in str(f.type), f"{name}.{f.name}: {f.type}"
