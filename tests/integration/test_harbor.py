"""A Harbor task end to end: `rlsandbox tasks import-harbor --build` builds its environment image
with the real engine, a daemon makes a pool for that image on demand, the oracle solution
(solution/solve.sh) run in a session scores 1.0, an untouched session the partial reward its
verifier writes, and a policy that plants a reward file or test files of its own gains nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import daemon_config, running_daemon
from rlsandbox.client import AsyncClient
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "harbor"


@pytest.fixture(scope="module")
def harbor_task(images: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("harbor") / "tasks.jsonl"
    cli = [sys.executable, "-m", "rlsandbox.daemon.cli", "tasks", "import-harbor", str(FIXTURES), "--build", "--out", str(out)]
    done = subprocess.run(cli, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "1 task(s) imported" in done.stderr
    [line] = out.read_text().splitlines()
    return dict(json.loads(line))


@pytest.fixture(scope="module")
async def node(harbor_task: dict[str, object]) -> AsyncIterator[NodeDaemon]:
    template = PoolConfig(name="harbor", image="rlsandbox-harbor/*", min_ready=0, max_total=8)
    config = daemon_config(pools=[], image_pools={"templates": [template]})
    async with running_daemon(config) as daemon:
        yield daemon


async def test_the_oracle_solution_scores_one_and_doing_nothing_scores_what_the_verifier_says(
    node: NodeDaemon, harbor_task: dict[str, object]
) -> None:
    solve = str(harbor_task["metadata"]["solution_script"])  # type: ignore[index]
    async with AsyncClient(node.address, timeout=120) as client:
        async with client.session(task=harbor_task) as s:
            assert s.info.workdir == "/app" and s.info.task_id == "fix-greeting"
            assert (await s.exec("ls /tests 2>&1 || echo no-tests")).stdout_text.strip().endswith("no-tests")
            assert (await s.exec(["bash", "-c", solve])).exit_code == 0
            solved = await s.grade()
        async with client.session(task=harbor_task) as s:
            untouched = await s.grade()
    assert solved.status == "ok" and solved.reward == 1.0, solved.message
    # The verifier's own partial credit: one of its three checks passes without the fix.
    assert untouched.status == "ok" and untouched.reward == pytest.approx(1 / 3), untouched.message


async def test_planted_reward_files_and_tests_gain_nothing(node: NodeDaemon, harbor_task: dict[str, object]) -> None:
    async with AsyncClient(node.address, timeout=120) as client, client.session(task=harbor_task) as s:
        hack = (
            "mkdir -p /logs/verifier /tests && echo 1.0 > /logs/verifier/reward.txt && "
            "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh && "
            "mkdir -p .rlsandbox-harbor-tests && cp /tests/test.sh .rlsandbox-harbor-tests/test.sh && "
            "printf 'def test_x():\\n    pass\\n' > .rlsandbox-harbor-tests/test_extra.py"
        )
        assert (await s.exec(hack)).exit_code == 0
        result = await s.grade()
    assert result.status == "ok" and result.reward == pytest.approx(1 / 3), result.message
    assert any(".rlsandbox-harbor-tests" in t for t in result.tampering), result.tampering


async def test_code_under_test_that_spoils_the_reward_file_scores_zero_not_a_masked_episode(
    node: NodeDaemon, harbor_task: dict[str, object]
) -> None:
    """A failing policy would rather be masked than penalised: its greet.py, imported by the
    verifier, leaves a process that keeps turning the reward file into garbage, a FIFO (a read
    would block) or a symlink. Each of those scores 0.0 with status ok, never an invalid task."""
    spoil = {
        "garbage": "echo not-a-number > $f",
        "fifo": "rm -f $f; mkfifo $f",
        "symlink": "rm -f $f; ln -s /etc/hostname $f",
    }
    async with AsyncClient(node.address, timeout=120) as client:
        for how, command in spoil.items():
            loop = f"f=/logs/verifier/reward.txt; while :; do [ -e $f ] && {{ {command}; }}; sleep 0.01; done"
            code = (
                "import subprocess\n"
                f"subprocess.Popen(['setsid', 'sh', '-c', {loop!r}], start_new_session=True)\n"
                "def greet(name):\n    return 'Hello ' + name\n"
            )
            async with client.session(task=harbor_task) as s:
                await s.write_files({"greet.py": code})
                result = await s.grade()
            assert result.status == "ok" and result.reward == 0.0, (how, result.status, result.message)
