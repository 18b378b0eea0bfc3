"""Task auditing through a real daemon (grading/audit.py): a task whose tests check all of its
fix is strong; one whose gold patch holds a part no test checks is weak (leaving that hunk out,
or stubbing its function, still earns the full reward); one whose tests pass before the fix has
no signal. Through the command line too, with its report and its clean set."""

from __future__ import annotations

import asyncio
import difflib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from helpers import daemon_config, running_daemon
from rlsandbox.client import AsyncClient
from rlsandbox.daemon import cli
from rlsandbox.daemon.config import PoolConfig
from rlsandbox.daemon.grading.audit import audit
from rlsandbox.daemon.grading.task import Task, load_tasks
from rlsandbox.daemon.grading.validate import write_tasks
from rlsandbox.daemon.server import NodeDaemon

pytestmark = pytest.mark.docker
TASKS = Path(__file__).resolve().parent.parent / "fixtures" / "tasks"


@pytest.fixture(scope="module")
async def audit_daemon(images: dict[str, str]) -> AsyncIterator[NodeDaemon]:
    pool = PoolConfig(name="python", image="rlsandbox/python-task:latest", min_ready=2, max_total=12)
    async with running_daemon(daemon_config(pools=[pool])) as node:
        yield node


def three_tasks() -> list[Task]:
    calc = load_tasks(TASKS / "py-calc" / "task.yaml")[0]
    base = (TASKS / "py-calc" / "workspace" / "calc" / "__init__.py").read_text()
    fixed = base.replace("def multiply(a, b):\n    return a + b\n", "def multiply(a, b):\n    return a * b\n")
    # The fix, and a helper no test calls: leaving it out, or stubbing it, still earns 1.0.
    doc, rest = fixed.split("\n", 1)
    extended = f"{doc}\n\n\ndef square(a):\n    return multiply(a, a)\n{rest}"  # a hunk of its own, before add()
    lines = difflib.unified_diff(
        base.splitlines(keepends=True), extended.splitlines(keepends=True), "a/calc/__init__.py", "b/calc/__init__.py", n=1
    )
    weak = calc.spec.model_copy(update={"id": "py-calc-untested-helper", "gold_patch": "".join(lines)})
    # Its listed tests pass before any fix: no signal.
    ev = calc.spec.evaluation.model_copy(update={"fail_to_pass": [], "pass_to_pass": ["tests/test_basic.py::test_add"]})
    silent = calc.spec.model_copy(update={"id": "py-calc-no-signal", "evaluation": ev})
    return [calc, Task(weak, calc.workspace_tar), Task(silent, calc.workspace_tar)]


async def test_audit_tells_strong_weak_and_silent_tasks_apart(audit_daemon: NodeDaemon, tmp_path: Path) -> None:
    tasks = three_tasks()
    async with AsyncClient(audit_daemon.address, timeout=120) as client:
        report = await audit(client, tasks, concurrency=4)
    verdicts = {v.task_id: v for v in report.tasks}
    strong, weak, silent = (verdicts[t.id] for t in tasks)
    assert strong.verdict == "strong" and strong.tried == 2 and not strong.accepted, strong  # multiply() stubbed twice
    assert weak.verdict == "weak", weak
    assert "the gold patch with calc/__init__.py:square() that returns None" in weak.accepted, weak.accepted
    assert any(a.startswith("the gold patch without its hunk 1 of calc/__init__.py") for a in weak.accepted), weak.accepted
    assert not any("multiply()" in a or "hunk 2" in a for a in weak.accepted), weak.accepted  # the fix itself is checked
    assert silent.verdict == "no_signal" and "the empty patch" in silent.accepted, silent
    assert report.counts()["strong"] == 1 and json.dumps(report.to_json())

    # The command line a user runs: the table, the report, and the clean set.
    write_tasks(tasks[:1], tmp_path / "in")
    argv = ["tasks", "audit", str(tmp_path / "in"), "--target", audit_daemon.address, "--concurrency", "4"]
    argv += ["--report", str(tmp_path / "audit.json"), "--out", str(tmp_path / "clean")]
    assert await asyncio.to_thread(cli.main, argv) == 0  # every task audited is strong
    saved = json.loads((tmp_path / "audit.json").read_text())
    assert saved["counts"] == {"strong": 1, "weak": 0, "no_signal": 0, "gold_fails": 0, "invalid_task": 0, "infra_error": 0}
    assert saved["wrong_patches_graded"] == 2
    assert [t.id for t in load_tasks(tmp_path / "clean")] == ["py-calc"]
