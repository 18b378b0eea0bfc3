"""A cluster of three node processes on one machine: what placement by the client costs, how it
spreads sessions, and how fast the cluster notices a dead node.

    python -m rlsandbox.loadtest.cluster_bench [--samples 60] [--spread 1000] [--json out.json]

Three real daemon processes (own node ids, ports, journals) and one embedded nats-server:

- placement overhead: CreateSession through a ClusterClient against the same call through a plain
  AsyncClient to one node, alternating, sessions closed at once (warm pools);
- spread: the ClusterClient's placement (the same code) choosing nodes for ``spread`` sessions on a
  table of three nodes with free capacities 1,000, 600 and 400, each choice followed by the client's own
  bookkeeping, without refresh in between: the share of each node against its capacity share;
- a dead node: one daemon SIGKILLed (no orderly leave), the time until GetCluster stops listing it
  (its entry expires three heartbeat intervals after its last write; the heartbeat here is 1 s);
  then the node restarted with the same id (its start removes the sandboxes its killed life left:
  the benchmark leaves no container) and the time until it is listed again.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from rlsandbox.client import AsyncClient, ClusterClient
from rlsandbox.client._cluster import Placement
from rlsandbox.loadtest.node import daemon_process, wait_quiet, wait_ready
from rlsandbox.loadtest.stats import bench_cli, latency_table, machine, summary_ms
from rlsandbox.v1 import sandbox_pb2 as pb

CONFIG = """
node_id = "clusterbench-{pid}-{i}"
listen_tcp = "127.0.0.1:{{port}}"
session_journal = "{state}/journal-{i}.sqlite3"
nats_url = "{nats}"
events_outbox = "{state}/outbox-{i}.sqlite3"
heartbeat_interval = 1.0
[[pools]]
name = "busybox"
image = "rlsandbox/busybox:latest"
min_ready = 8
max_total = 40
memory_mb = 32
pids = 32
"""


def pick_cost_us(nodes: int, picks: int = 100_000) -> float:
    """What the client spends choosing a node (pick + bookkeeping), in µs, on a table of ``nodes``."""
    table = pb.Cluster(
        nodes=[
            pb.ClusterNode(node_id=f"n{i}", address=f"n{i}:1", free=10**9, max_sessions=10**9, serving=True) for i in range(nodes)
        ]
    )
    p = Placement(["n0:1"], choices=2, refresh=60, rng=random.Random(2))
    p.update(table)
    t = time.perf_counter()
    for _ in range(picks):
        node = p.pick("busybox", set())
        assert node is not None
        p.placed(node, "busybox")
    return (time.perf_counter() - t) / picks * 1e6


def spread(n: int) -> dict[str, Any]:
    capacities = {"big": 1000, "mid": 600, "small": 400}  # placing 1,000 fills half of it
    table = pb.Cluster(
        nodes=[pb.ClusterNode(node_id=k, address=f"{k}:1", free=v, max_sessions=v, serving=True) for k, v in capacities.items()]
    )
    p = Placement(["big:1"], choices=2, refresh=60, rng=random.Random(1))
    p.update(table)
    for _ in range(n):
        node = p.pick("", set())
        assert node is not None
        p.placed(node, "")
    total = sum(capacities.values())
    share = {k: p.placements.get(k, 0) / n for k in capacities}
    expected = {k: v / total for k, v in capacities.items()}
    return {"placed": dict(p.placements), "share": share, "capacity_share": expected,
            "max_relative_error": max(abs(share[k] - expected[k]) / expected[k] for k in capacities)}  # fmt: skip


async def bench(samples: int, spread_n: int) -> dict[str, Any]:
    from rlsandbox.daemon.events.nats_server import NatsServer

    times: dict[str, list[float]] = {"direct": [], "cluster": []}
    with tempfile.TemporaryDirectory() as state:
        server = NatsServer(Path(state) / "js")
        await server.start()
        try:
            configs = [CONFIG.format(pid=os.getpid(), i=i, state=state, nats=server.url) for i in range(3)]
            async with (
                daemon_process(configs[0]) as d0,
                daemon_process(configs[1]) as d1,
                daemon_process(configs[2]) as d2,
                AsyncClient(d0.address, timeout=60) as direct,
                ClusterClient(d0.address, refresh=1.0) as cluster,
            ):
                for d in (d0, d1, d2):
                    async with AsyncClient(d.address, timeout=60) as c:
                        await wait_ready(c, "busybox", 8, 600)
                deadline = time.monotonic() + 30
                while len(await cluster.refresh()) < 3 and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                await wait_quiet(direct)
                for _ in range(samples):
                    for name, make in (("direct", direct.create_session), ("cluster", cluster.create_session)):
                        t = time.perf_counter()
                        s = await make("busybox")
                        times[name].append(time.perf_counter() - t)
                        await s.close()
                spread_by_node = dict(cluster.placement.placements)
                # A dead node: SIGKILL, no orderly leave; how long until the table drops it.
                victim = next(n for n in cluster.nodes.values() if n.address == d2.address).node_id
                os.kill(d2.pid, signal.SIGKILL)
                killed = time.monotonic()
                noticed = None
                while time.monotonic() - killed < 30:
                    await asyncio.sleep(0.1)
                    if victim not in {n.node_id for n in await cluster.refresh()}:
                        noticed = time.monotonic() - killed
                        break
                # It restarts (the same node id): it removes what its killed life left, and rejoins.
                restarted = time.monotonic()
                rejoined = None
                async with daemon_process(configs[2]):
                    while time.monotonic() - restarted < 60:
                        await asyncio.sleep(0.1)
                        if victim in {n.node_id for n in await cluster.refresh()}:
                            rejoined = time.monotonic() - restarted
                            break
        finally:
            await server.stop()
    summary = {k: summary_ms(v) for k, v in times.items()}
    return {
        **summary,
        "overhead_p50_ms": summary["cluster"]["p50"] - summary["direct"]["p50"],
        "placements_over_nodes": spread_by_node,
        "spread": spread(spread_n),
        "pick_cost_us": {str(n): pick_cost_us(n) for n in (3, 30, 300)},
        "dead_node_noticed_s": noticed,
        "restarted_node_rejoined_s": rejoined,
        "machine": machine(),
        "at": time.time(),
    }


def render(r: dict[str, Any]) -> str:
    s = r["spread"]
    rows = [("CreateSession, plain client to one node", r["direct"]), ("CreateSession through ClusterClient", r["cluster"])]
    shares = ", ".join(f"{k} {s['share'][k]:.3f} (capacity share {s['capacity_share'][k]:.3f})" for k in s["share"])
    dead = r["dead_node_noticed_s"]
    return "\n".join(
        [
            *latency_table(rows),
            "",
            f"- CreateSession through the ClusterClient vs a plain client to node 0: {r['overhead_p50_ms']:+.2f} ms on the p50 "
            f"(placed: {r['placements_over_nodes']}); the choice itself, in-process: "
            + ", ".join(f"{us:.1f} µs with {n} nodes" for n, us in r["pick_cost_us"].items()),
            f"- spread of {sum(s['placed'].values())} placements over free capacities 1000/600/400: {shares}; "
            f"largest relative error {s['max_relative_error'] * 100:.1f}%",
            f"- a SIGKILLed node left the table after {dead:.1f} s (heartbeat 1 s, entries expire after 3)"
            if dead is not None
            else "- the SIGKILLed node was still listed after 30 s",
            f"- restarted (same node id: it removes what its killed life left), it was back in the table after "
            f"{r['restarted_node_rejoined_s']:.1f} s",
        ]
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=60)
    parser.add_argument("--spread", type=int, default=1000)


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.samples, args.spread), render)


if __name__ == "__main__":
    main()
