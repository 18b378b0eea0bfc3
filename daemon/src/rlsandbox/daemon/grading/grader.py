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
import random
import secrets
import shlex
import tarfile
import time
from collections.abc import Callable, Mapping, Sequence

from rlsandbox.daemon import tracing
from rlsandbox.daemon.errors import ArchiveCutShort, FailedPrecondition, FileTooLarge, SandboxDied, SandboxError
from rlsandbox.daemon.grading import second_opinion
from rlsandbox.daemon.grading.guard import (
    NODE_FORMATS,
    PYTEST_FORMATS,
    UNITTEST_FORMATS,
    GuardLog,
    guard_setup,
    keeps_guard_out,
    read_guard_log,
    read_node_guard_log,
    split_records,
    warm_pytest,
    witnessed,
)
from rlsandbox.daemon.grading.patches import PatchError, apply_patch, patch_paths
from rlsandbox.daemon.grading.prepare import STEP_TIMEOUT, TAR_ENV, TASK_CACHE_BYTES, ReadTimedOut, Workspaces
from rlsandbox.daemon.grading.reports import OUTPUT_FORMATS, Outcome, TestReport, lookup, parse_report
from rlsandbox.daemon.grading.rewards import (
    MISSING,
    REWARD_FILE_CAP,
    GradedTest,
    GradeResult,
    GradeStatus,
    TestGroup,
    cap_log,
    compute_reward,
    episodes_mess,
    grade_tests,
    id_match_note,
    parse_command_reward,
    parse_reward_file,
)
from rlsandbox.daemon.grading.room import AgentsMess, TaskSetupFailed, excluded_paths, file_data, plan_room
from rlsandbox.daemon.grading.shadowing import PROBE, ImportFacts, interpreters
from rlsandbox.daemon.grading.task import RewardSpec, Task
from rlsandbox.daemon.grading.workspace import changes_tar, snapshot_from_archive
from rlsandbox.daemon.model import ExecRequest, ExecResult, FileWrite, MiB
from rlsandbox.daemon.pool import EPISODES_DOING, HOST_OOM, WarmPool
from rlsandbox.daemon.runtime.docker import DockerRuntime, path_kind
from rlsandbox.daemon.sandbox import Sandbox

log = logging.getLogger(__name__)

MAX_SNAPSHOT_BYTES = 256 * MiB
MAX_REPORT_BYTES = 32 * MiB
OUTPUT_CAP = 8 * MiB
FACTS_CACHE = 256  # probe answers kept (one per image, setup and environment)
# The environment of every grading command, over the task's own: no bytecode (a stale or planted
# .pyc must not stand in for a restored source), no user site-packages.
GRADE_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}
# Runners whose exit code is non-zero exactly when a test failed: a report without failures from
# such a run was written by someone else.
# Where a Python guard runs (pytest's or unittest's), and so a second opinion can.
GUARDED_PYTHON = PYTEST_FORMATS | UNITTEST_FORMATS
EXIT_CHECKED_FORMATS = frozenset({"pytest", "junit", "pytest-junit", "unittest", "tap", "jest", "vitest", "go"})


