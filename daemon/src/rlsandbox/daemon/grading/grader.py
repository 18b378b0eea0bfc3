"""The grader: workspace preparation at session start and reward computation at the end.

Clean room (the default): the agent's workspace is read by the engine, diffed against the
workspace of a fresh sandbox of the same pool prepared the same way, and the allowed changes are
applied there; hidden tests and the test patch are added, the test command runs (network off, as
every sandbox), and its report is read through the engine again from a path the agent never saw.
Nothing the agent did outside its workspace (site-packages, the interpreter, background
processes) reaches the clean room. See docs/GRADING.md.

In place (faster, weaker, never the default): hidden tests are added to the agent's own sandbox
and the test command runs there.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import secrets
import shlex
import tarfile
import time
from collections.abc import Mapping

from rlsandbox.daemon.errors import FailedPrecondition, FileTooLarge, SandboxError
from rlsandbox.daemon.grading.reports import OUTPUT_FORMATS, parse_report
from rlsandbox.daemon.grading.rewards import (
    MISSING,
    GradedTest,
    GradeResult,
    GradeStatus,
    TestGroup,
    cap_log,
    compute_reward,
    grade_tests,
    parse_command_reward,
)
from rlsandbox.daemon.grading.task import Task
from rlsandbox.daemon.grading.workspace import changes_tar, plan, snapshot_from_archive
from rlsandbox.daemon.model import ExecRequest, ExecResult, MiB
from rlsandbox.daemon.pool import WarmPool
from rlsandbox.daemon.runtime.docker import DockerRuntime
from rlsandbox.daemon.sandbox import Sandbox

log = logging.getLogger(__name__)

MAX_SNAPSHOT_BYTES = 256 * MiB
MAX_REPORT_BYTES = 32 * MiB
OUTPUT_CAP = 8 * MiB
STEP_TIMEOUT = 60.0
GIT_IDENTITY = ("-c", "user.name=rlsandbox", "-c", "user.email=rlsandbox@localhost", "-c", "commit.gpgsign=false")
# The environment of every grading command, over the task's own: no bytecode (a stale or planted
# .pyc must not stand in for a restored source), no user site-packages.
GRADE_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}
# Runners whose exit code is non-zero exactly when a test failed: a report without failures from
# such a run was written by someone else.
EXIT_CHECKED_FORMATS = frozenset({"pytest", "junit", "pytest-junit", "unittest", "tap", "jest", "vitest", "go"})


class TaskSetupFailed(FailedPrecondition):
    """The task's workspace or setup commands failed in a fresh sandbox: the task is broken."""


