"""The API's field limits, checked from the protobuf descriptors (no daemon needed)."""

from __future__ import annotations

import pytest
from rlsandbox.daemon.api.limits import LimitExceeded, check
from rlsandbox.v1 import sandbox_pb2 as pb


def test_requests_within_limits_pass() -> None:
    check(pb.CreateSessionRequest(pool="python", labels={"run": "r1"}, env={"A": "1"}, workdir="/workspace"))
    check(pb.ExecRequest(session_id="s", argv=pb.Argv(args=["echo", "x" * 1000]), env={"K": "v"}))
    check(pb.ExecBatchRequest(requests=[pb.ExecRequest(session_id="s", shell="true")]))


@pytest.mark.parametrize(
    ("message", "named"),
    [
        (pb.GetSessionRequest(session_id="x" * 257), "GetSessionRequest.session_id: 257 characters"),
        (pb.CreateSessionRequest(labels={"k": "v" * 1025}), "CreateSessionRequest.labels['k']"),
        (pb.CreateSessionRequest(labels={"k" * 129: "v"}), "a key of 129 characters"),
        (pb.CreateSessionRequest(labels={f"k{i}": "v" for i in range(65)}), "65 entries"),
        (pb.CreateSessionRequest(env={f"K{i}": "v" * 100_000 for i in range(3)}), "characters in all"),
        (pb.ExecRequest(argv=pb.Argv(args=["a" * 200_000] * 6)), "ExecRequest.argv.args[0]"),
        (pb.ReadFilesRequest(paths=["/" + "p" * 5000]), "ReadFilesRequest.paths[0]"),
        (
            pb.ExecBatchRequest(requests=[pb.ExecRequest(session_id="s" * 300)]),
            "requests[0].session_id",
        ),
    ],
)
def test_fields_over_their_limit_are_named_without_the_value(message: object, named: str) -> None:
    with pytest.raises(LimitExceeded) as err:
        check(message)  # type: ignore[arg-type]
    assert named in str(err.value)
    assert len(str(err.value)) < 300
