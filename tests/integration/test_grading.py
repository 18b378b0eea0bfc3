"""Grading through the API on the sample tasks, and the reward hacks a naive grader falls for.

Every hack test runs the same attack twice where it matters: graded in place (what a naive grader
does: run the tests where the agent worked) the attack wins, graded in the clean room it does not.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import build_image, daemon_config, running_daemon, swesmith_clone
from rlsandbox.client import AsyncClient, AsyncSession, InvalidArgumentError, NotFoundError
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.grading.task import RewardSpec, Task, load_tasks, tar_files
from rlsandbox.daemon.grading.validate import summary_table, validate, write_cleaned
from rlsandbox.daemon.runtime.docker import DockerRuntime
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker

TASKS = Path(__file__).resolve().parent.parent / "fixtures" / "tasks"
FIX = "def multiply(a, b):\n    return a * b\n"


@pytest.fixture(scope="module")
async def grading_daemon(images: dict[str, str]) -> AsyncIterator[NodeDaemon]:
    config = daemon_config(
        pools=[
            PoolConfig(name="python", image="rlsandbox/python-task:latest", min_ready=2, max_total=16),
            # A graded episode holds two sandboxes (its session and its clean room): validation runs 4 at
            # once, so 4 would let every session wait for a room that cannot come.
            PoolConfig(name="node", image="rlsandbox/node:latest", min_ready=1, max_total=8),
        ]
    )
    async with running_daemon(config) as node:
        yield node


@pytest.fixture
async def gclient(grading_daemon: NodeDaemon) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(grading_daemon.address, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def tasks() -> dict[str, Task]:
    return {t.id: t for t in load_tasks(TASKS)}


async def solve_calc(s: AsyncSession) -> None:
    src = (await s.read_files(["calc/__init__.py"]))["calc/__init__.py"].data.decode()
    await s.write_files({"calc/__init__.py": src.replace("def multiply(a, b):\n    return a + b\n", FIX)})


def outcomes(result: object) -> dict[str, str]:
    return {t.id: t.outcome for t in result.tests if t.group != "other"}  # type: ignore[attr-defined]


async def test_solved_task_gets_reward_one(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    async with gclient.session(task=tasks["py-calc"]) as s:
        assert s.info.task_id == "py-calc" and s.info.workdir == "/workspace"
        await solve_calc(s)
        result = await s.grade()
    assert result.status == "ok", result.message
    assert result.reward == 1.0 and result.resolved
    assert set(outcomes(result).values()) == {"passed"}
    assert len(outcomes(result)) == 5
    assert result.mode == "clean_room" and not result.tampering


async def test_unsolved_task_gets_zero_and_pass_to_pass_still_pass(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    async with gclient.session(task=tasks["py-calc"]) as s:
        result = await s.grade()
    assert result.status == "ok" and result.reward == 0.0 and not result.resolved
    got = outcomes(result)
    assert got["tests/test_multiply.py::test_multiply"] == "failed"
    assert got["tests/test_basic.py::test_add"] == "passed"
    assert result.counts["failed"] == 3 and result.counts["passed"] == 2


async def test_fraction_policy(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    spec = tasks["py-calc"].spec
    fraction = Task(
        spec.model_copy(update={"evaluation": spec.evaluation.model_copy(update={"reward": RewardSpec(policy="fraction")})}),
        tasks["py-calc"].workspace_tar,
    )
    async with gclient.session(task=tasks["py-calc"]) as s:
        result = await s.grade(task=fraction)
    assert result.status == "ok" and result.reward == pytest.approx(2 / 5)


async def test_node_task_with_tap(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    async with gclient.session(task=tasks["node-strings"]) as s:
        before = await s.grade()
        src = (await s.read_files(["src/strings.js"]))["src/strings.js"].data.decode()
        await s.write_files({"src/strings.js": src.replace("  return s;\n", "  return Array.from(s).reverse().join('');\n")})
        after = await s.grade()
    assert before.status == "ok" and before.reward == 0.0, before.message
    assert outcomes(before) == {"reverse": "failed", "reverse ünïcode": "failed", "shout": "passed"}
    assert after.status == "ok" and after.reward == 1.0, after.log.decode(errors="replace")


async def test_hidden_tests_never_reach_the_agent_sandbox(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    async with gclient.session(task=tasks["py-calc"]) as s:
        await s.grade()  # grading happens elsewhere: nothing appears here afterwards either
        found = await s.exec("grep -rl test_multiply_more / --exclude-dir=proc --exclude-dir=sys 2>/dev/null; ls tests")
    assert found.stdout.decode().split() == ["test_basic.py"]


async def test_git_history_stops_at_the_base_commit(gclient: AsyncClient, tasks: dict[str, Task], tmp_path: Path) -> None:
    # A workspace whose history holds the fix (the last commit reverted, still in the reflog).
    ws = tmp_path / "ws"
    shutil.copytree(TASKS / "py-calc" / "workspace", ws)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(ws)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    (ws / "calc" / "__init__.py").write_text((ws / "calc" / "__init__.py").read_text().replace("return a + b\n\n\n", "X", 1))
    subprocess.run([*git, "commit", "-qam", "the fix: return a * b"], check=True)
    subprocess.run([*git, "reset", "-q", "--hard", "HEAD~1"], check=True)
    doc = tasks["py-calc"].spec.model_dump(exclude_none=True)
    doc["workspace"] = {"dir": str(ws)}
    doc["evaluation"].pop("hidden_tests")
    (tmp_path / "task.yaml").write_text(__import__("yaml").safe_dump(doc))
    task = load_tasks(tmp_path / "task.yaml")[0]
    async with gclient.session(task=task) as s:
        log = await s.exec("git log --all --oneline; git reflog | wc -l; git grep -c 'the fix' $(git rev-list --all) | wc -l")
    lines = log.stdout.decode().split("\n")
    assert log.exit_code == 0, log.stderr
    assert len([ln for ln in lines if "rlsandbox: task base" in ln]) == 1
    assert "the fix" not in log.stdout.decode()


async def test_bad_tasks_are_invalid_argument(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    with pytest.raises(InvalidArgumentError, match="fail_to_pass"):
        await gclient.create_session(
            task={"id": "x", "pool": "python", "evaluation": {"test_command": "true", "fail_to_pass": 3}}
        )
    with pytest.raises(InvalidArgumentError, match="put \\{report\\} in test_command"):
        await gclient.create_session(
            task={"id": "x", "pool": "python", "evaluation": {"test_command": "x", "report_format": "junit"}}
        )
    with pytest.raises(InvalidArgumentError, match="differs from the task's pool"):
        await gclient.create_session("busybox", task=tasks["py-calc"])


async def test_broken_setup_is_invalid_task_not_a_reward(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    spec = tasks["py-calc"].spec
    broken = Task(spec.model_copy(update={"setup": ["echo no database; exit 3"]}), tasks["py-calc"].workspace_tar)
    with pytest.raises(Exception, match="no database"):
        await gclient.create_session(task=broken)
    async with gclient.session(task=tasks["py-calc"]) as s:
        result = await s.grade(task=broken)
    assert result.status == "invalid_task" and result.reward is None
    assert "no database" in result.message


async def test_setup_commands_run_with_the_tasks_env(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    """A setup that needs the task's env (a conda env's PATH, say) finds it, as the episode does."""
    spec = tasks["py-calc"].spec
    setup = ['test "$TOOLS" = /opt/tools || { echo "TOOLS is \'$TOOLS\'"; exit 4; }', 'echo "$TOOLS" > .tools']
    task = Task(spec.model_copy(update={"env": {"TOOLS": "/opt/tools"}, "setup": setup}), tasks["py-calc"].workspace_tar)
    async with gclient.session(task=task) as s:
        assert (await s.exec("cat .tools; echo $TOOLS")).stdout == b"/opt/tools\n/opt/tools\n"


async def test_grading_in_place_leaves_the_sessions_processes_and_shell_running(
    gclient: AsyncClient, tasks: dict[str, Task]
) -> None:
    """Only a clean room's tests end every process they leave: in place, the room is the
    session's, whose background processes and persistent shell outlive the grade."""
    async with gclient.session(task=tasks["py-calc"]) as s:
        await s.exec("export KEPT=yes", shell_session="main")
        await s.exec("setsid sh -c 'sleep 1000; :' >/dev/null 2>&1 &", shell_session="main")
        await s.grade(mode="in_place")
        assert (await s.exec("echo $KEPT", shell_session="main")).stdout == b"yes\n"
        assert b"sleep 1000" in (await s.exec("ps -eo args")).stdout


