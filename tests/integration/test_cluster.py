"""Three nodes on one engine and one nats-server, as a cluster: each keeps its record in the NATS
node table, any node answers GetCluster for all, a ClusterClient that knows one address places
sessions over the three by their room, and a node that stops leaves the table at once and gets
no more placements."""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import nats
import nats.errors
import pytest
from helpers import STATE_DIR, TEST_OWNER, events_config, eventually
from rlsandbox.client import AsyncClient, BatchCommand, ClusterClient, UnavailableError
from rlsandbox.daemon import __version__
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.events.nats_server import NatsServer, free_port
from rlsandbox.daemon.runtime.docker import LABEL_OWNER, DockerRuntime
from rlsandbox.daemon.server import NodeDaemon
from rlsandbox.v1 import sandbox_pb2 as pb

pytestmark = pytest.mark.docker
POOL = PoolConfig(name="busybox", image="rlsandbox/busybox:latest", min_ready=4, max_total=14, memory_mb=64, pids=64)


@pytest.fixture
async def nodes(nats_server: NatsServer, tmp_path: Path, images: dict[str, str]) -> AsyncIterator[list[NodeDaemon]]:
    started: list[NodeDaemon] = []
    try:
        for i in range(3):
            folder = tmp_path / f"n{i}"
            folder.mkdir()
            config = events_config(
                folder,
                nats_server.url,
                node_id=f"{TEST_OWNER}-c{i}",
                session_journal=f"{STATE_DIR}/cluster-{i}.sqlite3",
                max_sessions=12,
                pools=[POOL],
            )
            node = NodeDaemon(config)
            await node.start()
            started.append(node)
        yield started
    finally:
        for node in started:
            await node.stop()


async def eventually_nodes(client: ClusterClient, n: int, timeout: float = 20.0) -> set[str]:
    deadline = time.monotonic() + timeout
    while True:
        ids = {node.node_id for node in await client.refresh()}
        if len(ids) == n or time.monotonic() > deadline:
            return ids
        await asyncio.sleep(0.2)


async def test_a_cluster_client_places_sessions_over_the_nodes_and_drops_a_stopped_one(nodes: list[NodeDaemon]) -> None:
    ids = {n.config.node_id for n in nodes}
    async with ClusterClient(nodes[0].address, refresh=0.5) as cluster:
        assert await eventually_nodes(cluster, 3) == ids  # learned from one address
        # Any node answers for all of them.
        async with AsyncClient(nodes[2].address) as direct:
            table = await direct._call("GetCluster", pb.GetClusterRequest())
        assert {n.node_id for n in table.nodes} == ids and table.answered_by == nodes[2].config.node_id
        # Answered from the table a watcher keeps from the bucket's updates, not by reading it.
        assert nodes[2].membership is not None and nodes[2].membership.watched_total > 0

        sessions = [await cluster.create_session("busybox", labels={"run": "cluster"}) for _ in range(24)]
        per_node = collections.Counter(s.id.rsplit("-", 1)[0] for s in sessions)
        assert set(per_node) == ids and min(per_node.values()) >= 4, per_node  # spread by room
        assert all(n <= 12 for n in per_node.values())  # never past a node's max_sessions
        # A session's calls go to its node (its client), found again from the id alone.
        s = sessions[5]
        assert cluster.client_for(s.id).target == next(n.address for n in nodes if s.id.startswith(n.config.node_id))
        assert (await s.exec(["echo", "hi"])).stdout == b"hi\n"
        # One batch over sessions of three nodes: one ExecBatch per node, results in order.
        results = await cluster.exec_batch([BatchCommand(x.id, ["echo", x.id]) for x in sessions])
        assert [r.stdout for r in results] == [f"{x.id}\n".encode() for x in sessions]  # type: ignore[union-attr]
        for s in sessions[1:]:
            await s.close()

        # Draining a node: no new sessions there (directly or placed), its open ones go on.
        kept = sessions[0]
        drained = next(n for n in nodes if kept.id.startswith(n.config.node_id))
        async with AsyncClient(drained.address) as direct:
            assert await direct.drain() == (True, 1)
            with pytest.raises(UnavailableError, match="is draining"):
                await direct.create_session("busybox")
            await asyncio.sleep(1.5)  # its record says so at the next heartbeat
            placed = [await cluster.create_session("busybox") for _ in range(6)]
            assert not any(p.id.startswith(drained.config.node_id) for p in placed)
            assert (await kept.exec(["echo", "still"])).stdout == b"still\n"
            assert await direct.drain(undo=True) == (False, 1 + 0)
        for p in [kept, *placed]:
            await p.close()

        # One node stops: it leaves the table at once, and the next placements go to the others.
        gone = nodes[2]
        await gone.stop()
        assert await eventually_nodes(cluster, 2, timeout=5.0) == ids - {gone.config.node_id}
        more = [await cluster.create_session("busybox") for _ in range(10)]
        assert {s.id.rsplit("-", 1)[0] for s in more} <= ids - {gone.config.node_id}
        for s in more:
            await s.close()


