"""The examples run, as a user runs them, against a real daemon whose events go through a real
nats-server into the aggregator: a smoke test that they keep working."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest
from helpers import TEST_OWNER, events_config, running_daemon
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.events.aggregator import Aggregator
from rlsandbox.daemon.events.nats_server import NatsServer

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]


async def test_the_grpo_rollout_example(
    nats_server: NatsServer, aggregator: Aggregator, tmp_path: Path, images: dict[str, str]
) -> None:
    config = events_config(
        tmp_path,
        nats_server.url,
        node_id=f"{TEST_OWNER}-example",
        pools=[PoolConfig(name="python", image="rlsandbox/python-task:latest", min_ready=4, max_total=16)],
    )
    async with running_daemon(config) as node:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "examples" / "grpo_rollouts.py"), "--target", node.address, "--group", "4",
            "--rounds", "2", "--run", "example-smoke", "--aggregator", f"http://127.0.0.1:{aggregator.http_port}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 300)
        assert not node.sessions.sessions  # the example closed everything
    text = out.decode()
    assert proc.returncode == 0, text + err.decode()[-3000:]
    # Two rounds of 4 via fork, 4 through the Gymnasium adapter; half of the candidate fixes are right.
    assert "episodes 12, masked 0, mean reward 0.500" in text, text
    assert re.search(r"round 0 a \* b\s+-> ok\s+reward 1\.0\s+advantage \+1\.00", text), text
    assert re.search(r"aggregator: run example-smoke: 14 sessions .* 12 gradings, mean reward 0\.500", text), text
