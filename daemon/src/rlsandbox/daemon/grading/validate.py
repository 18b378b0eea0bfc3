"""Task validation: is a task trustworthy enough to train on?

Each task is run N times with the empty patch and N times with its gold patch, concurrently,
through a daemon (the same API and clean room that training uses):

- every FAIL_TO_PASS test must fail with the empty patch and pass with the gold patch;
- every PASS_TO_PASS test must pass with both;
- a test whose outcome differs between runs of the same patch is flaky: the task is flagged, or,
  with ``exclude_flaky``, those tests are dropped from its lists (if FAIL_TO_PASS keeps a test);
- infrastructure errors are counted apart and say nothing about the task.

The cleaned task set is written as a folder of self-contained tasks (``<id>/task.json`` and
``<id>/workspace.tar``) that ``load_tasks`` reads back.
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from rlsandbox.client import AsyncClient, GradeResult, SandboxRPCError
from rlsandbox.daemon.grading.task import Task

VERDICTS = (
    "valid",
    "flaky",
    "gold_fails",
    "empty_passes",
    "pass_to_pass_fails",
    "no_gold_patch",
    "tests_unprotected",
    "invalid_task",
    "infra_error",
)


@dataclass
class RunOutcome:
    patch: str  # "empty" or "gold"
    status: str
    outcomes: dict[str, str] = field(default_factory=dict)
    message: str = ""
    duration: float = 0.0


@dataclass
class TaskVerdict:
    task_id: str
    verdict: str
    problems: list[str] = field(default_factory=list)
    flaky_tests: list[str] = field(default_factory=list)
    runs: int = 0
    infra_errors: int = 0
    grade_seconds_mean: float = 0.0
    kept_fail_to_pass: list[str] = field(default_factory=list)
    kept_pass_to_pass: list[str] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return self.verdict == "valid"


@dataclass
class ValidationReport:
    tasks: list[TaskVerdict]
    runs: int
    duration: float

    def counts(self) -> dict[str, int]:
        c = collections.Counter(v.verdict for v in self.tasks)
        return {k: c.get(k, 0) for k in VERDICTS}

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "duration_s": round(self.duration, 3),
            "tasks_per_minute": round(len(self.tasks) / self.duration * 60, 2) if self.duration else None,
            "counts": self.counts(),
            "tasks": [asdict(v) for v in self.tasks],
        }


async def _one_run(client: AsyncClient, task: Task, patch: str, acquire_timeout: float) -> RunOutcome:
    started = time.monotonic()
    try:
        async with client.session(task=task, acquire_timeout=acquire_timeout, labels={"rlsandbox.validation": task.id}) as s:
            if patch == "gold":
                assert task.spec.gold_patch is not None
                applied = await s.exec(["git", "apply", "--whitespace=nowarn", "-"], stdin=task.spec.gold_patch.encode())
                if applied.exit_code != 0:
                    applied = await s.exec(["patch", "-p1", "--forward", "--batch"], stdin=task.spec.gold_patch.encode())
                if applied.exit_code != 0:
                    err = (applied.stderr or applied.stdout).decode(errors="replace").strip()
                    return RunOutcome(patch, "invalid_task", message=f"the gold patch does not apply: {err[-500:]}")
            result: GradeResult = await s.grade()
    except SandboxRPCError as e:
        status = "invalid_task" if "task setup" in str(e) or e.code == "INVALID_ARGUMENT" else "infra_error"
        return RunOutcome(patch, status, message=str(e), duration=time.monotonic() - started)
    return RunOutcome(
        patch,
        result.status,
        {t.id: t.outcome for t in result.tests if t.group != "other"},
        result.message,
        result.duration,
    )


def judge(task: Task, runs: list[RunOutcome], *, exclude_flaky: bool) -> TaskVerdict:
    """The verdict on one task from its runs (pure)."""
    ev = task.spec.evaluation
    v = TaskVerdict(task.id, "valid", runs=len(runs))
    good = [r for r in runs if r.status in ("ok", "timeout")]
    v.infra_errors = sum(r.status == "infra_error" for r in runs)
    if good:
        v.grade_seconds_mean = round(sum(r.duration for r in good) / len(good), 3)
    invalid = [r for r in runs if r.status == "invalid_task"]
    if invalid:
        v.verdict = "invalid_task"
        v.problems.append(invalid[0].message)
        return v
    if not good:
        v.verdict = "infra_error"
        v.problems.append(next((r.message for r in runs if r.message), "every run failed"))
        return v
    by_patch: dict[str, list[RunOutcome]] = {p: [r for r in good if r.patch == p] for p in ("empty", "gold")}
    flaky = sorted(
        {
            t
            for runs_of_patch in by_patch.values()
            for t in ev.graded_ids
            if len({(r.outcomes.get(t) == "passed") for r in runs_of_patch}) > 1
        }
    )
    v.flaky_tests = flaky
    f2p = [t for t in ev.fail_to_pass if not (exclude_flaky and t in flaky)]
    p2p = [t for t in ev.pass_to_pass if not (exclude_flaky and t in flaky)]
    v.kept_fail_to_pass, v.kept_pass_to_pass = f2p, p2p
    stable = set(flaky) if not exclude_flaky else set()

    def passes(patch: str, test: str) -> bool:
        return all(r.outcomes.get(test) == "passed" for r in by_patch[patch])

    def fails(patch: str, test: str) -> bool:
        return all(r.outcomes.get(test) != "passed" for r in by_patch[patch])

    empty_passing = [t for t in f2p if t not in stable and by_patch["empty"] and not fails("empty", t)]
    p2p_failing_empty = [t for t in p2p if t not in stable and by_patch["empty"] and not passes("empty", t)]
    if task.spec.gold_patch:
        gold_failing = [t for t in [*f2p, *p2p] if t not in stable and by_patch["gold"] and not passes("gold", t)]
    else:
        gold_failing = []
    if empty_passing:
        v.problems.append(f"FAIL_TO_PASS tests pass without any change: {', '.join(empty_passing[:5])}")
    if p2p_failing_empty:
        v.problems.append(f"PASS_TO_PASS tests fail without any change: {', '.join(p2p_failing_empty[:5])}")
    if gold_failing:
        v.problems.append(f"tests that do not pass with the gold patch: {', '.join(gold_failing[:5])}")
    if flaky and not exclude_flaky:
        v.problems.append(f"flaky tests: {', '.join(flaky[:5])}")
    if exclude_flaky and not f2p:
        v.problems.append("every FAIL_TO_PASS test is flaky")
    if gold_failing:
        v.verdict = "gold_fails"
    elif empty_passing:
        v.verdict = "empty_passes"
    elif p2p_failing_empty:
        v.verdict = "pass_to_pass_fails"
    elif flaky and (not exclude_flaky or not f2p):
        v.verdict = "flaky"
    elif not task.spec.gold_patch:
        v.verdict = "no_gold_patch"
        v.problems.append("no gold patch: only the empty patch was checked")
    if tests_unprotected(task):
        v.problems.append(
            "the tests are the workspace's own and the task names none of them (no test_files, test_patch or hidden "
            "tests): a policy can change the tests it is graded by; list them in evaluation.test_files"
        )
        if v.verdict == "valid":
            v.verdict = "tests_unprotected"
    return v


def tests_unprotected(task: Task) -> bool:
    """Whether the tests that grade a task come only from the agent's own workspace, unprotected:
    nothing restores them before the run (a task whose reward is a command of its own is left
    to that command)."""
    ev = task.spec.evaluation
    return ev.reward.policy != "command" and not (ev.test_files or ev.test_patch or ev.hidden_tests or ev.hidden_tests_dir)


class Progress:
    """One status line on a terminal (rewritten in place), periodic lines otherwise."""

    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self.total = total
        self.done = 0
        self.by_status: collections.Counter[str] = collections.Counter()
        self.stream = stream
        self.tty = stream.isatty()
        self.started = time.monotonic()
        self._last = 0.0

    def update(self, status: str) -> None:
        self.done += 1
        self.by_status[status] += 1
        now = time.monotonic()
        if not self.tty and now - self._last < 5 and self.done < self.total:
            return
        self._last = now
        width = 30
        filled = int(width * self.done / self.total) if self.total else width
        rate = self.done / max(now - self.started, 1e-9) * 60
        statuses = " ".join(f"{k} {n}" for k, n in sorted(self.by_status.items()))
        line = f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} runs, {rate:.0f}/min  {statuses}"
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        if self.tty and self.done == self.total:
            self.stream.write("\n")
        self.stream.flush()


async def validate(
    client: AsyncClient,
    tasks: list[Task],
    *,
    runs: int = 1,
    concurrency: int = 8,
    exclude_flaky: bool = False,
    acquire_timeout: float = 120.0,
    progress: Callable[[str], None] | None = None,
) -> ValidationReport:
    """Validate ``tasks`` through ``client``'s daemon; see the module docstring."""
    started = time.monotonic()
    limit = asyncio.Semaphore(concurrency)
    jobs = [(t, p) for t in tasks for p in (("empty", "gold") if t.spec.gold_patch else ("empty",)) for _ in range(runs)]

    async def job(task: Task, patch: str) -> tuple[str, RunOutcome]:
        async with limit:
            outcome = await _one_run(client, task, patch, acquire_timeout)
        if progress:
            progress(outcome.status)
        return task.id, outcome

    results = await asyncio.gather(*(job(t, p) for t, p in jobs))
    per_task: dict[str, list[RunOutcome]] = collections.defaultdict(list)
    for task_id, outcome in results:
        per_task[task_id].append(outcome)
    verdicts = [judge(t, per_task[t.id], exclude_flaky=exclude_flaky) for t in tasks]
    return ValidationReport(verdicts, runs, time.monotonic() - started)


