"""The cluster client's placement (client/_cluster.py Placement), on node tables built by hand:
power-of-two choices by room, never a full, draining or non-serving node, a burst between two
refreshes spread by the client's own bookkeeping, batches grouped by node."""

from __future__ import annotations

import collections
import random

import pytest
from rlsandbox.client import BatchCommand
from rlsandbox.client._cluster import Placement, _reassemble
from rlsandbox.v1 import sandbox_pb2 as pb


def table(*nodes: tuple[str, int, dict[str, int], bool, bool]) -> pb.Cluster:
    return pb.Cluster(
        nodes=[
            pb.ClusterNode(node_id=n, address=f"{n}:7420", free=free, ready=ready, serving=up, draining=drain)
            for n, free, ready, up, drain in nodes
        ]
    )


def test_a_burst_between_refreshes_spreads_by_room_and_skips_nodes_that_cannot_take_it() -> None:
    p = Placement(["a:7420"], choices=2, refresh=2.0, rng=random.Random(7))
    room = [("a", 40, {"py": 4}, True, False), ("b", 40, {"py": 4}, True, False), ("c", 20, {}, True, False)]
    none = [("full", 0, {"py": 9}, True, False), ("down", 50, {}, False, False), ("drain", 50, {}, True, True)]
    p.update(table(*room, *none))
    counts: collections.Counter[str] = collections.Counter()
    for _ in range(90):
        node = p.pick("py", set())
        assert node is not None and node.node_id in {"a", "b", "c"}
        p.placed(node, "py")
        counts[node.node_id] += 1
    # The bookkeeping keeps every node near its share of the room (40:40:20, ready sandboxes first).
    assert abs(counts["a"] - counts["b"]) <= 6 and 10 <= counts["c"] <= 24, counts
    assert p.nodes["a"].ready["py"] == 0 and p.placements == dict(counts)
    assert p.pick("py", {"a", "b", "c"}) is None  # all tried: none left
    with pytest.raises(Exception, match="no node of the cluster has room"):
        raise p.none_left({"a", "b", "c"}, None)


def test_ready_sandboxes_of_the_pool_weigh_more_than_free_slots() -> None:
    p = Placement(["x:1"], choices=2, refresh=2.0, rng=random.Random(1))
    p.update(table(("warm", 5, {"py": 5}, True, False), ("cold", 20, {}, True, False)))
    assert p.pick("py", set()).node_id == "warm"  # type: ignore[union-attr]  # 5 + 4*5 > 20
    assert p.pick("other-pool", set()).node_id == "cold"  # type: ignore[union-attr]


def test_a_batch_is_grouped_by_node_and_answers_come_back_in_order() -> None:
    p = Placement(["a:7420"], choices=2, refresh=2.0, rng=None)
    p.update(table(("a", 1, {}, True, False), ("b", 1, {}, True, False)))
    commands = [BatchCommand(f"{n}-{i:016x}", "true") for i, n in enumerate("abab")]
    groups = p.by_node(commands)
    assert groups == {"a:7420": [0, 2], "b:7420": [1, 3]}
    assert _reassemble(4, groups, [["a0", "a2"], ["b1", "b3"]]) == ["a0", "b1", "a2", "b3"]
    with pytest.raises(KeyError, match="on no node of the table"):
        p.address_of("z-0000000000000000")


def test_sessions_spread_in_proportion_to_the_nodes_capacities() -> None:
    """Issue 16's measure: after placing 1,000, each node's share is within 10% of its capacity share."""
    sizes = {"big": 1000, "mid": 600, "small": 400}
    p = Placement(["big:1"], choices=2, refresh=60.0, rng=random.Random(3))
    p.update(
        pb.Cluster(
            nodes=[pb.ClusterNode(node_id=k, address=f"{k}:1", free=v, max_sessions=v, serving=True) for k, v in sizes.items()]
        )
    )
    for _ in range(1000):
        node = p.pick("", set())
        assert node is not None
        p.placed(node, "")
    for k, size in sizes.items():
        share, expected = p.placements[k] / 1000, size / sum(sizes.values())
        assert abs(share - expected) <= 0.1 * expected, p.placements


def test_node_records_from_the_bus_are_checked_before_use() -> None:
    """cluster.node_record: the node table is anyone's to write to on an open NATS; a reader
    takes only live records of a node under its own key, with an address and counts in range."""
    import math

    from rlsandbox.daemon.cluster import MAX_FUTURE, node_record

    now, ttl = 1_000_000.0, 6.0
    good = {"node": "n1", "address": "10.0.0.1:7420", "sessions": 2, "max_sessions": 10, "free": 8,
            "pools": {"py": {"ready": 1, "in_use": 2, "max_total": 4}}, "load1": 0.5, "serving": True,
            "draining": False, "ts": now - 1}  # fmt: skip
    assert node_record("n1", good, now, ttl) == good
    assert node_record("n1", {**good, "extra": "x" * 10**6}, now, ttl) == good  # unknown fields are dropped
    assert node_record("n1", {**good, "address": "[::1]:7420"}, now, ttl) is not None
    bad = [
        {**good, "ts": "soon"}, {**good, "ts": 1e308}, {**good, "ts": math.nan}, {**good, "ts": now + MAX_FUTURE + 1},
        {**good, "ts": now - ttl - 1}, {**good, "ts": True}, {**good, "node": "n2"}, {**good, "node": ""},
        {**good, "address": "evil"}, {**good, "address": "a b:1"}, {**good, "sessions": -1}, {**good, "free": 11},
        {**good, "free": "8"}, {**good, "free": True}, {**good, "load1": math.inf}, {**good, "pools": []},
        {**good, "pools": {"py": {"ready": -1}}}, {**good, "serving": "yes"}, [good], None, "x",
    ]  # fmt: skip
    for value in bad:
        assert node_record("n1", value, now, ttl) is None, value
