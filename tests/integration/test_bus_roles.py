"""The bus with a user per role (events/nats_auth.py): a node publishes its events and its node
table entry, the aggregator stores them; a trainer, a node publishing as another node, or anyone
without a user, achieves nothing. The same forged reward posted by the admin is counted: the
refusals are the permissions' doing, not a malformed event's."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import nats
import orjson
import pytest
from helpers import events_config, eventually, running_daemon
from rlsandbox.client import AsyncClient, TaskRef
from rlsandbox.daemon.events.aggregator import Aggregator
from rlsandbox.daemon.events.connection import NatsAuth
from rlsandbox.daemon.events.model import REWARD, Event
from rlsandbox.daemon.events.nats_auth import BusKeys, write_keys
from rlsandbox.daemon.events.nats_server import NatsServer
from rlsandbox.v1 import sandbox_pb2 as pb

pytestmark = pytest.mark.docker

TASK = Path(__file__).resolve().parent.parent / "fixtures" / "tasks" / "py-calc"


def auth(keys: BusKeys, role: str, node_id: str = "") -> dict[str, str]:
    user = f"node-{node_id}" if role == "node" else role
    return {"user": user, "password": keys.password_file(role, node_id).read_text().strip()}


async def post(url: str, event: Event, **login: str) -> str:
    """Publish ``event`` to JetStream as ``login`` (nobody: no user); what the bus answered."""
    errors: list[str] = []

    async def on_error(e: Exception) -> None:
        errors.append(str(e))

    if not login:
        return await anonymous(url)
    nc = await nats.connect(url, allow_reconnect=False, connect_timeout=2, error_cb=on_error, **login)  # type: ignore[arg-type]
    try:
        await nc.jetstream(timeout=2).publish(event.subject, orjson.dumps(event.to_dict()), timeout=2)
        return "stored"
    except Exception as e:
        await asyncio.sleep(0.2)  # the permissions violation arrives as an async error
        return f"refused: {e!r} {errors}"
    finally:
        await nc.close()


def push(url: str, user: str, password_file: Path, task: Path = TASK) -> list[dict[str, object]]:
    """`rlsandbox tasks push` of ``task`` as ``user``; raises AssertionError with its stderr."""
    cli = [sys.executable, "-m", "rlsandbox.daemon.cli", "tasks", "push", str(task), "--nats", url]
    cli += ["--nats-user", user, "--nats-password-file", str(password_file)]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


async def anonymous(url: str) -> str:
    """NATS's protocol by hand, with no user (nats-py leaves a socket open when a connect fails)."""
    host, port = url.removeprefix("nats://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        await reader.readline()  # INFO
        writer.write(b'CONNECT {"verbose": false, "pedantic": false}\r\nPUB rlsandbox.v1.node-a.x 1\r\nx\r\nPING\r\n')
        await writer.drain()
        answer = (await asyncio.wait_for(reader.readline(), 5)).decode()
        return f"refused at connect: {answer.strip()}" if answer.startswith("-ERR") else f"stored? {answer.strip()}"
    finally:
        writer.close()
        await writer.wait_closed()


async def test_only_a_node_posts_its_own_events_and_entry(tmp_path: Path, images: dict[str, str]) -> None:
    keys = write_keys(tmp_path / "keys", ["node-a"])
    assert oct(keys.password_file("trainer").stat().st_mode)[-3:] == "600"
    server = NatsServer(tmp_path / "jetstream", config=keys.server_config)
    await server.start()
    agg_login = NatsAuth(user="aggregator", password_file=str(keys.password_file("aggregator")))
    agg = Aggregator(server.url, tmp_path / "agg.sqlite3", auth=agg_login)
    agg_task = asyncio.create_task(agg.run())
    try:
        await asyncio.wait_for(agg.started.wait(), 30)
        # The trainer pushes a task bundle; a node may not (it would squat a ref).
        [pushed] = await asyncio.to_thread(push, server.url, "trainer", keys.password_file("trainer"))
        with pytest.raises(AssertionError, match=r"ermission|uthoriz|imeout"):
            other = TASK.parent / "py-textkit"
            await asyncio.to_thread(push, server.url, "node-node-a", keys.password_file("node", "node-a"), other)
        (tmp_path / "a").mkdir()
        config = events_config(tmp_path / "a", server.url, node_id="node-a", **keys.daemon_options("node-a"))
        async with running_daemon(config) as node, AsyncClient(node.address) as client:
            async with client.session("busybox") as s:
                await s.exec("true")
                sid = s.id
            session = await client.create_session(task=TaskRef(str(pushed["ref"])))
            try:
                assert "def multiply" in (await session.exec("cat calc/__init__.py")).stdout_text  # read as the node
            finally:
                await session.close()

            async def closed() -> bool:
                timeline = await asyncio.to_thread(agg.store.timeline, sid)
                return bool(timeline) and timeline[-1]["type"] == "closed"

            await eventually(closed, what="the node's own events, stored")
            assert (await client.node_status()).events.connected

            async def listed() -> bool:
                table = await client._call("GetCluster", pb.GetClusterRequest())
                return [n.node_id for n in table.nodes] == ["node-a"]

            await eventually(listed, what="the node's own entry in the node table")

        forged = Event(REWARD, "node-a", sid, 1000, {"reward": 1.0, "status": "ok"})
        answers = {
            "trainer": await post(server.url, forged, **auth(keys, "trainer")),
            "aggregator": await post(server.url, forged, **auth(keys, "aggregator")),
            "nobody": await post(server.url, forged),
        }
        for who, answer in answers.items():
            assert answer.startswith("refused"), (who, answer)
        # A node posting as another node: events and node table entry.
        other = Event(REWARD, "node-b", "s-b", 1, {"reward": 1.0})
        assert (await post(server.url, other, **auth(keys, "node", "node-a"))).startswith("refused")
        nc = await nats.connect(server.url, allow_reconnect=False, **auth(keys, "node", "node-a"))  # type: ignore[arg-type]
        try:
            kv = await nc.jetstream(timeout=2).key_value("RLSANDBOX_NODES")
            with pytest.raises(nats.errors.Error):
                await kv.put("node-b", b'{"node_id": "node-b"}')
        finally:
            await nc.close()
        # Nor can the trainer make the events stream source a stream of its own.
        nc = await nats.connect(server.url, allow_reconnect=False, **auth(keys, "trainer"))  # type: ignore[arg-type]
        try:
            js = nc.jetstream(timeout=2)
            with pytest.raises(nats.errors.Error):
                await js.add_stream(name="TRAINERS_OWN", subjects=["trainer.own"])
            with pytest.raises(nats.errors.Error):
                await js.stream_info("RLSANDBOX_EVENTS")
        finally:
            await nc.close()
        await asyncio.sleep(1)
        timeline = await asyncio.to_thread(agg.store.timeline, sid)
        assert not [e for e in timeline if e["type"] == REWARD and e["seq"] == 1000], timeline

        # The control: the same event from the admin is stored and counted.
        assert await post(server.url, forged, **auth(keys, "admin")) == "stored"

        async def counted() -> bool:
            timeline = await asyncio.to_thread(agg.store.timeline, sid)
            return any(e["type"] == REWARD and e["seq"] == 1000 for e in timeline)

        await eventually(counted, what="the admin's event (the control)")
    finally:
        agg.stop()
        await asyncio.wait_for(agg_task, 30)
        await server.stop()
