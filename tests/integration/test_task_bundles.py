"""Task bundles in a real nats-server's JetStream Object Store: `rlsandbox tasks push` stores a
task once by its ref; a node asked for the ref fetches it once however many sessions ask at the
same moment, checks it against the ref, and refuses a bundle replaced in the store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import nats
import pytest
from helpers import TEST_OWNER, events_config, running_daemon
from rlsandbox.client import AsyncClient, FailedPreconditionError, NotFoundError, TaskRef
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.events.nats_server import NatsServer
from rlsandbox.daemon.grading.bundles import BUCKET, pack
from rlsandbox.daemon.grading.task import load_tasks

pytestmark = pytest.mark.docker

TASK = Path(__file__).resolve().parent.parent / "fixtures" / "tasks" / "py-calc"


def push(url: str) -> list[dict[str, object]]:
    cli = [sys.executable, "-m", "rlsandbox.daemon.cli", "tasks", "push", str(TASK), "--nats", url]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


async def test_a_pushed_task_is_fetched_once_per_node_and_checked(
    nats_server: NatsServer, tmp_path: Path, images: dict[str, str]
) -> None:
    [first] = await asyncio.to_thread(push, nats_server.url)
    assert first["id"] == "py-calc" and first["stored"] is True
    [again] = await asyncio.to_thread(push, nats_server.url)
    assert again["ref"] == first["ref"] and again["stored"] is False  # content-addressed: stored once
    ref = str(first["ref"])
    pools = [PoolConfig(name="python", image="rlsandbox/python-task:latest", min_ready=4, max_total=24)]
    config = events_config(tmp_path, nats_server.url, node_id=f"{TEST_OWNER}-bundles", pools=pools)
    async with running_daemon(config) as node, AsyncClient(node.address, timeout=120) as client:
        sessions = await asyncio.gather(*(client.create_session(task=TaskRef(ref), labels={"run": "bundles"}) for _ in range(12)))
        try:
            assert {s.info.task_id for s in sessions} == {"py-calc"}
            assert node.bundles is not None and node.bundles.fetched_total == 1  # one fetch for 12 sessions
            assert "def multiply" in (await sessions[0].exec("cat calc/__init__.py")).stdout_text
            graded = await sessions[0].grade()
            assert graded.status == "ok" and graded.reward == 0.0  # the unsolved task, hidden tests and all
        finally:
            for s in sessions:
                await s.close()

        with pytest.raises(NotFoundError, match="not in the object store"):
            await client.create_session(task=TaskRef("py-calc@00000000000000000000"))
        # A bundle put in the store under a ref that is not its content's: refused.
        task = load_tasks(TASK)[0]
        forged = "py-calc@ffffffffffffffffffff"
        nc = await nats.connect(nats_server.url)
        try:
            store = await nc.jetstream().object_store(BUCKET)
            await store.put(forged, pack(task))
        finally:
            await nc.close()
        with pytest.raises(FailedPreconditionError, match="holds other content"):
            await client.create_session(task=TaskRef(forged))
        assert not node.sessions.sessions


async def test_a_ref_squatted_before_the_push_is_replaced_not_taken(nats_server: NatsServer) -> None:
    """Anyone who can write to the bucket can compute a task's ref and put junk under it first:
    `tasks push` said "already stored" and every session by that ref failed for good. The push
    reads what is there back and checks it by content: junk is replaced (issue 46)."""
    from rlsandbox.daemon.session.prefetch import task_ref

    ref = task_ref(load_tasks(TASK)[0])
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        try:
            store = await js.object_store(BUCKET)
        except Exception:
            store = await js.create_object_store(BUCKET)
        await store.put(ref, b"junk, squatting the ref")
        [pushed] = await asyncio.to_thread(push, nats_server.url)
        assert pushed["ref"] == ref and pushed["stored"] is True  # replaced, not "already there"
        data = bytes((await store.get(ref)).data or b"")
        assert data == pack(load_tasks(TASK)[0])
        [again] = await asyncio.to_thread(push, nats_server.url)
        assert again["stored"] is False  # now it is the task's
    finally:
        await nc.close()