async def test_what_is_put_in_the_node_table_is_read_as_untrusted_input(nodes: list[NodeDaemon], nats_server: NatsServer) -> None:
    """Anyone who can put into RLSANDBOX_NODES: one record with "ts": "soon" made GetCluster fail
    with INTERNAL on every node (no client could place), a record with ts = 1e308 never aged out,
    a record claiming a real node's id under a key of its own took its place, and a fake node with
    a huge free count drew the sessions to its address. Each is now refused by every reader
    (counted, logged once), the table and placement are the real nodes'."""
    ids = {n.config.node_id for n in nodes}
    victim = nodes[0].config.node_id
    fake = {"node": "zz-evil", "address": "127.0.0.1:1", "sessions": 0, "max_sessions": 10**6, "free": 10**6,
            "pools": {"busybox": {"ready": 10**6, "in_use": 0, "max_total": 10**6}}, "load1": 0.0, "serving": True,
            "ts": time.time()}  # fmt: skip
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().key_value("RLSANDBOX_NODES")
        await kv.put("aa-soon", json.dumps({**fake, "node": "aa-soon", "ts": "soon"}).encode())
        await kv.put("forever", json.dumps({**fake, "node": "forever", "ts": 1e308}).encode())
        await kv.put("thief", json.dumps({**fake, "node": victim}).encode())  # another node's id, another key
        await kv.put("junk", b"\xff not json")
        await kv.put("zz-evil", json.dumps({**fake, "free": "lots"}).encode())
        await kv.put("negative", json.dumps({**fake, "node": "negative", "sessions": -5}).encode())
        async with ClusterClient(nodes[1].address, refresh=0.5) as cluster:
            for node in nodes:
                async with AsyncClient(node.address) as direct:
                    table = await direct._call("GetCluster", pb.GetClusterRequest())
                assert {n.node_id for n in table.nodes} == ids, table
                by_id = {n.node_id: n for n in table.nodes}
                assert by_id[victim].address == nodes[0].address and by_id[victim].free <= 12
            assert await eventually_nodes(cluster, 3) == ids
            placed = [await cluster.create_session("busybox") for _ in range(6)]
            assert all(p.id.rsplit("-", 1)[0] in ids for p in placed)
            for p in placed:
                await p.close()
        assert all(n.membership is not None and n.membership.rejected_total >= 5 for n in nodes)
    finally:
        await nc.close()


async def ping_all(nc: Any, subject: str, wait: float = 1.0) -> list[dict[str, Any]]:
    """Every answer to one request (the NATS micro discovery pattern: all instances reply)."""
    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox)
    await nc.publish(subject, b"", reply=inbox)
    answers = []
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        try:
            msg = await sub.next_msg(timeout=left)
        except nats.errors.TimeoutError:
            break
        answers.append(json.loads(msg.data))
    await sub.unsubscribe()
    return answers


