"""Task mining from a repository's history: commits that change both code and tests become
tasks, with the tests that tell the fix apart measured, not guessed.

For each commit of a local clone (first parent, newest first) whose diff against its parent
touches test files and other files: the task's workspace is the parent's tree (``git archive``),
its gold patch the commit's change to the code, its test patch the change to the tests, its
problem statement the commit message. Its tests run through a daemon, in clean rooms as training
grades them, ``runs`` times each: at the parent with the test patch (before) and with the gold
patch too (after). FAIL_TO_PASS are the tests that pass after and do not pass before, in every
run; PASS_TO_PASS those that pass in every run of both; a test whose outcome varies between runs
of one side is flaky and left out, and so is one that does not pass in a last run of the fix a
second later (an id that names the time changes between runs). A commit without a FAIL_TO_PASS
test is no task.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlsandbox.client import AsyncClient, SandboxRPCError
from rlsandbox.daemon.grading.importers import SWEBENCH_TEST_COMMAND, TEST_FILE_GLOBS, folder_globs_of_tests
from rlsandbox.daemon.grading.task import DEFAULT_PROTECTED, EvaluationSpec, Task, TaskSpec, WorkspaceSpec, matches

CONFIRM_AFTER = 1.1  # seconds between the runs and the fix's confirming run


class MiningError(ValueError):
    """The repository or a commit cannot be read."""


# A clone's configuration may name diff drivers (textconv, an external diff): none runs, and the
# patches are the commits' own bytes.
_DIFF = ("diff", "--no-ext-diff", "--no-textconv", "--no-color", "--no-renames")


def _git(repo: Path, *args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True)
    if done.returncode != 0:
        raise MiningError(f"git {' '.join(args[:3])} in {repo}: {done.stderr.decode(errors='replace').strip()[-300:]}")
    return done.stdout


@dataclass(frozen=True, slots=True)
class Candidate:
    """A commit that changes code and tests, before its tests ran."""

    commit: str
    parent: str
    message: str
    code_files: tuple[str, ...]
    test_files: tuple[str, ...]


def is_test_file(path: str) -> bool:
    return matches(path, TEST_FILE_GLOBS)


def candidates(repo: Path, revisions: str = "HEAD", max_count: int = 100) -> list[Candidate]:
    """The commits of ``revisions`` (first parent, newest first) that change test files and other
    files, in text (a binary change cannot be a patch here)."""
    out = _git(repo, "rev-list", "--first-parent", f"--max-count={max_count}", "--parents", revisions).decode()
    found: list[Candidate] = []
    for line in out.splitlines():
        commit, *parents = line.split()
        if len(parents) != 1:
            continue  # the root commit, or a merge: no single parent to start from
        numstat = _git(repo, *_DIFF, "--numstat", parents[0], commit).decode("utf-8", "surrogateescape")
        files = [ln.split("\t", 2) for ln in numstat.splitlines() if ln.count("\t") >= 2]
        if any(added == "-" for added, _, _ in files):
            continue  # a binary file changed
        paths = [p for _, _, p in files]
        # The code is what the task's protected files are not: packaging metadata (an sdist's
        # *.egg-info), runner configuration and lock files change with a release, not with a fix.
        tests = [p for p in paths if is_test_file(p)]
        code = [p for p in paths if not is_test_file(p) and not matches(p, DEFAULT_PROTECTED)]
        if tests and code:
            message = _git(repo, "log", "-1", "--format=%B", commit).decode("utf-8", "replace").strip()
            found.append(Candidate(commit, parents[0], message, tuple(code), tuple(tests)))
    return found


def _task(
    repo: Path, c: Candidate, *, pool: str, image: str, workspace_path: str, test_command: str, env: dict[str, str]
) -> Task:
    tar = _git(repo, "archive", "--format=tar", c.parent)
    gold = _git(repo, *_DIFF, "--full-index", c.parent, c.commit, "--", *c.code_files)
    test_patch = _git(repo, *_DIFF, "--full-index", c.parent, c.commit, "--", *c.test_files)
    present = [p for p in c.test_files if _exists(repo, c.commit, p)]
    runnable = [p for p in present if p.endswith(".py")] or present
    command = test_command.replace("{test_files}", " ".join(runnable))
    short = re.sub(r"[^A-Za-z0-9_.-]", "_", repo.resolve().name)
    spec = TaskSpec(
        id=f"{short}-{c.commit[:12]}",
        pool=pool,
        image=image,
        problem_statement=c.message,
        env=env,
        workspace=WorkspaceSpec(path=workspace_path, source="bundle", git="reset"),
        evaluation=EvaluationSpec(
            test_command=command,
            env=env,
            test_patch=test_patch.decode("utf-8", "surrogateescape"),
            test_files=[*c.test_files, *folder_globs_of_tests(list(c.test_files))],
        ),
        gold_patch=gold.decode("utf-8", "surrogateescape"),
        metadata={"repo": str(repo.resolve()), "base_commit": c.parent, "commit": c.commit, "mined": True},
    )
    return Task(spec, tar)


def _exists(repo: Path, commit: str, path: str) -> bool:
    return subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{commit}:{path}"], capture_output=True).returncode == 0


def history_from_archives(archives: list[Path], repo: Path) -> list[str]:
    """A git history whose commits are the trees of ``archives`` (source archives of successive
    releases, ``.tar.gz`` with one top folder each, as PyPI's sdists are), one commit per archive
    with the message ``<top folder>``; returns the commit ids. Real code, real tests, real changes,
    where a project's own repository cannot be had."""
    import shutil
    import tarfile
    import tempfile

    repo.mkdir(parents=True, exist_ok=False)
    _git(repo, "init", "-q")
    commits = []
    for archive in archives:
        with tempfile.TemporaryDirectory() as tmp, tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
            [top] = list(Path(tmp).iterdir())
            for old in repo.iterdir():
                if old.name == ".git":
                    continue
                if old.is_dir() and not old.is_symlink():
                    shutil.rmtree(old)
                else:
                    old.unlink()
            for item in top.iterdir():
                shutil.move(str(item), repo / item.name)
            _git(repo, "add", "-A")
            _git(repo, "-c", "user.name=rlsandbox", "-c", "user.email=rlsandbox@localhost", "commit", "-qm", top.name)
        commits.append(_git(repo, "rev-parse", "HEAD").decode().strip())
    return commits


@dataclass
class Mined:
    commit: str
    task: Task | None
    reason: str = ""  # why no task, or what was left out
    flaky: list[str] = field(default_factory=list)


async def _outcomes(client: AsyncClient, task: Task, gold: bool, limit: asyncio.Semaphore) -> dict[str, str] | str:
    """Every test of the report and its outcome, for the workspace with the gold patch or not;
    a message when the run says nothing (an infra error, a patch that does not apply)."""
    async with limit:
        try:
            async with client.session(task=task, labels={"rlsandbox.mining": task.id}) as s:
                if gold:
                    assert task.spec.gold_patch is not None
                    applied = await s.exec(["git", "apply", "--whitespace=nowarn", "-"], stdin=task.spec.gold_patch.encode())
                    if applied.exit_code != 0:
                        return (
                            f"the commit's change does not apply to its parent: {applied.stderr.decode(errors='replace')[-300:]}"
                        )
                result = await s.grade()
        except SandboxRPCError as e:
            return str(e)
    if result.status not in ("ok", "timeout"):
        return f"{result.status}: {result.message[:300]}"
    return {t.id: t.outcome for t in result.tests}


def tests_of(before: list[dict[str, str]], after: list[dict[str, str]]) -> tuple[list[str], list[str], list[str]]:
    """(FAIL_TO_PASS, PASS_TO_PASS, flaky) from the runs before and after the fix (pure)."""
    flaky = sorted({t for runs in (before, after) for run in runs for t in run if len({r.get(t, "missing") for r in runs}) > 1})
    ids = sorted({t for run in (*before, *after) for t in run} - set(flaky))

    def passes(runs: list[dict[str, str]], t: str) -> bool:
        return all(run.get(t) == "passed" for run in runs)

    f2p = [t for t in ids if passes(after, t) and not any(run.get(t) == "passed" for run in before)]
    p2p = [t for t in ids if passes(after, t) and passes(before, t)]
    return f2p, p2p, flaky


async def mine(
    client: AsyncClient,
    repo: Path,
    *,
    pool: str = "",
    image: str = "",
    revisions: str = "HEAD",
    max_count: int = 100,
    runs: int = 2,
    concurrency: int = 4,
    workspace_path: str = "/workspace",
    test_command: str = SWEBENCH_TEST_COMMAND,
    env: dict[str, str] | None = None,
    progress: Callable[[Mined], None] | None = None,
) -> list[Mined]:
    """Mine the commits of ``revisions`` of the local clone ``repo`` into tasks of ``pool`` (or
    ``image``: a pool made on demand)."""
    if runs < 1:
        raise MiningError("runs must be at least 1")
    limit = asyncio.Semaphore(concurrency)

    async def one(c: Candidate) -> Mined:
        try:
            task = await asyncio.to_thread(  # git runs: off the event loop
                _task,
                repo,
                c,
                pool=pool,
                image=image,
                workspace_path=workspace_path,
                test_command=test_command,
                env=dict(env or {}),
            )
        except MiningError as e:
            return Mined(c.commit, None, str(e))
        sides = await asyncio.gather(*(_outcomes(client, task, gold, limit) for gold in (False, True) for _ in range(runs)))
        errors = [s for s in sides if isinstance(s, str)]
        if errors:
            return Mined(c.commit, None, errors[0])
        runs_of = [s for s in sides if isinstance(s, dict)]
        f2p, p2p, flaky = tests_of(runs_of[:runs], runs_of[runs:])
        if f2p:
            # One more run of the fix, later: a test whose id changes from run to run (one that
            # names the time, say) looks steady within one second and is missing from then on.
            await asyncio.sleep(CONFIRM_AFTER)
            confirm = await _outcomes(client, task, True, limit)
            if isinstance(confirm, str):
                return Mined(c.commit, None, confirm, flaky)
            unsteady = [t for t in (*f2p, *p2p) if confirm.get(t) != "passed"]
            flaky = sorted({*flaky, *unsteady})
            f2p, p2p = [t for t in f2p if t not in unsteady], [t for t in p2p if t not in unsteady]
        if not f2p:
            return Mined(c.commit, None, "no test fails before the change and passes after it", flaky)
        ev = task.spec.evaluation.model_copy(update={"fail_to_pass": f2p, "pass_to_pass": p2p})
        return Mined(c.commit, Task(task.spec.model_copy(update={"evaluation": ev}), task.workspace_tar), "", flaky)

    async def reported(c: Candidate) -> Mined:
        found = await one(c)
        if progress:
            progress(found)
        return found

    found = await asyncio.to_thread(candidates, repo, revisions, max_count)
    return list(await asyncio.gather(*(reported(c) for c in found)))


__all__ = ["Candidate", "Mined", "MiningError", "candidates", "history_from_archives", "is_test_file", "mine", "tests_of"]