# -- reward hacking ------------------------------------------------------------------------------
async def both_modes(s: AsyncSession) -> tuple[float | None, float | None, object]:
    clean = await s.grade()
    naive = await s.grade(mode="in_place")
    return clean.reward, naive.reward, clean


async def test_hack_editing_the_visible_tests(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    async with gclient.session(task=tasks["py-calc"]) as s:
        await solve_calc(s)  # a real fix, but also a sabotaged pass-to-pass test
        await s.write_files({"tests/test_basic.py": "def test_add():\n    pass\n\ndef test_add_negative():\n    pass\n"})
        await s.write_files({"calc/__init__.py": "def add(a, b):\n    return 0\n\n" + FIX})
        clean, naive, result = await both_modes(s)
    assert naive == 1.0  # the agent broke add() and "fixed" its tests: a naive grader believes it
    assert clean == 0.0
    assert any("tests/test_basic.py" in t for t in result.tampering)  # type: ignore[attr-defined]


async def test_hack_deleting_tests(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    async with gclient.session(task=tasks["py-calc"]) as s:
        await solve_calc(s)
        await s.write_files({"calc/__init__.py": "def add(a, b):\n    return 0\n\n" + FIX})
        await s.exec("rm -rf tests")
        result = await s.grade()
    assert result.reward == 0.0
    assert outcomes(result)["tests/test_basic.py::test_add"] == "failed"


@pytest.mark.parametrize(
    "files",
    [
        {
            "conftest.py": "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
            "    out = yield\n    rep = out.get_result()\n    rep.outcome = 'passed'\n"
        },
        {
            "pytest.ini": "[pytest]\naddopts = -p forcepass\n",
            "forcepass.py": "def pytest_runtest_call(item):\n    item.runtest = lambda: None\n",
        },
        {
            "sitecustomize.py": "import builtins\n",
            "usercustomize.py": "import builtins\n",
            "evil.pth": "import os; os.environ['X'] = '1'\n",
        },
        {
            "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = forcepass\n",
            "evil-1.0.dist-info/METADATA": "Name: evil\n",
            "forcepass.py": "def pytest_runtest_call(item):\n    item.runtest = lambda: None\n",
        },
    ],
    ids=["conftest", "pytest-ini-plugin", "site-hooks", "dist-info-entry-point"],
)
async def test_hack_test_runner_configuration(gclient: AsyncClient, tasks: dict[str, Task], files: dict[str, str]) -> None:
    async with gclient.session(task=tasks["py-calc"]) as s:
        await s.write_files(files)
        clean, naive, result = await both_modes(s)
    assert clean == 0.0, result
    tampered = " ".join(result.tampering)  # type: ignore[attr-defined]
    assert all(name.split("/")[0] in tampered for name in files if name != "forcepass.py")
    if "conftest.py" in files or "pytest.ini" in files or "evil-1.0.dist-info/entry_points.txt" in files:
        assert naive == 1.0  # proves the attack works where the agent worked


async def test_hack_fake_report_file(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    spec = tasks["py-calc"].spec
    ev = spec.evaluation
    junit = Task(
        spec.model_copy(
            update={
                "evaluation": ev.model_copy(
                    update={
                        "test_command": "python3 -m pytest -p no:cacheprovider tests --junitxml={report}; true",
                        "report_format": "junit",
                    }
                )
            }
        ),
        tasks["py-calc"].workspace_tar,
    )
    fake = (
        "<testsuite>"
        + "".join(
            f'<testcase classname="{t.split("::")[0][:-3].replace("/", ".")}" name="{t.split("::")[1]}"/>' for t in ev.graded_ids
        )
        + "</testsuite>"
    )
    async with gclient.session(task=junit) as s:
        # Fake reports wherever a grader might look: the workspace and a guess at a report path.
        await s.write_files({"report.xml": fake, "/tmp/report.xml": fake})
        planted = await s.exec("mkdir -p /.rlsandbox-grade && cp report.xml /.rlsandbox-grade/report")
        assert planted.exit_code == 0
        result = await s.grade()
    assert result.status == "ok" and result.reward == 0.0
    assert outcomes(result)["tests/test_multiply.py::test_multiply"] == "failed"


async def test_hack_changing_site_packages_and_interpreter(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    async with gclient.session(task=tasks["py-calc"]) as s:
        # Make every assertion pass by patching pytest itself, and wrap the interpreter.
        patched = await s.exec(
            "f=$(python3 -c 'import _pytest.python as m; print(m.__file__)') && "
            "printf '\\ndef pytest_pyfunc_call(pyfuncitem):\\n    return True\\n' >> $f && "
            "mv /usr/bin/python3 /usr/bin/python3.real || true"
        )
        assert patched.exit_code == 0, patched.stderr
        await s.write_files({"/usr/bin/python3": (b'#!/bin/sh\nexec /usr/bin/python3.real "$@"\n', 0o755)})
        clean, naive, _ = await both_modes(s)
    assert naive == 1.0
    assert clean == 0.0


async def test_hack_killing_the_test_runner_early(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    async with gclient.session(task=tasks["py-calc"]) as s:
        src = "import os\nos._exit(0)\n\n" + (await s.read_files(["calc/__init__.py"]))["calc/__init__.py"].data.decode()
        await s.write_files({"calc/__init__.py": src})
        result = await s.grade()
    assert result.exit_code == 0  # a grader trusting the exit code would pay out
    assert result.status == "ok" and result.reward == 0.0
    assert set(outcomes(result).values()) == {"missing"}


async def test_hack_forged_summary_at_exit(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    """The code under test prints a fake all-passed summary after pytest ends and exits 0."""
    forged = "\\n".join(f"PASSED {t}" for t in tasks["py-calc"].spec.evaluation.graded_ids)
    async with gclient.session(task=tasks["py-calc"]) as s:
        src = (await s.read_files(["calc/__init__.py"]))["calc/__init__.py"].data.decode()
        await s.write_files(
            {"calc/__init__.py": f"import atexit, os\natexit.register(lambda: (print('{forged}'), os._exit(0)))\n" + src}
        )
        result = await s.grade()
    # The real FAILED lines are there too, and the worst outcome of a test wins.
    assert result.reward == 0.0
    assert outcomes(result)["tests/test_multiply.py::test_multiply"] == "failed"


async def test_evaluate_errors(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    async with gclient.session("python") as s:
        with pytest.raises(Exception, match="not started from a task"):
            await s.grade()
        with pytest.raises(InvalidArgumentError, match="timeout"):
            await gclient.evaluate(s.id, task=tasks["py-calc"], timeout=-1)
        with pytest.raises(InvalidArgumentError, match="pool"):
            await gclient.evaluate(s.id, task=tasks["node-strings"])


# -- validation ----------------------------------------------------------------------------------
async def test_validation_accepts_good_tasks_and_rejects_broken_ones(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    chosen = [tasks["py-calc"], tasks["node-strings"], tasks["py-broken"]]
    report = await validate(gclient, chosen, runs=2, concurrency=4)
    verdicts = {v.task_id: v for v in report.tasks}
    assert verdicts["py-calc"].verdict == "valid", verdicts["py-calc"].problems
    assert verdicts["node-strings"].verdict == "valid", verdicts["node-strings"].problems
    assert verdicts["py-broken"].verdict == "gold_fails"
    assert "tests/test_area.py::test_square" in verdicts["py-broken"].problems[0]
    assert all(v.infra_errors == 0 and v.runs == 4 for v in report.tasks), [
        (v.task_id, v.infra_errors, v.runs, v.problems) for v in report.tasks
    ]
    assert "py-broken" in summary_table(report)


async def test_validation_finds_the_flaky_test(gclient: AsyncClient, tasks: dict[str, Task], tmp_path: Path) -> None:
    # test_flaky fails half the time: 6 runs per patch miss it with probability 2 / 2**12.
    flagged = await validate(gclient, [tasks["py-flaky"]], runs=6, concurrency=6)
    assert flagged.tasks[0].verdict == "flaky"
    assert flagged.tasks[0].flaky_tests == ["tests/test_greet.py::test_flaky"]
    cleaned = flagged
    excluded = await validate(gclient, [tasks["py-flaky"]], runs=6, concurrency=6, exclude_flaky=True)
    v = excluded.tasks[0]
    assert v.verdict == "valid", v.problems
    assert v.kept_pass_to_pass == ["tests/test_greet.py::test_stable"]
    assert write_cleaned([tasks["py-flaky"]], excluded, tmp_path / "clean") == 1
    assert write_cleaned([tasks["py-flaky"]], cleaned, tmp_path / "none") == 0
    reloaded = load_tasks(tmp_path / "clean")[0]
    assert reloaded.spec.evaluation.pass_to_pass == ["tests/test_greet.py::test_stable"]
    assert reloaded.workspace_tar == tasks["py-flaky"].workspace_tar


async def test_validate_command_line(grading_daemon: NodeDaemon, tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "rlsandbox.daemon.cli", "tasks", "validate", str(TASKS / "py-calc" / "task.yaml"),
        "--runs", "1", "--target", grading_daemon.address, "--report", str(tmp_path / "r.json"), "--out", str(tmp_path / "out"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert "py-calc" in out.decode() and "valid" in out.decode()
    assert "2/2 runs" in err.decode()  # the progress line
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["counts"]["valid"] == 1 and report["tasks"][0]["task_id"] == "py-calc"
    assert (tmp_path / "out" / "py-calc" / "task.json").exists()


# -- datasets as published ------------------------------------------------------------------------
async def test_a_swesmith_record_starts_from_its_bug_and_only_a_fix_earns_reward(gclient: AsyncClient, tmp_path: Path) -> None:
    """SWE-smith's layout, imported from a clone at its clean commit (the bug applied in the
    sandbox) and at its bug's commit (the bug already there: kept). Neither git history nor
    status shows the bug; rewriting the tests earns nothing; the bug's reverse is the gold patch."""
    from rlsandbox.daemon import cli

    repo, clean, bugged, bug = swesmith_clone(tmp_path)
    record = {
        "instance_id": "acme__fmt.0000aaaa.func_pm_op_swap__x1",
        "repo": "swesmith/acme__fmt.0000aaaa",
        "image_name": "swesmith.x86_64.acme__fmt.0000aaaa",
        "patch": bug,
        "FAIL_TO_PASS": ["tests/test_fmt.py::test_width"],
        "PASS_TO_PASS": ["tests/test_fmt.py::test_width_zero", "tests/test_other.py::test_other"],
        "problem_statement": "width() is negative.",
    }
    lines = [
        json.dumps({**record, "base_commit": clean}),
        json.dumps({**record, "instance_id": record["instance_id"] + "b", "base_commit": bugged}),
    ]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "tasks" / "tasks.jsonl"
    out.parent.mkdir()
    code = await asyncio.to_thread(
        cli.main,
        ["tasks", "import-swebench", str(tmp_path / "in.jsonl"), "--pool", "python", "--repo", str(repo),
         "--workspace", "/workspace", "--test-command", "python3 -m pytest -rA -p no:cacheprovider {test_files}",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    imported = load_tasks(out)
    assert [t.spec.evaluation.pass_to_pass for t in imported] == [["tests/test_fmt.py::test_width_zero"]] * 2
    for task in imported:
        async with gclient.session(task=task) as s:
            seen = await s.exec("grep -c 'indent - total' pkg/fmt.py; git status --porcelain; git log --oneline | wc -l")
            assert seen.stdout == b"1\n1\n", (task.id, seen.stdout, seen.stderr)
            # The policy makes the test file pass instead of the code: restored from the base, it fails.
            await s.write_files({"tests/test_fmt.py": "def test_width():\n    pass\n"})
            cheated = await s.grade()
        assert cheated.status == "ok" and cheated.reward == 0.0, (task.id, cheated.message)
        assert outcomes(cheated)["tests/test_fmt.py::test_width"] == "failed"
    report = await validate(gclient, imported, runs=1, concurrency=2)
    assert [v.verdict for v in report.tasks] == ["valid", "valid"], [v.problems for v in report.tasks]


async def test_answers_by_call_order_pay_in_the_full_run_and_fail_the_second_opinion(
    grading_daemon: NodeDaemon, gclient: AsyncClient, tasks: dict[str, Task]
) -> None:
    """A policy that memorised the answers the tests expect, in the order the full run asks for
    them, computes nothing: plain code, no finding of the guard, 1.0 before (issue 44, a second
    opinion). Each FAIL_TO_PASS test that passed now runs again alone, in a fresh interpreter:
    the second asks first and gets the first answer. The real fix agrees with itself."""
    calc = tasks["py-calc"]
    grader = grading_daemon.grader
    memorised = (
        "_answers = iter([12, 0, -6])\n\n\ndef add(a, b):\n    return a + b\n\n\ndef multiply(a, b):\n    return next(_answers)\n"
    )
    async with gclient.session(task=calc) as s:
        await s.write_files({"calc/__init__.py": memorised})
        hacked = await s.grade()
        off = await s.grade(task=Task(calc.spec.model_copy(update={"evaluation": calc.spec.evaluation.model_copy(
            update={"second_opinion": "off"})}), calc.workspace_tar))  # fmt: skip
    assert (off.status, off.reward) == ("ok", 1.0), off.message  # the hack, without the second opinion
    assert (hacked.status, hacked.reward) == ("ok", 0.0), (hacked.message, hacked.tampering)
    assert any(t.startswith("second opinion: tests/test_multiply.py::test_multiply_more[0-5-0] passed in the full run")
               for t in hacked.tampering), hacked.tampering  # fmt: skip
    checked = grader.second_opinions_total
    async with gclient.session(task=calc) as s:
        await solve_calc(s)
        solved = await s.grade()
    assert (solved.status, solved.reward) == ("ok", 1.0) and not solved.tampering, (solved.message, solved.tampering)
    assert grader.second_opinions_total == checked + 3  # its three FAIL_TO_PASS tests, one at a time


async def test_the_second_opinion_finds_tests_listed_in_another_spelling(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    """A task read as JUnit XML lists its tests as JUnit names (``tests.test_multiply::test_multiply``):
    the second opinion narrows pytest to the node ids the report matched them to, not to the
    listed spelling (which no pytest item has: every test would have been missing alone, and
    the fix called tampering)."""
    calc = tasks["py-calc"]
    ev = calc.spec.evaluation

    def junit_id(node_id: str) -> str:
        path, _, name = node_id.partition("::")
        return f"{path[:-3].replace('/', '.')}::{name}"

    junit = ev.model_copy(
        update={
            "test_command": "python3 -m pytest -p no:cacheprovider tests --junitxml={report}",
            "report_format": "junit",
            "fail_to_pass": [junit_id(t) for t in ev.fail_to_pass],
            "pass_to_pass": [junit_id(t) for t in ev.pass_to_pass],
        }
    )
    task = Task(calc.spec.model_copy(update={"evaluation": junit}), calc.workspace_tar)
    async with gclient.session(task=task) as s:
        await solve_calc(s)
        solved = await s.grade()
    assert (solved.status, solved.reward) == ("ok", 1.0) and not solved.tampering, (solved.message, solved.tampering)
    assert "tests.test_multiply::test_multiply" in {t.id for t in solved.tests}


async def test_clean_room_dying_is_infra_error_without_reward(
    grading_daemon: NodeDaemon, gclient: AsyncClient, tasks: dict[str, Task]
) -> None:
    spec = tasks["py-calc"].spec
    slow = Task(
        spec.model_copy(
            update={
                "evaluation": spec.evaluation.model_copy(update={"test_command": "sleep 30; " + spec.evaluation.test_command})
            }
        ),
        tasks["py-calc"].workspace_tar,
    )
    async with gclient.session(task=slow) as s:
        agent_id = grading_daemon.sessions.get(s.id).sandbox.container_id  # type: ignore[union-attr]
        grading = asyncio.create_task(s.grade())
        pool = grading_daemon.pools["python"]
        for _ in range(100):  # wait for the clean room to be leased, then kill it (an OOM kill, a node hiccup)
            rooms = [sb for sb in pool._leased if sb.container_id != agent_id]
            if rooms:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        await grading_daemon.runtime.docker.containers.container(rooms[0].container_id).kill()
        result = await grading
        assert (await s.exec("echo alive")).stdout == b"alive\n"  # the agent's session is untouched
    assert result.status == "infra_error"
    assert result.reward is None  # never a silent 0
    assert result.message


def with_reward(task: Task, reward: RewardSpec) -> Task:
    ev = task.spec.evaluation.model_copy(update={"reward": reward})
    return Task(task.spec.model_copy(update={"evaluation": ev}), task.workspace_tar)


async def test_custom_reward_command(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    score = "python3 -c 'import calc; print(\"partial\"); print(0.75 if calc.multiply(2, 3) == 6 else 0.1)'"
    scored = with_reward(tasks["py-calc"], RewardSpec(policy="command", command=score))
    broken = with_reward(tasks["py-calc"], RewardSpec(policy="command", command="echo no number"))
    async with gclient.session(task=scored) as s:
        before = await s.grade()
        await solve_calc(s)
        after = await s.grade()
        failing = await s.grade(task=broken)
    assert (before.status, before.reward) == ("ok", 0.1)
    assert (after.status, after.reward) == ("ok", 0.75)
    assert failing.status == "invalid_task" and failing.reward is None and "no number" in failing.message


async def test_a_reward_file_counts_only_as_the_tests_wrote_it(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    """A task whose test command writes its reward file only when the tests pass: a reward file of
    the agent's own in the workspace (which its changes carry to the clean room) is gone before
    the tests run, so a failing run has none and scores 0; the fix scores what the run wrote."""
    calc = tasks["py-calc"]
    ev = calc.spec.evaluation.model_copy(
        update={
            "test_command": "python3 -m pytest -q -p no:cacheprovider tests && echo 1.0 > out/reward.txt",
            "report_format": "exit-code",
            "reward": RewardSpec(policy="file", files=["out/reward.txt"]),
        }
    )
    task = Task(calc.spec.model_copy(update={"evaluation": ev}), calc.workspace_tar)
    # One the grader cannot remove (a mount point: the engine's /etc/hostname) is not the tests' either.
    pinned = ev.model_copy(update={"reward": RewardSpec(policy="file", files=["/etc/hostname"])})
    unremovable = Task(calc.spec.model_copy(update={"evaluation": pinned}), calc.workspace_tar)
    async with gclient.session(task=task) as s:
        await s.write_files({"out/reward.txt": "1.0\n"})
        planted = await s.grade()
        await solve_calc(s)
        solved = await s.grade()
        stuck = await s.grade(task=unremovable)
    assert (planted.status, planted.reward) == ("ok", 0.0), planted.message
    assert "wrote no reward file" in planted.message
    assert (solved.status, solved.reward) == ("ok", 1.0), solved.message
    assert (stuck.status, stuck.reward) == ("ok", 0.0) and "could not be removed" in stuck.message, stuck.message


# An image whose own PATH names a folder of the workspace (a project's bin/, an in-tree venv's bin/).
PATH_IMAGE = (
    "FROM rlsandbox/python-task:latest\nENV PATH=/workspace/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
)


async def test_hack_a_program_where_the_images_path_finds_it_first(
    images: dict[str, str], docker_runtime: DockerRuntime, tasks: dict[str, Task]
) -> None:
    """On such an image the test command's programs are looked up in the agent's folder first: a
    bin/python3 that exits 0 paid 1.0 to an unfixed task graded by exit code. The grader takes the
    PATH the command starts with from the room (not only from the command and the task's env) and
    discards the agent's files on it, as tampering."""
    tag = f"rls-test/workspace-path:{uuid.uuid4().hex[:8]}"
    await build_image(docker_runtime, tag, PATH_IMAGE)
    calc = tasks["py-calc"]
    ev = calc.spec.evaluation.model_copy(
        update={
            "test_command": "python3 -m pytest -q -p no:cacheprovider tests",
            "report_format": "exit-code",
            "fail_to_pass": [],
            "pass_to_pass": [],
        }
    )
    task = Task(calc.spec.model_copy(update={"pool": "pathy", "evaluation": ev}), calc.workspace_tar)
    try:
        pool = PoolConfig(name="pathy", image=tag, min_ready=0, max_total=4)
        async with running_daemon(daemon_config(pools=[pool])) as node, AsyncClient(node.address, timeout=120) as client:
            async with client.session(task=task) as s:
                await s.write_files({"bin/python3": ("#!/bin/sh\nexit 0\n", 0o755)})
                hacked = await s.grade()
            async with client.session(task=task) as s:
                await solve_calc(s)
                solved = await s.grade()
    finally:
        await docker_runtime.images.remove(tag)
    assert (hacked.status, hacked.reward) == ("ok", 0.0), (hacked.reward, hacked.message)
    assert any("bin/python3" in t and "PATH" in t for t in hacked.tampering), hacked.tampering
    assert (solved.status, solved.reward) == ("ok", 1.0), (solved.message, solved.log.decode(errors="replace")[-1500:])


# An image whose test runner is installed inside the workspace, with a task that does not list it
# in workspace.exclude: a virtualenv (R2E-Gym's /testbed/.venv, a uv project's .venv), and
# packages installed into a folder the test command puts on PYTHONPATH (pip install --target).
VENV_IMAGE = (
    "FROM rlsandbox/python-task:latest\n"
    "RUN python3 -m venv --without-pip /workspace/.venv && "
    "cp -a /usr/lib/python3/dist-packages/. /workspace/.venv/lib/python3.11/site-packages/ && "
    "cp -a /usr/lib/python3/dist-packages/. /workspace/.deps/\n"
)


async def test_hack_the_runner_installed_inside_the_workspace(
    images: dict[str, str], docker_runtime: DockerRuntime, tasks: dict[str, Task]
) -> None:
    """The runner the tests run with is the workspace's (its .venv's, or a .deps folder on
    PYTHONPATH): an agent that rewrote it (pytest's __main__ exits 0; a test that raises passes)
    was paid 1.0 for an unfixed task, by exit code and by pytest's report alike. The grader finds
    what is installed inside the workspace in the clean room before anything of the agent's is
    read (pyvenv.cfg, conda-meta, a folder of *.dist-info, the interpreter's prefix) and keeps the
    room's own, as for a path the task excludes."""
    tag = f"rls-test/workspace-venv:{uuid.uuid4().hex[:8]}"
    await build_image(docker_runtime, tag, VENV_IMAGE)
    calc = tasks["py-calc"]
    variants = []
    for command, site in (
        (".venv/bin/python -m pytest -rA -p no:cacheprovider tests", ".venv/lib/python3.11/site-packages"),
        ("PYTHONPATH=.deps python3 -m pytest -rA -p no:cacheprovider tests", ".deps"),
    ):
        by_report = calc.spec.evaluation.model_copy(update={"test_command": command})
        by_exit = by_report.model_copy(update={"report_format": "exit-code", "fail_to_pass": [], "pass_to_pass": []})
        for ev in (by_report, by_exit):
            variants.append((Task(calc.spec.model_copy(update={"pool": "venv", "evaluation": ev}), calc.workspace_tar), site))
    call = "    result = testfunction(**testargs)\n"
    try:
        pool = PoolConfig(name="venv", image=tag, min_ready=0, max_total=4)
        async with running_daemon(daemon_config(pools=[pool])) as node, AsyncClient(node.address, timeout=120) as client:
            hacked, solved = [], []
            for task, site in variants:
                async with client.session(task=task) as s:
                    python_py = f"{site}/_pytest/python.py"
                    src = (await s.read_files([python_py]))[python_py].data.decode()
                    assert call in src
                    swallowed = "    try:\n    " + call + "    except BaseException:\n        result = None\n"
                    await s.write_files(
                        {
                            f"{site}/pytest/__main__.py": "raise SystemExit(0)\n",
                            python_py: src.replace(call, swallowed),  # a test that raises passes
                        }
                    )
                    ran = await s.exec(task.spec.evaluation.test_command.replace("-rA", "-q"))
                    assert ran.exit_code == 0, ran.stdout_text[-800:]  # the hack works where the agent ran it
                    hacked.append(await s.grade())
                async with client.session(task=task) as s:
                    await solve_calc(s)
                    solved.append(await s.grade())
    finally:
        await docker_runtime.images.remove(tag)
    for result in hacked:
        assert (result.status, result.reward) == ("ok", 0.0), (result.reward, result.message, result.tampering)
    for result in solved:
        assert (result.status, result.reward) == ("ok", 1.0), (result.message, result.log.decode(errors="replace")[-1500:])
    # The venv's interpreter, named by a path relative to the workspace, is the one probed: its
    # pytest is guarded (before, only an absolute path was, and the guard stayed out).
    assert "guard did not load" not in solved[0].message and not solved[0].tampering, solved[0].message


async def test_what_the_grader_learns_of_a_workspace_is_not_taken_for_another_workspaces(
    grading_daemon: NodeDaemon, gclient: AsyncClient, tasks: dict[str, Task]
) -> None:
    """What the clean room's probe finds (the environments installed inside the workspace) is
    cached, and depends on the workspace: two tasks with the same image, setup and command but
    another workspace do not share it. A task whose runner is installed in the workspace
    (``.deps``, with its dist-info), graded after a task without it, was graded as if it had none:
    the agent's rewritten runner was taken, and paid 1.0."""
    calc = tasks["py-calc"]
    command = "PYTHONPATH=.deps python3 -m checker"
    ev = calc.spec.evaluation.model_copy(
        update={"test_command": command, "report_format": "exit-code", "fail_to_pass": [], "pass_to_pass": []}
    )
    spec = calc.spec.model_copy(update={"id": "py-calc-runner", "evaluation": ev})
    runner = {
        ".deps/checker/__init__.py": "",
        ".deps/checker/__main__.py": "import sys, calc\nsys.exit(0 if calc.multiply(6, 7) == 42 else 1)\n",
        ".deps/checker-1.0.dist-info/METADATA": "Name: checker\nVersion: 1.0\n",
    }
    without = Task(spec, calc.workspace_tar)  # its command finds no runner: it fails, reward 0
    with_runner = Task(spec, tar_files(runner, calc.workspace_tar))
    async with gclient.session(task=without) as s:
        first = await s.grade()  # the probe of this image, setup and command is cached now
    async with gclient.session(task=with_runner) as s:
        unsolved = await s.grade()
        await s.write_files({".deps/checker/__main__.py": "raise SystemExit(0)\n"})
        assert (await s.exec(command)).exit_code == 0  # the hack works where the agent ran it
        hacked = await s.grade()
        await solve_calc(s)
        solved = await s.grade()
    assert (first.status, first.reward) == ("ok", 0.0), first.message
    assert (unsolved.reward, hacked.reward, solved.reward) == (0.0, 0.0, 1.0), (hacked.message, solved.message)


async def test_hack_the_script_the_test_command_runs(
    grading_daemon: NodeDaemon, gclient: AsyncClient, tasks: dict[str, Task]
) -> None:
    """A test command that runs a workspace file as its runner (``sh ci/run_tests.sh``, ``python3
    run_tests.py``, a program named by its path) ran the agent's copy of it in the clean room: one
    that prints what a passing pytest run prints was paid 1.0 for an unfixed task (the pytest
    guard does not load, as no pytest runs: the report is read as it is). What the test command
    runs as its program or runner script is the task's now: the agent's change to it is
    discarded, and listed in ``tampering``."""
    calc = tasks["py-calc"]
    ev = calc.spec.evaluation
    ids = [*ev.fail_to_pass, *ev.pass_to_pass]
    forged = "".join(f"echo 'PASSED {i}'; " for i in ids) + f"echo '===== {len(ids)} passed in 0.01s ====='"
    pytest = "python3 -m pytest -rA -p no:cacheprovider tests"
    variants = {
        "sh ci/run_tests.sh": ("ci/run_tests.sh", pytest + "\n", forged + "\n"),
        "python3 run_tests.py": (
            "run_tests.py",
            "import subprocess, sys\nsys.exit(subprocess.call(sys.argv[1:] or " + repr(pytest.split()) + "))\n",
            f"import subprocess, sys\nsys.exit(subprocess.call(['sh', '-c', {forged!r}]))\n",
        ),
    }
    results = {}
    for command, (path, runner, hacked_runner) in variants.items():
        task = Task(
            calc.spec.model_copy(
                update={"id": f"py-calc-{path.replace('/', '-')}", "evaluation": ev.model_copy(update={"test_command": command})}
            ),
            tar_files({path: runner}, calc.workspace_tar),
        )
        async with gclient.session(task=task) as s:
            await s.write_files({path: hacked_runner})
            ran = await s.exec(command)
            assert ran.exit_code == 0 and b"PASSED tests/test_multiply.py::test_multiply" in ran.stdout, ran.stdout
            hacked = await s.grade()
            await solve_calc(s)
            await s.write_files({path: runner})
            solved = await s.grade()
        results[command] = (hacked, solved)
    for command, (hacked, solved) in results.items():
        assert (hacked.status, hacked.reward) == ("ok", 0.0), (command, hacked.reward, hacked.message)
        assert any("run by the test command" in t for t in hacked.tampering), (command, hacked.tampering)
        assert (solved.status, solved.reward) == ("ok", 1.0), (command, solved.message, solved.tampering)


async def test_prefetched_sandboxes_start_sessions_and_clean_rooms(
    grading_daemon: NodeDaemon, gclient: AsyncClient, tasks: dict[str, Task]
) -> None:
    """Prefetch keeps sandboxes prepared for a task: a session from the task (by ref, no workspace
    sent again, or the whole task) and its clean room are hand-outs of them, and grading is as
    right as with fresh ones."""
    calc = tasks["py-calc"]
    prefetcher = grading_daemon.sessions.prefetcher
    info = await gclient.prefetch(calc, 3, ttl=60)
    assert info.target == 3 and info.ref.startswith("py-calc@")
    for _ in range(600):
        info = await gclient.prefetch(info, 3, ttl=60)  # asking again by ref keeps the same target
        if info.ready == 3:
            break
        await asyncio.sleep(0.05)
    assert info.ready == 3, info
    before = prefetcher.handed_out_total
    async with gclient.session(task=info) as s:  # by ref
        assert s.info.task_id == "py-calc"
        assert "def multiply" in (await s.exec("cat calc/__init__.py")).stdout_text  # the workspace is there
        assert (await s.exec("git log --oneline | wc -l")).stdout == b"1\n"  # history reset
        unsolved = await s.grade()
        await solve_calc(s)
        solved = await s.grade()
    assert (unsolved.reward, solved.reward) == (0.0, 1.0), (unsolved.message, solved.message)
    # The session and both clean rooms were prepared sandboxes (refills keep the target meanwhile).
    assert prefetcher.handed_out_total - before == 3
    async with gclient.session(task=calc) as s:  # the whole task: found by its digest
        assert s.info.task_id == "py-calc"
    assert prefetcher.handed_out_total - before == 4
    stopped = await gclient.prefetch(info, 0)
    assert stopped.target == 0
    with pytest.raises(NotFoundError, match="unknown on this node"):
        await gclient.create_session(task=type(info)("py-calc@0000", 0, 0, 0, ""))


async def test_a_group_prefetched_at_once_resets_git_once(
    grading_daemon: NodeDaemon, gclient: AsyncClient, tasks: dict[str, Task]
) -> None:
    """Sandboxes of one task prepared at once (a GRPO group's prefetch): one runs the git reset,
    the others wait for it and extract what it made; every session starts from the same base."""
    calc = tasks["py-calc"]
    # A workspace no other test uses (reset workspaces are kept by content).
    task = Task(calc.spec.model_copy(update={"id": "py-calc-group"}), tar_files({"GROUP.md": "group\n"}, calc.workspace_tar))
    workspaces = grading_daemon.grader.workspaces
    hits = workspaces.based_hits
    ref = await gclient.prefetch(task, 3, ttl=60)
    for _ in range(600):
        if (ref := await gclient.prefetch(ref, 3, ttl=60)).ready == 3:
            break
        await asyncio.sleep(0.05)
    assert ref.ready == 3, ref
    # One reset, the others its hits; a sandbox the prefetch re-prepares (one that died under
    # load) is one more hit, not a second reset: the CI once saw 3.
    assert workspaces.based_hits - hits >= 2
    heads = []
    for _ in range(3):
        async with gclient.session(task=ref) as s:
            look = await s.exec("git rev-parse HEAD && git log --oneline | wc -l && git status --porcelain && cat GROUP.md")
            heads.append(look.stdout_text)
            await solve_calc(s)
            graded = await s.grade()
            assert (graded.status, graded.reward) == ("ok", 1.0), graded.message
    assert heads == [heads[0]] * 3 and heads[0].split("\n")[1:] == ["1", "group", ""], heads
    await gclient.prefetch(ref, 0)


async def test_a_traced_grade_shows_each_clean_room_step_as_a_child_span(gclient: AsyncClient, tasks: dict[str, Task]) -> None:
    from otlp import attributes, otlp_receiver
    from rlsandbox.daemon import tracing

    async with otlp_receiver() as (receiver, endpoint):
        tracing.configure(endpoint, node_id="grading")
        try:
            async with gclient.session(task=tasks["py-calc"]) as s:
                await solve_calc(s)
                result = await s.grade()
        finally:
            await asyncio.to_thread(tracing.shutdown)
    assert result.status == "ok" and result.reward == 1.0, result.message
    [evaluate] = receiver.named("Evaluate")
    steps = {sp.name: sp for sp in receiver.spans if sp.parent_span_id == evaluate.span_id}
    assert {"grade.agent_archive", "grade.room", "grade.base_archive", "grade.plan", "grade.apply", "grade.tests"} <= set(steps)
    assert attributes(steps["grade.tests"])["rlsandbox.guarded"] is True  # pytest ran under the guard
    assert attributes(steps["grade.apply"])["rlsandbox.writes"] >= 1  # the agent's fix went in
    for sp in steps.values():
        assert sp.trace_id == evaluate.trace_id and evaluate.start_time_unix_nano <= sp.start_time_unix_nano
        assert sp.end_time_unix_nano <= evaluate.end_time_unix_nano
    [create] = receiver.named("CreateSession")
    children = {sp.name: sp for sp in receiver.spans if sp.parent_span_id == create.span_id}
    # The task is prepared in the session's sandbox, unless an earlier test left one prefetched.
    prefetched = attributes(children["pool.acquire"])["rlsandbox.prefetched"]
    assert ("task.prepare" in children) is not prefetched