async def test_nats_tooling_sees_every_node_as_a_micro_service(nodes: list[NodeDaemon], nats_server: NatsServer) -> None:
    """$SRV.PING/INFO/STATS (what `nats micro ls` asks) list the three nodes with their ids and
    addresses; each node's status endpoint answers its record; a stopped node is gone at once."""
    ids = {n.config.node_id for n in nodes}
    nc = await nats.connect(nats_server.url)
    try:
        pings: list[dict[str, Any]] = []
        deadline = time.monotonic() + 20
        while len(pings) < 3 and time.monotonic() < deadline:  # each registers at its first heartbeat
            pings = await ping_all(nc, "$SRV.PING.rlsandbox")
        assert {p["metadata"]["node"] for p in pings} == ids and all(p["name"] == "rlsandbox" for p in pings)
        infos = await ping_all(nc, "$SRV.INFO.rlsandbox")
        by_node = {i["metadata"]["node"]: i for i in infos}
        for node in nodes:
            info = by_node[node.config.node_id]
            assert info["metadata"]["address"] == node.address and info["version"] == __version__
            [endpoint] = info["endpoints"]
            status = json.loads((await nc.request(endpoint["subject"], b"", timeout=5)).data)
            assert status["node"] == node.config.node_id and status["max_sessions"] == 12
        stats = await ping_all(nc, "$SRV.STATS.rlsandbox")
        assert len(stats) == 3 and all(st["endpoints"][0]["num_requests"] >= 1 for st in stats)
        await nodes[1].stop()
        left = await ping_all(nc, "$SRV.PING.rlsandbox")
        assert {p["metadata"]["node"] for p in left} == ids - {nodes[1].config.node_id}
    finally:
        await nc.close()


async def test_a_node_without_nats_answers_the_table_with_itself(daemon: NodeDaemon) -> None:
    async with ClusterClient(daemon.address) as cluster:
        [node] = await cluster.refresh()
        assert node.node_id == daemon.config.node_id and node.address == daemon.address and node.serving
        assert node.max_sessions == daemon.config.max_sessions and "busybox" in node.ready
        s = await cluster.create_session("busybox")
        await s.close()


BLOCKING = r"""
import sys, time
from concurrent.futures import ThreadPoolExecutor
from rlsandbox.client import BlockingClusterClient

def work(cluster):
    with cluster.create_session("busybox") as s:
        assert s.exec(["true"]).exit_code == 0
        return s.id

with BlockingClusterClient(sys.argv[1:], refresh=0.5) as cluster:
    deadline = time.monotonic() + 20
    while len(cluster.refresh()) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    with ThreadPoolExecutor(6) as pool:
        ids = list(pool.map(lambda _: work(cluster), range(12)))
print(" ".join(ids))
"""