def summary_table(report: ValidationReport) -> str:
    rows = [("task", "verdict", "runs", "infra", "grade s", "flaky", "problem")]
    for v in report.tasks:
        rows.append(
            (
                v.task_id,
                v.verdict,
                str(v.runs),
                str(v.infra_errors),
                f"{v.grade_seconds_mean:.2f}",
                str(len(v.flaky_tests)),
                (v.problems[0] if v.problems else "")[:70],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    counts = ", ".join(f"{k} {n}" for k, n in report.counts().items() if n)
    rate = len(report.tasks) / report.duration * 60 if report.duration else 0.0
    lines.append(f"\n{len(report.tasks)} tasks in {report.duration:.1f} s ({rate:.1f} tasks/min): {counts}")
    return "\n".join(lines)


def write_cleaned(tasks: list[Task], report: ValidationReport, out: Path) -> int:
    """Write the usable tasks (flaky tests dropped when excluded) as a loadable folder."""
    verdicts = {v.task_id: v for v in report.tasks}
    kept = []
    for task in tasks:
        v = verdicts[task.id]
        if v.usable:
            lists = {"fail_to_pass": v.kept_fail_to_pass, "pass_to_pass": v.kept_pass_to_pass}
            ev = task.spec.evaluation.model_copy(update=lists)
            kept.append(Task(task.spec.model_copy(update={"evaluation": ev}), task.workspace_tar))
    return write_tasks(kept, out)


def write_tasks(tasks: list[Task], out: Path) -> int:
    """Write ``tasks`` as a loadable folder (``<id>/task.json`` and ``<id>/workspace.tar``)."""
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    for task in tasks:
        ws = task.spec.workspace
        folder = out / task.id.replace("/", "__")
        folder.mkdir(parents=True, exist_ok=True)
        if ws.source == "bundle":
            (folder / "workspace.tar").write_bytes(task.workspace_tar)
            ws = ws.model_copy(update={"tar": "workspace.tar"})
        spec = task.spec.model_copy(update={"workspace": ws})
        (folder / "task.json").write_text(
            json.dumps(spec.model_dump(mode="json", exclude_none=True), indent=2, ensure_ascii=False) + "\n"
        )
        written += 1
    return written
