"""`rlsandbox status --watch`: the text view of a node, with rates from the previous refresh."""

from __future__ import annotations

import time

from rlsandbox.client import NodeStatus
from rlsandbox.daemon.cli_serve import render_status
from rlsandbox.v1 import sandbox_pb2 as pb


def status(acquired: int, execs: int) -> NodeStatus:
    m = pb.NodeStatus(node_id="n1", version="1", sessions=3, max_sessions=10, docker_reachable=True, execs_total=execs)
    m.pools.add(name="python", image="img", ready=2, in_use=3, waiting=1, max_total=8, acquired_total=acquired, recycled_total=5)
    m.events.connected = False
    m.events.outbox_events = 7
    return NodeStatus.from_pb(m)


def test_first_view_and_rates_on_refresh() -> None:
    first = render_status(status(10, 100), None)
    assert "3/10 sessions, docker ok" in first and "/s)" not in first
    row = next(line for line in first.splitlines() if line.startswith("python"))
    assert row.split()[:9] == ["python", "2", "3", "0", "1", "8", "0", "5", "-"]
    assert "events: NOT CONNECTED" in first and "7 in the outbox" in first
    second = render_status(status(30, 300), (status(10, 100), time.monotonic() - 2.0))
    row = next(line for line in second.splitlines() if line.startswith("python"))
    assert abs(float(row.split()[8]) - 10.0) < 0.2  # 20 hand-outs in 2 s
    assert "(100.0/s)" in second or "(99.9/s)" in second