async def test_the_blocking_cluster_client_places_from_worker_threads(nodes: list[NodeDaemon]) -> None:
    """Rollout workers in threads of a trainer process share one BlockingClusterClient (run in
    its own process, as a trainer is: grpc's blocking and asyncio stacks are not mixed here)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        BLOCKING,
        *(n.address for n in nodes),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, err.decode()[-3000:]
    ids = out.decode().split()
    assert len(set(ids)) == 12 and len({i.rsplit("-", 1)[0] for i in ids}) >= 2, ids


VICTIM = """
node_id = "{node}"
listen_tcp = "127.0.0.1:{port}"
nats_url = "{nats}"
heartbeat_interval = 0.5
max_sessions = 12
session_journal = "{state}/victim.sqlite3"
events_outbox = "{state}/victim-outbox.sqlite3"
shutdown_cleanup = 60.0
[[pools]]
name = "busybox"
image = "rlsandbox/busybox:latest"
min_ready = 4
max_total = 14
memory_mb = 64
pids = 64
"""


async def test_a_node_sigkilled_under_load_ends_only_its_sessions_and_rejoins(
    nodes: list[NodeDaemon], nats_server: NatsServer, tmp_path: Path, docker_runtime: DockerRuntime
) -> None:
    """A daemon process SIGKILLed while sessions on every node run commands: calls to its sessions
    fail with an error naming the node, the others' go on, new sessions go elsewhere; restarted with
    the same id it rejoins the table, re-adopts its sessions from its journal and gets new ones."""
    victim_id = f"{TEST_OWNER}-ck"
    port = free_port()
    config = tmp_path / "victim.toml"
    config.write_text(VICTIM.format(node=victim_id, port=port, nats=nats_server.url, state=tmp_path))

    async def start_victim() -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rlsandbox.daemon.cli", "daemon", "--config", str(config),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        async with AsyncClient(f"127.0.0.1:{port}", timeout=5) as probe:
            await eventually(lambda: _answers(probe), timeout=60, what="the victim daemon answering")
        return proc

    proc = await start_victim()
    try:
        async with ClusterClient(nodes[0].address, refresh=0.5) as cluster:
            assert victim_id in await eventually_nodes(cluster, 4)
            sessions: list[Any] = []
            while len(sessions) < 16 or sum(s.id.startswith(victim_id) for s in sessions) < 3:
                assert len(sessions) < 40, "the victim gets no placements"
                sessions.append(await cluster.create_session("busybox"))
            on_victim = [s for s in sessions if s.id.startswith(victim_id)]
            others = [s for s in sessions if not s.id.startswith(victim_id)]
            assert on_victim and others
            stop = asyncio.Event()
            failures: dict[str, list[Exception]] = {s.id: [] for s in sessions}
            served: collections.Counter[str] = collections.Counter()

            async def work(s: Any) -> None:
                while not stop.is_set():
                    try:
                        await s.exec(["echo", "x"])
                        served[s.id] += 1
                    except Exception as e:
                        failures[s.id].append(e)
                        await asyncio.sleep(0.2)

            load = [asyncio.ensure_future(work(s)) for s in sessions]
            await eventually(lambda: _all_served(served, sessions), timeout=30, what="every session served")
            proc.kill()  # SIGKILL: no orderly leave, nothing flushed
            await proc.wait()
            before = dict(served)
            await asyncio.sleep(3)
            stop.set()
            await asyncio.gather(*load)
            # Its sessions fail, with an error naming the node; every other session kept working.
            for s in on_victim:
                assert failures[s.id], f"{s.id} kept working on a killed node"
                assert isinstance(failures[s.id][-1], UnavailableError)
                assert f"node {victim_id}" in str(failures[s.id][-1]), failures[s.id][-1]
            for s in others:
                assert not failures[s.id] and served[s.id] > before[s.id], (s.id, failures[s.id])
            # The table drops it within its entries' expiry (3 heartbeats) and new sessions go elsewhere.
            assert victim_id not in await eventually_nodes(cluster, 3, timeout=10)
            placed = [await cluster.create_session("busybox") for _ in range(8)]
            assert not any(p.id.startswith(victim_id) for p in placed)
            for s in [*others, *placed]:
                await s.close()
            # Restarted with the same id, it rejoins, and its journal brings its sessions back
            # (their sandboxes outlived the daemon: docs/RELIABILITY.md).
            proc = await start_victim()
            assert victim_id in await eventually_nodes(cluster, 4, timeout=20)
            for s in on_victim:
                assert (await s.exec(["echo", "re-adopted"])).stdout == b"re-adopted\n"
                await s.close()
            again = []
            for _ in range(40):
                again.append(await cluster.create_session("busybox"))
                if again[-1].id.startswith(victim_id):
                    break
            assert again[-1].id.startswith(victim_id), "the restarted node got no session"
            assert (await again[-1].exec(["echo", "back"])).stdout == b"back\n"
            for s in again:
                await s.close()
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 90)
        # A victim killed and never restarted (a failure above) leaves its sandboxes: remove them.
        for c in await docker_runtime.list_containers({LABEL_OWNER: victim_id}):
            await docker_runtime.remove(c.id)


async def _all_served(served: collections.Counter[str], sessions: list[Any]) -> bool:
    return all(served[s.id] for s in sessions)


async def _answers(client: AsyncClient) -> bool:
    try:
        return (await client.node_status()).serving
    except Exception:
        return False