class Grader:
    """Prepares task workspaces and grades sessions.

    Args:
        runtime: the engine, for reading and writing workspaces without trusting the sandbox.
        pools: where clean rooms come from (the session's own pool: same image, same limits).
        acquire_timeout: how long to wait for a clean-room sandbox.
    """

    def __init__(self, runtime: DockerRuntime, pools: Mapping[str, WarmPool], *, acquire_timeout: float = 60.0) -> None:
        self.runtime = runtime
        self.pools = pools
        self.acquire_timeout = acquire_timeout
        self.graded_total = 0
        self.infra_errors_total = 0

    # -- preparation ----------------------------------------------------------------------------
    async def prepare(self, sandbox: Sandbox, task: Task, *, reset_git: bool = True) -> None:
        """Put the task's workspace in place and run its setup commands.

        Raises:
            TaskSetupFailed: a command exited non-zero or timed out (the output says why).
        """
        ws = task.spec.workspace
        if ws.source == "bundle":
            await self._run(sandbox, ExecRequest(argv=("mkdir", "-p", ws.path), timeout=STEP_TIMEOUT), "create the workspace")
            if task.workspace_tar:
                await self.runtime.put_archive(sandbox.container_id, ws.path, task.workspace_tar)
        if reset_git and ws.git == "reset":
            # One commit, the base: whatever history the workspace had (with the fix in it) is gone.
            git = " ".join(shlex.quote(a) for a in GIT_IDENTITY)
            script = (
                "if command -v git >/dev/null 2>&1; then rm -rf .git && git init -q && git add -A && "
                f"git {git} commit -q --allow-empty -m 'rlsandbox: task base'; fi"
            )
            await self._run(sandbox, ExecRequest(shell=script, cwd=ws.path, timeout=STEP_TIMEOUT), "reset the git history")
        for command in task.spec.setup:
            await self._run(
                sandbox, ExecRequest(shell=command, cwd=ws.path, timeout=task.spec.setup_timeout), f"run setup {command!r}"
            )

    async def _run(self, sandbox: Sandbox, req: ExecRequest, what: str) -> ExecResult:
        result = await sandbox.exec(req)
        if not result.ok:
            tail = (result.stdout[-1500:] + result.stderr[-1500:]).decode("utf-8", errors="replace")
            why = "timed out" if result.timed_out else f"exited with {result.exit_code}"
            raise TaskSetupFailed(f"task setup: could not {what}: {why}: {tail.strip()}")
        return result

    # -- grading --------------------------------------------------------------------------------
    async def grade(self, agent: Sandbox, task: Task, *, mode: str = "clean_room", timeout: float | None = None) -> GradeResult:
        """Grade the agent's sandbox against ``task``. Never raises for infrastructure trouble:
        that is a result with status infra_error and no reward."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                if mode == "in_place":
                    result = await self._in_place(agent, task)
                else:
                    result = await self._clean_room(agent, task)
        except TimeoutError:
            result = GradeResult(GradeStatus.TIMEOUT, None, f"grading did not finish within its deadline of {timeout:.1f} s")
        except TaskSetupFailed as e:
            result = GradeResult(GradeStatus.INVALID_TASK, None, e.message)
        except SandboxError as e:
            result = GradeResult(GradeStatus.INFRA_ERROR, None, f"{type(e).__name__}: {e.message}")
        except (tarfile.TarError, OSError) as e:  # an unreadable archive from the engine: not the agent's doing
            result = GradeResult(GradeStatus.INFRA_ERROR, None, f"{type(e).__name__}: {e}")
        result.mode = mode
        result.duration = time.monotonic() - started
        self.graded_total += 1
        if result.status is GradeStatus.INFRA_ERROR:
            self.infra_errors_total += 1
            log.warning("grading task %s: infra error: %s", task.id, result.message)
        return result

    async def _clean_room(self, agent: Sandbox, task: Task) -> GradeResult:
        pool = self.pools.get(agent.pool)
        if pool is None:  # pragma: no cover - a session's pool exists while the session does
            raise FailedPrecondition(f"pool {agent.pool} is gone")
        ws = task.spec.workspace.path
        ev = task.spec.evaluation
        agent_archive = await self._archive(agent, ws)
        room = await pool.acquire(self.acquire_timeout)
        try:
            await self.prepare(room, task, reset_git=False)
            base = snapshot_from_archive(await self._archive(room, ws))
            mine = snapshot_from_archive(agent_archive)
            changes = plan(base, mine, protected=ev.protected, test_files=ev.test_files, hidden=list(ev.hidden_tests))
            if changes.deletes:
                for i in range(0, len(changes.deletes), 500):
                    chunk = tuple(posixpath.join(ws, p) for p in changes.deletes[i : i + 500])
                    await self._infra(room, ExecRequest(argv=("rm", "-rf", "--", *chunk), timeout=STEP_TIMEOUT), "delete files")
            hidden = {p: c.encode() for p, c in ev.hidden_tests.items()}
            if changes.writes or hidden:
                await self.runtime.put_archive(room.container_id, ws, changes_tar(changes.writes, hidden))
            result = await self._evaluate(room, task)
            result.tampering = changes.discarded + result.tampering
            if mine.skipped:
                result.tampering.append(f"{len(mine.skipped)} device, fifo or socket file(s) not copied")
            return result
        finally:
            await pool.release(room, "clean room done")

    async def _in_place(self, agent: Sandbox, task: Task) -> GradeResult:
        ev = task.spec.evaluation
        if ev.hidden_tests:
            hidden = {p: c.encode() for p, c in ev.hidden_tests.items()}
            targets = tuple(posixpath.join(task.spec.workspace.path, p) for p in hidden)
            await self._infra(
                agent, ExecRequest(argv=("rm", "-rf", "--", *targets), timeout=STEP_TIMEOUT), "clear hidden test paths"
            )
            await self.runtime.put_archive(agent.container_id, task.spec.workspace.path, changes_tar({}, hidden))
        return await self._evaluate(agent, task)

    async def _archive(self, sandbox: Sandbox, path: str) -> bytes:
        try:
            return await self.runtime.get_archive(sandbox.container_id, path, MAX_SNAPSHOT_BYTES)
        except FileTooLarge as e:
            raise FailedPrecondition(f"the workspace {path} is too large to grade: {e.message}") from None

    async def _infra(self, sandbox: Sandbox, req: ExecRequest, what: str) -> ExecResult:
        result = await sandbox.exec(req)
        if not result.ok:
            detail = result.stderr[-500:].decode("utf-8", errors="replace").strip()
            raise FailedPrecondition(
                f"grader could not {what} ({'timed out' if result.timed_out else result.exit_code}): {detail}"
            )
        return result

    async def _evaluate(self, room: Sandbox, task: Task) -> GradeResult:
        """Apply the test patch, run the tests, read and parse the report, compute the reward."""
        ws = task.spec.workspace.path
        ev = task.spec.evaluation
        if ev.test_patch:
            applied = await room.exec(
                ExecRequest(
                    argv=("git", "apply", "--whitespace=nowarn", "-"), cwd=ws, stdin=ev.test_patch.encode(), timeout=STEP_TIMEOUT
                )
            )
            if not applied.ok:
                detail = (applied.stderr or applied.stdout)[-1000:].decode("utf-8", errors="replace").strip()
                return GradeResult(GradeStatus.INVALID_TASK, None, f"the test patch does not apply: {detail}")
        # The report goes where the agent never had a sandbox and never saw the name.
        report_dir = f"/.rlsandbox-grade-{secrets.token_hex(8)}"
        report_path = f"{report_dir}/report"
        await self._infra(room, ExecRequest(argv=("mkdir", "-p", report_dir), timeout=STEP_TIMEOUT), "create the report folder")
        command = ev.test_command.replace("{report}", shlex.quote(report_path))
        env = {**ev.env, **GRADE_ENV}
        run = await room.exec(
            ExecRequest(shell=command, cwd=ws, env=env, timeout=ev.timeout, stdout_cap=OUTPUT_CAP, stderr_cap=OUTPUT_CAP)
        )
        if ev.report_format in OUTPUT_FORMATS:
            data = run.stdout + b"\n" + run.stderr
        else:
            try:
                data, _ = await self.runtime.get_file(room.container_id, report_path, MAX_REPORT_BYTES)
            except (SandboxError, IsADirectoryError):
                data = b""
        exit_code = run.exit_code if not run.timed_out else None
        report = parse_report(ev.report_format, data, exit_code=exit_code, root=ws)
        tests = grade_tests(ev, report)
        result = GradeResult(
            GradeStatus.TIMEOUT if run.timed_out else GradeStatus.OK,
            None,
            tests=tests,
            exit_code=run.exit_code,
            timed_out=run.timed_out,
            report_complete=report.complete,
            log=cap_log(run.stdout, run.stderr),
        )
        problems = list(report.problems)
        if (
            ev.report_format in EXIT_CHECKED_FORMATS
            and run.exit_code not in (0, None)
            and report.tests
            and not report.any_failed
            and report.complete
        ):
            result.tampering.append(
                f"the report shows no failure but the test command exited with {run.exit_code}: "
                "report not trusted, every listed test counts as failed"
            )
            tests = [t if t.group is TestGroup.OTHER else GradedTest(t.id, MISSING, t.group) for t in tests]
            result.tests = tests
        if ev.reward.policy == "command":
            assert ev.reward.command is not None
            scored = await room.exec(ExecRequest(shell=ev.reward.command, cwd=ws, env=env, timeout=STEP_TIMEOUT))
            try:
                result.reward = parse_command_reward(scored.stdout) if scored.ok else None
            except ValueError as e:
                result.reward = None
                problems.append(str(e))
            if result.reward is None:
                result.status = GradeStatus.INVALID_TASK
                problems.append(f"the reward command failed (exit {scored.exit_code}, timed out: {scored.timed_out})")
        else:
            result.reward = compute_reward(ev.reward, tests)
        result.message = "; ".join(problems)
        return result
