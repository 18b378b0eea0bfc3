"""The operator's commands against a real daemon (issue 48): list the live sessions, filtered by
label, and run a command in one, its output streamed and its exit code the command's."""

from __future__ import annotations

import asyncio
import json

import pytest
from rlsandbox.client import AsyncClient
from rlsandbox.daemon import cli
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker


async def test_sessions_and_exec_look_into_a_live_sandbox(
    daemon: NodeDaemon, client: AsyncClient, capsys: pytest.CaptureFixture[str]
) -> None:
    async with client.session("busybox", labels={"run": "ops", "who": "me"}) as s, client.session("busybox") as other:
        await s.exec("echo seen > marker")
        code = await asyncio.to_thread(cli.main, ["sessions", "--target", daemon.address, "--label", "run=ops", "--json"])
        assert code == 0
        listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        assert [x["session_id"] for x in listed] == [s.id] and listed[0]["labels"] == {"run": "ops", "who": "me"}
        assert other.id not in [x["session_id"] for x in listed]
        argv = ["exec", "--target", daemon.address, s.id, "--"]
        code = await asyncio.to_thread(cli.main, [*argv, "sh", "-c", "cat marker; exit 3"])
        assert code == 3 and capsys.readouterr().out == "seen\n"
        code = await asyncio.to_thread(cli.main, [*argv, "echo $((1+1))"])
        assert code == 0 and capsys.readouterr().out == "2\n"  # one word: a shell string
        code = await asyncio.to_thread(cli.main, ["exec", "--target", daemon.address, "no-such-session", "--", "true"])
        err = capsys.readouterr().err
        mine = [line for line in err.splitlines() if line.startswith("rlsandbox: ")]  # (the in-process daemon logs too)
        assert code == 2 and len(mine) == 1 and "NOT_FOUND" in mine[0] and "Traceback" not in err, err