class Grader:
    """Prepares task workspaces and grades sessions.

    Args:
        runtime: the engine, for reading and writing workspaces without trusting the sandbox.
        pools: where clean rooms come from (the session's own pool: same image, same limits).
        acquire_timeout: how long to wait for a clean-room sandbox.
        tampering_policy: "strict" (tampering detected makes the reward 0) or "report", for tasks
            that do not say.
        warm_pytest: a recycling room forks pytest from its warm interpreter where the test command
            allows (guard.warm_pytest) instead of starting it.
        second_opinion: for tasks that do not say, which tests of a paying Python grade run again
            alone (second_opinion.py): "fail_to_pass", "all" or "off"; ``second_opinion_share``
            of the paying grades get one (1.0: all).
    """

    def __init__(
        self,
        runtime: DockerRuntime,
        pools: Mapping[str, WarmPool],
        *,
        acquire_timeout: float = 60.0,
        tampering_policy: str = "strict",
        warm_pytest: bool = True,
        task_cache_bytes: int = TASK_CACHE_BYTES,
        second_opinion: str = "fail_to_pass",
        second_opinion_share: float = 1.0,
    ) -> None:
        self.runtime = runtime
        self.pools = pools
        self.workspaces = Workspaces(runtime, pools, based_budget=task_cache_bytes)
        self.acquire_timeout = acquire_timeout
        self.tampering_policy = tampering_policy
        self.warm_pytest = warm_pytest
        self.max_workspace_bytes = MAX_SNAPSHOT_BYTES
        self.agent_read_timeout = STEP_TIMEOUT  # past it, the agent's workspace scores 0 (its contents decide)
        self._facts: dict[tuple[object, ...], ImportFacts | None] = {}
        self.second_opinion = second_opinion
        self.second_opinion_share = second_opinion_share
        self.graded_total = 0
        self.infra_errors_total = 0
        self.second_opinions_total = 0  # tests run alone after a paying grade (second_opinion.py)
        self.disagreements_total = 0  # of those, the ones that did not pass alone

    # -- preparation (grading/prepare.py) ------------------------------------------------------
    async def prepare(self, sandbox: Sandbox, task: Task, *, reset_git: bool = True) -> None:
        """Put the task's workspace in place and run its setup (TaskSetupFailed when they fail)."""
        await self.workspaces.prepare(sandbox, task, reset_git=reset_git)

    # -- grading --------------------------------------------------------------------------------
    async def grade(
        self,
        agent: Sandbox,
        task: Task,
        *,
        mode: str = "clean_room",
        timeout: float | None = None,
        rooms: Callable[[], Sandbox | None] | None = None,
    ) -> GradeResult:
        """Grade the agent's sandbox against ``task``. Never raises for infrastructure trouble:
        that is a result with status infra_error and no reward."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(timeout):
                if mode == "in_place":
                    result = await self._in_place(agent, task)
                else:
                    result = await self._clean_room(agent, task, rooms)
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

    async def _clean_room(self, agent: Sandbox, task: Task, rooms: Callable[[], Sandbox | None] | None) -> GradeResult:
        """``rooms``: a sandbox already prepared for the task (session/prefetch.py), if one is ready."""
        pool = self.pools.get(agent.pool)
        if pool is None:  # pragma: no cover - a session's pool exists while the session does
            raise FailedPrecondition(f"pool {agent.pool} is gone")
        ws = task.spec.workspace.path
        key = await self._facts_key(task, agent.image)  # a room of the agent's pool runs its image
        agent_read: bytes | GradeResult | None = None
        if key in self._facts:
            # What the probe finds is known: the agent's workspace is read before a room is held
            # (a workspace slow to read must not keep a room from other grades meanwhile).
            agent_read = await self._agent_workspace(agent, ws, excluded_paths(task, self._facts[key]))
            if isinstance(agent_read, GradeResult):
                return agent_read
        prepared = rooms() if rooms is not None else None
        with tracing.span("grade.room", **{"rlsandbox.prefetched": prepared is not None}):
            room = prepared or await pool.acquire(self.acquire_timeout, warm=True)
        try:
            if prepared is None:
                with tracing.span("grade.prepare_room"):
                    await self.prepare(room, task, reset_git=False)
            # Before anything of the agent's is read: the Python environments inside the
            # workspace are the image's (the runner and its dependencies), read from no one.
            facts = await self._probe(room, task, key)
            excluded = excluded_paths(task, facts)
            if agent_read is None:
                read, base_archive = await asyncio.gather(
                    self._agent_workspace(agent, ws, excluded), self._base_archive(room, ws, excluded), return_exceptions=True
                )
                if isinstance(read, GradeResult):
                    return read
                if isinstance(read, BaseException):
                    raise read
                if isinstance(base_archive, BaseException):
                    raise base_archive
                agent_read = read
            else:
                base_archive = await self._base_archive(room, ws, excluded)
            agent_archive = agent_read
            assert isinstance(agent_archive, bytes) and isinstance(base_archive, bytes)
            try:
                # Parsing, diffing, scanning and packing workspaces is CPU work: off the event loop.
                with tracing.span("grade.plan"):
                    planned = await asyncio.to_thread(plan_room, task, facts, base_archive, agent_archive)
            except AgentsMess as e:
                result = episodes_mess(e.message)
                result.tampering = e.discarded
                return result
            changes, mine, patch_targets = planned.changes, planned.mine, planned.patch_targets
            with tracing.span(
                "grade.apply", **{"rlsandbox.writes": len(changes.writes), "rlsandbox.deletes": len(changes.deletes)}
            ):
                for i in range(0, len(changes.deletes), 500):
                    chunk = tuple(posixpath.join(ws, p) for p in changes.deletes[i : i + 500])
                    await self._infra(room, ExecRequest(argv=("rm", "-rf", "--", *chunk), timeout=STEP_TIMEOUT), "delete files")
                if planned.tar:  # nothing of the agent's has run in the room: its own tar extracts
                    await self.workspaces.put(room, ws, planned.tar, fresh=True)
            changed = [posixpath.join(ws, p) for p, e in changes.writes.items() if e.type == "file" and p not in patch_targets]
            evaluated = time.monotonic()
            try:
                # Named test files (a glob names none to read), the hidden ones, the test patch's.
                named = [p for p in task.spec.evaluation.test_files if not any(c in p for c in "*?[")]
                tests = sorted({*named, *task.spec.evaluation.hidden_tests, *patch_targets})
                result = await self._evaluate(
                    room, task, facts=facts, changed=changed, detected=planned.findings, test_files=tests
                )
            except SandboxError:
                # The episode's code killed the room (out of memory, past its disk budget on a node
                # whose disk ran low, or by tampering with its agent's stream): a mess of its own,
                # never an infra error to mask.
                cause, whose = await pool.death_cause(room) if not room.alive else ("", "")
                if whose == HOST_OOM:  # the node's doing: an infra error that says so
                    raise SandboxDied(f"the clean room died during the test run: {cause}") from None
                if whose not in EPISODES_DOING:
                    raise
                return episodes_mess(f"the clean room died of the episode's code: {cause}")
            _host_oom_during_run(pool, room, evaluated, "the clean room")
            await self._second_opinion(room, task, facts, changed, tests, result)
            result.tampering = changes.discarded + result.tampering
            if mine.skipped:
                result.tampering.append(f"{len(mine.skipped)} device, fifo or socket file(s) not copied")
            return result
        finally:
            pool.release(room, "clean room done", reuse=True)

    async def _second_opinion(
        self, room: Sandbox, task: Task, facts: ImportFacts | None, changed: list[str], tests: list[str], result: GradeResult
    ) -> None:
        """Run the tests that earned ``result``'s reward again, one at a time (second_opinion.py);
        a disagreement is tampering, and the reward 0 under the strict policy."""
        ev = task.spec.evaluation
        mode = ev.second_opinion or self.second_opinion
        if ev.report_format not in GUARDED_PYTHON or facts is None or random.random() >= self.second_opinion_share:
            return
        findings: list[str] = []
        # One after another: a room ends every process its user left as each command exits
        # (end_leftovers), so runs side by side would end each other.
        for check in second_opinion.checks(result, mode):
            alone_ev = ev.model_copy(update={"fail_to_pass": [check.listed], "pass_to_pass": [], "reward": RewardSpec()})
            alone_task = Task(task.spec.model_copy(update={"evaluation": alone_ev}), task.workspace_tar)
            with tracing.span("grade.second_opinion"):
                alone = await self._evaluate(
                    room, alone_task, facts=facts, changed=changed, detected=[], test_files=tests, only=check.nodeids, cold=True
                )
            self.second_opinions_total += 1
            found = second_opinion.disagreement(check, alone)
            if found or alone.tampering:
                self.disagreements_total += 1
                findings += [found] if found else []
                findings += [f"second opinion on {check.listed}: {t}" for t in alone.tampering]
        if not findings:
            return
        result.tampering += findings
        if (ev.tampering_policy or self.tampering_policy) == "strict" and result.reward:
            result.reward = 0.0
            head = f"tampering detected by the second opinion ({len(findings)} finding(s)): reward 0 under the strict policy"
            result.message = "; ".join(m for m in (head, result.message) if m)

    async def _agent_workspace(self, agent: Sandbox, ws: str, excluded: list[str]) -> bytes | GradeResult:
        """The agent's workspace as an archive, or the grade of a workspace that cannot be read
        (the episode's doing: its minimum)."""
        try:
            with tracing.span("grade.agent_archive", **{"rlsandbox.container": agent.container_id}):
                return await self.workspaces.read(
                    agent, ws, self.max_workspace_bytes, fresh=False, timeout=self.agent_read_timeout, exclude=excluded
                )
        except FileTooLarge:
            return episodes_mess(f"the workspace {ws} is over the grading limit of {self.max_workspace_bytes >> 20} MiB")
        except ReadTimedOut as e:
            return episodes_mess(f"the workspace is too slow to read: {e.message}")
        except ArchiveCutShort as e:
            return episodes_mess(f"the workspace cannot be read whole: {e.message}")

    async def _base_archive(self, room: Sandbox, ws: str, excluded: list[str]) -> bytes:
        try:
            with tracing.span("grade.base_archive"):
                return await self.workspaces.read(room, ws, MAX_SNAPSHOT_BYTES, fresh=True, exclude=excluded)
        except FileTooLarge:
            raise TaskSetupFailed(
                f"the task's own workspace is over the grading limit of {MAX_SNAPSHOT_BYTES >> 20} MiB"
            ) from None

    async def _facts_key(self, task: Task, image: str) -> tuple[object, ...]:
        """What the probe's answer depends on: the image, the workspace put in it (the
        environments found there), the setup commands, the environment and the command."""
        ev, ws = task.spec.evaluation, task.spec.workspace
        tar = task.workspace_tar  # bytes keep their hash once computed (prepare may have)
        digest = hash(tar) if len(tar) < 1 << 20 else await asyncio.to_thread(hash, tar)
        env = tuple(sorted(ev.env.items()))
        return (image, tuple(task.spec.setup), env, ev.test_command, ws.path, tuple(ws.exclude), ws.patch, len(tar), digest)

    async def _probe(self, room: Sandbox, task: Task, key: tuple[object, ...]) -> ImportFacts | None:
        """What the clean room's interpreters resolve outside the workspace, before any agent file
        is there; cached by ``key`` (``_facts_key``)."""
        ev, ws = task.spec.evaluation, task.spec.workspace
        if key in self._facts:
            return self._facts[key]
        facts: ImportFacts | None = None
        named = interpreters(ev.test_command, ws.path)
        # The system's python3 is asked too when none of those the command names answered.
        for i, python in enumerate([*named, "python3"]):
            if i == len(named) and (facts is not None or "python3" in named):
                break
            run = await room.exec(
                ExecRequest(
                    argv=(python, "-c", PROBE, ws.path, *(posixpath.join(ws.path, e) for e in ws.exclude)),
                    cwd="/",
                    env={**ev.env, **GRADE_ENV},
                    timeout=STEP_TIMEOUT,
                )
            )
            if not run.ok:
                continue  # no such interpreter here: nothing of it to shadow
            try:
                found = ImportFacts.parse(run.stdout)
            except (ValueError, KeyError, IndexError):
                continue
            facts = found if facts is None else facts.merged(found)
        if len(self._facts) >= FACTS_CACHE:
            self._facts.pop(next(iter(self._facts)))
        self._facts[key] = facts
        return facts

    async def _in_place(self, agent: Sandbox, task: Task) -> GradeResult:
        ev = task.spec.evaluation
        ws = task.spec.workspace.path
        files: dict[str, bytes] = {p: c.encode() for p, c in ev.hidden_tests.items()}
        if ev.hidden_tests:
            targets = tuple(posixpath.join(ws, p) for p in files)
            await self._infra(
                agent, ExecRequest(argv=("rm", "-rf", "--", *targets), timeout=STEP_TIMEOUT), "clear hidden test paths"
            )
        if ev.test_patch:
            mine = snapshot_from_archive(await self._archive(agent, ws, task.spec.workspace.exclude))
            try:
                patched = apply_patch(
                    ev.test_patch.encode(), {p: file_data(mine, p) for p in patch_paths(ev.test_patch.encode())}
                )
            except PatchError as e:
                return GradeResult(GradeStatus.INVALID_TASK, None, f"the test patch does not apply: {e}")
            files.update({p: d for p, (d, _) in patched.items() if d is not None})
        if files:
            await self.workspaces.put(agent, ws, changes_tar({}, files))
        # The naive baseline on purpose: no guard, no shadowing rules (the agent owns this sandbox's
        # interpreter and site-packages anyway). Tests use it to prove that each attack works.
        evaluated = time.monotonic()
        result = await self._evaluate(agent, task, facts=None, changed=[], detected=[], clean_room=False)
        pool = self.pools.get(agent.pool)
        if pool is not None:
            _host_oom_during_run(pool, agent, evaluated, "the sandbox")
        return result

    async def _archive(self, sandbox: Sandbox, path: str, exclude: list[str]) -> bytes:
        try:
            return await self.workspaces.read(sandbox, path, self.max_workspace_bytes, fresh=False, exclude=exclude)
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

    async def _evaluate(
        self,
        room: Sandbox,
        task: Task,
        *,
        facts: ImportFacts | None,
        changed: list[str],
        detected: list[str],
        test_files: Sequence[str] = (),
        clean_room: bool = True,
        only: Sequence[str] = (),
        cold: bool = False,
    ) -> GradeResult:
        """Run the tests (under the pytest guard where pytest runs), read and check what they
        report, compute the reward. ``detected``: tampering found before the run. ``test_files``
        (relative to the workspace): read by the room's agent before and after the run; one that
        changed in between was rewritten by the code under test, whatever the runner.
        ``clean_room``: the room is the grade's alone, so every process the tests leave is ended as
        they exit (not in place: the session's own processes and shells run on). ``only``: the
        pytest node ids the guard keeps (every other test deselected); ``cold``: a fresh
        interpreter, never a warm one (a second opinion)."""
        ws = task.spec.workspace.path
        ev = task.spec.evaluation
        # The report goes where the agent never had a sandbox and never saw the name (/tmp on a
        # read-only root, where commands run as the sandbox's user: recycling pools).
        owned = self.workspaces.owner(room) is not None
        report_dir = f"{'/tmp' if owned else ''}/.rlsandbox-grade-{secrets.token_hex(8)}"
        report_path = f"{report_dir}/report"
        command = ev.test_command.replace("{report}", shlex.quote(report_path))
        env = {**ev.env, **GRADE_ENV}
        mkdir = ExecRequest(argv=("mkdir", "-m", "700", "-p", report_dir), timeout=STEP_TIMEOUT)
        await self._infra(room, mkdir, "create the report folder")
        guard = None
        if owned and facts is not None and not facts.user_site:
            facts = None  # nowhere to load the guard from on a read-only root: its absence is reported
        runner = _runner(ev.report_format)
        home: str | None = report_dir  # node: the guard is loaded by its path (NODE_OPTIONS)
        if runner != "node":
            home = None if facts is None else facts.pytest_dir if runner == "pytest" else facts.site_dir
        if runner is not None and home:
            # Written by the room's own agent: no code of the agent's workspace has run yet (an
            # archive upload through the engine costs ~100 ms more).
            guard = guard_setup(report_dir, runner)
            # Next to the image's pytest (unittest: in the first folder whose .pth files the
            # interpreter runs); on a read-only root, in a user site-packages inside the report
            # folder (PYTHONUSERBASE: an inline PYTHONPATH= in the command cannot drop it; the
            # room's /tmp is fresh, so no other user site exists there).
            module_dir = posixpath.join(report_dir, facts.user_site) if owned and facts and runner != "node" else home
            env.update(guard.env(ev.env, report_dir if owned or runner == "node" else None))
            if owned:
                env.pop("PYTHONNOUSERSITE", None)  # any value disables the user site the guard is in
            files = [
                FileWrite(posixpath.join(module_dir, guard.source[0]), guard.source[1], 0o644),
                FileWrite(guard.config_path, guard.config(ws, changed, only), 0o600),
            ]
            if guard.pth is not None:
                files.append(FileWrite(posixpath.join(module_dir, guard.pth[0]), guard.pth[1], 0o644))
            failed = [w for w in await room.write_files(files) if w.error]
            if failed:
                raise FailedPrecondition(f"grader could not install the {runner} guard: {failed[0].path}: {failed[0].error}")
            if runner == "node" and owned:
                command = await self._unreadable_node(room, command)
        warm = None
        warmable = guard is not None and guard.runner == "pytest" and owned and self.warm_pytest and ev.warm_runner and not cold
        if warmable and not keeps_guard_out(ev.test_command):
            found = warm_pytest(command, env)
            if found is not None:
                warm, assigned = found
                env.update(assigned)  # as the shell would have set them for the run
        reward_files = [posixpath.join(ws, p) for p in ev.reward.files] if ev.reward.policy == "file" else []
        if reward_files:
            # What lies there before the tests ran is not what they wrote: a reward file of the
            # agent's, carried in with its workspace, would stand where a failing run writes none.
            # (rm's exit code says nothing here: busybox's fails on a path through a file, where
            # nothing can be; what is still there afterwards is what counts.)
            # The system's PATH, as for the grader's tar: never a folder of the workspace.
            system = {"PATH": TAR_ENV["PATH"]}
            await room.exec(ExecRequest(argv=("rm", "-rf", "--", *reward_files), env=system, timeout=STEP_TIMEOUT, as_root=True))
        # One still there is not the tests' either: the reward is 0, never an error (masked).
        stale = [path for path in reward_files if await self._kind(room, path, owned) is not None]
        watched = [posixpath.join(ws, p) for p in test_files]
        before = await self._test_files(room, watched, MAX_REPORT_BYTES)
        with tracing.span("grade.tests", **{"rlsandbox.guarded": guard is not None, "rlsandbox.warm": warm is not None}):
            run = await room.exec(
                ExecRequest(
                    shell=command,
                    cwd=ws,
                    env=env,
                    timeout=ev.timeout,
                    stdout_cap=OUTPUT_CAP,
                    stderr_cap=OUTPUT_CAP,
                    warm=warm,
                    # Nothing the tests started acts after them: what is read next (the test
                    # files, the report, the guard's key file, a reward file) is as they left it.
                    end_leftovers=clean_room,
                )
            )
        # Read back no more than the largest of them was: what the run put there is not the task's,
        # and a changed size is a change already.
        largest = max((seen[1] for seen in before.values() if seen is not None), default=0)
        after = await self._test_files(room, watched, largest + 1)
        # Changed, not gone: a task's own command may move its tests away (Harbor's verifier does).
        # Gone is what the engine's view says is not there; one the agent cannot read (a FIFO put
        # in its place) is a change.
        rewritten = [path for path, seen in before.items() if seen is not None and after.get(path) not in (seen, None)]
        unread = [path for path, seen in before.items() if seen is not None and after.get(path) is None]
        if unread:
            rewritten += [st.path for st in await room.stat(unread) if st.exists]
        led = guard is not None and guard.runner in ("unittest", "node")  # its records start a line of their own
        stderr = split_records(run.stderr, led)[1] if guard is not None else run.stderr  # the guard's records apart
        stdout = split_records(run.stdout, led)[1] if guard is not None else run.stdout
        if ev.report_format in OUTPUT_FORMATS:
            data = stdout + b"\n" + stderr
        else:
            data = await self._read(room, report_path, owned)
        exit_code = run.exit_code if not run.timed_out else None
        report = parse_report(ev.report_format, data, exit_code=exit_code, root=ws)
        problems = list(report.problems)
        if run.ended:
            problems.append(
                f"{run.ended} process(es) still ran as the test command ended (its own or the setup's): ended before "
                f"its results were read: {', '.join(' '.join(name.split()) for name in run.ended_names)}"
            )
        detected = list(detected) + [
            f"the test file {posixpath.relpath(p, ws)} was changed during the test run" for p in rewritten
        ]
        if guard is not None:
            # Records come through stderr, or stdout when the command merges them (2>&1).
            if guard.runner == "node":
                checked = read_node_guard_log(run.stderr + b"\n" + run.stdout, guard.key)
            else:
                checked = read_guard_log(run.stderr + b"\n" + run.stdout, guard.key, guard.runner)
            # The guard deletes its key file as it loads, before any workspace code runs. A key
            # file still there means no guard loaded, and the code under test could read the
            # key: records are then not trusted, whatever they say.
            # A command that keeps the guard out lets the code under test read the key and remove
            # the file as the guard would: then no record is the guard's, whatever the file says.
            kept_out = keeps_guard_out(ev.test_command, guard.runner, user_site=owned)
            key_left = kept_out or (await self._exists(room, guard.config_path, owned) if checked.started else True)
            if key_left and checked.started:
                detected.append(f"signed {guard.runner}-guard records appeared although the guard never loaded: forged")
            if checked.started and not key_left and checked.ended and guard.runner == "node":
                # The runner's report stands, less every pass the guard did not witness.
                report, unseen, rewritten_report = witnessed(report, checked)
                detected += checked.tampering + rewritten_report
                problems += unseen + checked.notes
            elif checked.started and not key_left and guard.runner == "node":
                # Killed before its last checks (its own file unchanged, among them): nothing counts.
                report, _, _ = witnessed(report, GuardLog())
                detected += checked.tampering
                problems.append("the test runner was ended before it finished: no pass of the run counts")
            elif guard.runner == "node":
                # Fail closed: a node runner the guard is not in has nothing witnessed.
                report, _, _ = witnessed(report, GuardLog())
                problems.append(
                    "the node guard did not load: the test command does not run `node --test` with NODE_OPTIONS "
                    "as the grader set it; no pass of the runner's report counts"
                )
            elif checked.started and not key_left:
                detected += checked.tampering + _disagreements(report, checked.report())
                report = checked.report()
                if not checked.ended:
                    problems.append(
                        f"the test process ended before {guard.runner} finished (tests it did not report count as failed)"
                    )
                if checked.never_ran:
                    problems.append(
                        f"{len(checked.never_ran)} test(s) the runner was given never reported "
                        f"(first: {checked.never_ran[0]}): they count as errors"
                    )
            elif guard.runner == "pytest":
                problems.append("the pytest guard did not load: the test command does not run this image's pytest")
            else:
                problems.append("the unittest guard did not load: the test command runs no Python of this image")
        tests = grade_tests(ev, report)
        if note := id_match_note(tests, ev.id_match):
            problems.append(note)
        result = GradeResult(
            GradeStatus.TIMEOUT if run.timed_out else GradeStatus.OK,
            None,
            tests=tests,
            exit_code=run.exit_code,
            timed_out=run.timed_out,
            report_complete=report.complete,
            log=cap_log(stdout, stderr),
        )
        if (
            ev.report_format in EXIT_CHECKED_FORMATS
            and run.exit_code not in (0, None)
            and report.tests
            and not report.any_failed
            and report.complete
        ):
            detected.append(
                f"the report shows no failure but the test command exited with {run.exit_code}: "
                "report not trusted, every listed test counts as failed"
            )
            tests = [t if t.group is TestGroup.OTHER else GradedTest(t.id, MISSING, t.group, t.matched) for t in tests]
            result.tests = tests
        if ev.reward.policy == "command":
            assert ev.reward.command is not None
            scored = await room.exec(
                ExecRequest(shell=ev.reward.command, cwd=ws, env={**ev.env, **GRADE_ENV}, timeout=STEP_TIMEOUT)
            )
            try:
                result.reward = parse_command_reward(scored.stdout) if scored.ok else None
            except ValueError as e:
                result.reward = None
                problems.append(str(e))
            if result.reward is None:
                result.status = GradeStatus.INVALID_TASK
                problems.append(f"the reward command failed (exit {scored.exit_code}, timed out: {scored.timed_out})")
        elif ev.reward.policy == "file" and stale:
            result.reward = 0.0
            problems.append(f"the reward file {stale[0]} was there before the tests and could not be removed: reward 0")
        elif ev.reward.policy == "file":
            result.reward, why = await self._reward_file(room, reward_files, owned)
            if why:
                problems.append(why)
        else:
            result.reward = compute_reward(ev.reward, tests)
            if result.reward and not ev.graded_ids and not report.complete:
                # Every test of the report counts: a run cut short (a process killed in the middle,
                # a runner stopped) reports only the tests before the cut, all of which may pass.
                problems.append("the test run did not finish and the task lists no test: what it never reached counts, reward 0")
                result.reward = 0.0
        result.tampering = detected
        if detected and (ev.tampering_policy or self.tampering_policy) == "strict" and result.reward is not None:
            result.reward = 0.0
            problems.insert(0, f"tampering detected ({len(detected)} finding(s)): reward 0 under the strict policy")
        result.message = "; ".join(problems)
        return result

    async def _unreadable_node(self, room: Sandbox, command: str) -> str:
        """``command`` with the room's node first on its PATH as a copy its user cannot read, in a
        folder of root's: the kernel makes a process undumpable at exec of a file it cannot read,
        so no process of the run (same user, no CAP_SYS_PTRACE) reads another's memory, and the
        node guard's keys stay where they are. (Root rooms: the guard does it by changing ids.)"""
        folder = f"/tmp/.rlsandbox-node-{secrets.token_hex(8)}"
        # node finds its global modules (Debian's /usr/share/nodejs) from its own prefix: the copy
        # is bin/node under a prefix whose other entries are links to the real prefix's.
        script = (
            'real=$(readlink -f "$(command -v node)") && prefix=$(dirname "$(dirname "$real")") && '
            'mkdir -m 711 "$1" "$1/bin" && cp "$real" "$1/bin/node" && chmod 111 "$1/bin/node" && '
            'for e in "$prefix"/*; do [ "${e##*/}" = bin ] || ln -s "$e" "$1/${e##*/}"; done'
        )
        req = ExecRequest(
            argv=("sh", "-c", script, "sh", folder), env={"PATH": TAR_ENV["PATH"]}, timeout=STEP_TIMEOUT, as_root=True
        )
        if not (await room.exec(req)).ok:
            return command  # no node in the image: the guard is not in the run, which says so
        return f'PATH={folder}/bin:"$PATH"; export PATH; {command}'

    async def _reward_file(self, room: Sandbox, paths: list[str], owned: bool) -> tuple[float, str]:
        """The reward in the first of ``paths`` that exists, read by the room's agent or the engine
        (never by a command in the room: the tests' code, root in a fresh room, may have replaced
        any program there, or put a module where an interpreter started in the workspace finds
        it first). Every process the tests started has ended (``end_leftovers``): the file is as
        the test command left it. A symlink, FIFO or folder there scores 0.0 (no file followed)."""
        for path in paths:
            kind = await self._kind(room, path, owned)
            if kind is None:
                continue
            if kind != "file":
                return 0.0, f"the reward file {path} is a {kind}, not a file: reward 0"
            data = await self._read(room, path, owned, REWARD_FILE_CAP + 1)
            value, why = parse_reward_file(data, path.endswith(".json"))
            return value, f"the reward file {path}: {why}: reward 0" if why else ""
        return 0.0, f"the test command wrote no reward file ({', '.join(paths)}): reward 0"

    async def _kind(self, room: Sandbox, path: str, owned: bool) -> str | None:
        """What is at ``path`` (dir, symlink, other, file; None: nothing), as the engine sees it
        (not anything in the room); with ``owned``, as the agent does (out of the room's commands'
        reach; the engine's archive API does not see tmpfs mounts such as /tmp)."""
        if owned:
            [st] = await room.stat([path])
            return st.type if st.exists else None
        found = await self.runtime.stat_path(room.container_id, path)
        return None if found is None else path_kind(int(found.get("mode", 0)))

    async def _test_files(self, room: Sandbox, paths: list[str], cap: int) -> dict[str, tuple[bytes, int] | None]:
        """What the room's agent reads of each file (content up to ``cap`` bytes, and size); None
        for one it cannot read."""
        if not paths:
            return {}
        got = await room.read_files(paths, cap)
        return {path: (g.data, g.size) if g.error is None else None for path, g in zip(paths, got, strict=True)}

    async def _exists(self, room: Sandbox, path: str, owned: bool) -> bool:
        """Whether ``path`` exists in the room, asked of the engine (not of anything in the room).
        With ``owned`` (the room's commands run as another user, the agent is out of their reach)
        the agent answers: the engine's archive API does not see tmpfs mounts such as /tmp."""
        try:
            return await self._kind(room, path, owned) is not None
        except SandboxError:
            return False

    async def _read(self, room: Sandbox, path: str, owned: bool, cap: int = MAX_REPORT_BYTES) -> bytes:
        try:
            if owned:
                [got] = await room.read_files([path], cap)
                return got.data if got.error is None else b""
            data, _ = await self.runtime.get_file(room.container_id, path, cap)
            return data
        except (SandboxError, IsADirectoryError):
            return b""


def _runner(report_format: str) -> str | None:
    """The guard a report format's runner gets: pytest, unittest, node, or none."""
    if report_format in PYTEST_FORMATS:
        return "pytest"
    if report_format in UNITTEST_FORMATS:
        return "unittest"
    return "node" if report_format in NODE_FORMATS else None


def _disagreements(output: TestReport, guard: TestReport) -> list[str]:
    """Where the output (or report file) and the runner, as the guard saw it, disagree either way:
    a pass the runner never produced (the report rewritten), or a failure the runner printed that
    the records call a pass (records forged by code that learned the key)."""
    found = lookup(guard, list(output.tests))
    out = []
    for test_id, case in output.tests.items():
        seen = found.get(test_id)
        if case.outcome is Outcome.PASSED and (seen is None or seen.outcome is not Outcome.PASSED):
            out.append(f"the report says {test_id} passed; the runner says {seen.outcome if seen else 'it never ran'}")
        elif case.outcome in (Outcome.FAILED, Outcome.ERROR) and seen is not None and seen.outcome is Outcome.PASSED:
            out.append(f"the runner printed that {test_id} {case.outcome}; signed records contradict it: forged")
        if len(out) >= 20:
            break
    return out


def _host_oom_during_run(pool: WarmPool, sandbox: Sandbox, since: float, what: str) -> None:
    """A test process killed because the host ran out of memory (pool/oom.py): the run says
    nothing of the agent's work, an infra error (masked) whatever it reported."""
    if pool.host_oom_killed(sandbox, since):
        raise SandboxDied(f"the host ran out of memory during the test run: the kernel's OOM killer killed a process of {what}")
