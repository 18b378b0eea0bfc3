"""Task auditing: do a task's tests tell its fix from cheap wrong ones?

Validation (validate.py) asks whether the gold patch passes and the empty patch fails. A task can
pass that and still pay for a wrong answer: a test that checks only part of the fix, or checks
that nothing raises. Auditing grades cheap wrong patches, each in a session and clean room of its
own through a daemon, as training would:

- the gold patch with one of its hunks left out, for each hunk of a source file (of a patch with
  two or more: a changelog's or a docs page's hunk left out is no wrong fix);
- the gold patch with the body of one function it changes replaced by ``raise
  NotImplementedError``, and by ``return None`` (Python files; functions whose body has a line of
  its own);

and flags the task when its tests accept one (``weak``: the reward of the gold patch for a patch
that is not the fix), or the empty patch (``no_signal``: its tests pass before the fix). A task
whose gold patch does not score its full reward is ``gold_fails``; what the daemon could not grade
is ``infra_error`` and says nothing. The wrong patches are built on the host from the files the
gold patch touches, read from a session of the task (pure functions: :func:`wrong_patches`).
"""

from __future__ import annotations

import ast
import asyncio
import collections
import dataclasses
import difflib
import posixpath
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rlsandbox.client import AsyncClient, AsyncSession, SandboxRPCError
from rlsandbox.daemon.grading.patches import PatchError, apply_file_patches, parse_patch
from rlsandbox.daemon.grading.task import Task

AUDIT_VERDICTS = ("strong", "weak", "no_signal", "gold_fails", "invalid_task", "infra_error")
STUBS = (("raises NotImplementedError", "raise NotImplementedError"), ("returns None", "return None"))


@dataclass(frozen=True, slots=True)
class WrongPatch:
    """A patch that is not the fix: the files it leaves (``None``: deleted), and what it is."""

    name: str
    files: Mapping[str, bytes | None]


def changed_lines(before: bytes, after: bytes) -> set[int]:
    """The 1-based lines of ``after`` that differ from ``before`` (added or replaced); for a
    deletion, the line after it."""
    a, b = before.decode("utf-8", "replace").splitlines(), after.decode("utf-8", "replace").splitlines()
    lines: set[int] = set()
    for tag, _, _, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            lines.update(range(j1 + 1, j2 + 1))
        elif tag == "delete":
            lines.add(j1 + 1)
    return lines


def changed_functions(before: bytes, after: bytes) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The innermost functions of ``after`` (Python source) holding a changed line, whose body
    starts on a line of its own; [] when it does not parse."""
    try:
        tree = ast.parse(after)
    except (SyntaxError, ValueError):
        return []
    lines = changed_lines(before, after)
    found: dict[int, ast.FunctionDef | ast.AsyncFunctionDef] = {}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.end_lineno is None:
            continue
        if node.body[0].lineno == node.lineno:
            continue  # def f(): return x
        for line in lines:
            if node.lineno <= line <= node.end_lineno:
                inner = found.get(line)
                if inner is None or inner.lineno < node.lineno:  # the innermost holds the line
                    found[line] = node
    return sorted({id(f): f for f in found.values()}.values(), key=lambda f: f.lineno)


def stubbed(source: bytes, fn: ast.FunctionDef | ast.AsyncFunctionDef, statement: str) -> bytes:
    """``source`` with ``fn``'s body (its docstring kept) replaced by ``statement``."""
    body = fn.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:] or body  # keep the docstring; a function that is only a docstring loses it
    lines = source.decode("utf-8", "surrogateescape").splitlines(keepends=True)
    first, last = body[0].lineno, fn.end_lineno or body[-1].lineno
    indent = lines[first - 1][: len(lines[first - 1]) - len(lines[first - 1].lstrip())]
    out = [*lines[: first - 1], f"{indent}{statement}\n", *lines[last:]]
    return "".join(out).encode("utf-8", "surrogateescape")


# What a test can check: source files. A hunk of a changelog, a docs page or packaging metadata
# left out is not a wrong fix (a release's diff has many).
CODE_SUFFIXES = frozenset(
    {".py", ".pyx", ".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx", ".go", ".rs", ".java", ".kt", ".scala", ".c", ".h",
     ".cc", ".cpp", ".hpp", ".cs", ".rb", ".php", ".swift"}
)  # fmt: skip


def is_code(path: str) -> bool:
    name = posixpath.basename(path)
    return posixpath.splitext(name)[1] in CODE_SUFFIXES and not path.startswith(("docs/", "doc/")) and name != "setup.py"


def _files(applied: Mapping[str, tuple[bytes | None, int | None]]) -> dict[str, bytes | None]:
    return {path: data for path, (data, _) in applied.items()}


def wrong_patches(gold: bytes, base: Mapping[str, bytes | None]) -> list[WrongPatch]:
    """The cheap wrong patches of a task: from its gold patch and the files it touches as the
    workspace has them (``None``: absent). Raises PatchError when the gold patch does not apply."""
    file_patches = parse_patch(gold)
    golden = _files(apply_file_patches(file_patches, base))
    out: list[WrongPatch] = []
    hunks = [(i, j) for i, fp in enumerate(file_patches) if is_code(fp.path) for j in range(len(fp.hunks))]
    if len(hunks) >= 2:
        for i, j in hunks:
            fp = file_patches[i]
            fewer = [
                dataclasses.replace(p, hunks=[h for k, h in enumerate(p.hunks) if k != j]) if n == i else p
                for n, p in enumerate(file_patches)
            ]
            try:
                files = _files(apply_file_patches(fewer, base))
            except PatchError:
                continue  # a later hunk needs this one's lines
            out.append(WrongPatch(f"the gold patch without its hunk {j + 1} of {fp.path} (line {fp.hunks[j][0]})", files))
    for path, after in golden.items():
        if after is None or not path.endswith(".py"):
            continue
        for fn in changed_functions(base.get(path) or b"", after):
            for what, statement in STUBS:
                files = {**golden, path: stubbed(after, fn, statement)}
                out.append(WrongPatch(f"the gold patch with {path}:{fn.name}() that {what}", files))
    return out


@dataclass
class AuditVerdict:
    task_id: str
    verdict: str
    gold_reward: float | None = None
    accepted: list[str] = field(default_factory=list)  # the wrong patches its tests paid for
    tried: int = 0
    problems: list[str] = field(default_factory=list)


@dataclass
class AuditReport:
    tasks: list[AuditVerdict]
    duration: float

    def counts(self) -> dict[str, int]:
        c = collections.Counter(v.verdict for v in self.tasks)
        return {k: c.get(k, 0) for k in AUDIT_VERDICTS}

    def to_json(self) -> dict[str, Any]:
        return {
            "duration_s": round(self.duration, 3),
            "counts": self.counts(),
            "wrong_patches_graded": sum(v.tried for v in self.tasks),
            "tasks": [dataclasses.asdict(v) for v in self.tasks],
        }


async def _write(s: AsyncSession, files: Mapping[str, bytes | None]) -> None:
    written = {p: d for p, d in files.items() if d is not None}
    if written:
        await s.write_files(written)
    gone = [p for p, d in files.items() if d is None]
    if gone:
        await s.exec(["rm", "-f", "--", *gone])


async def _grade(
    client: AsyncClient, task: Task, files: Mapping[str, bytes | None], limit: asyncio.Semaphore, acquire_timeout: float
) -> tuple[str, float | None, str]:
    """(status, reward, message) of a session of ``task`` whose workspace got ``files``."""
    async with limit:
        try:
            async with client.session(task=task, acquire_timeout=acquire_timeout, labels={"rlsandbox.audit": task.id}) as s:
                await _write(s, files)
                result = await s.grade()
        except SandboxRPCError as e:
            return "infra_error", None, str(e)
    return result.status, result.reward, result.message


READ_CHUNK = 6  # files per read (each may be up to the node's per-file cap: a response has a limit)


async def _base_files(client: AsyncClient, task: Task, paths: list[str], acquire_timeout: float) -> dict[str, bytes | None]:
    async with client.session(task=task, acquire_timeout=acquire_timeout, labels={"rlsandbox.audit": task.id}) as s:
        found = {}
        for i in range(0, len(paths), READ_CHUNK):
            found.update(await s.read_files(paths[i : i + READ_CHUNK]))
    big = [p for p in paths if p in found and found[p].truncated]
    if big:
        raise PatchError(f"{big[0]}: larger than a read returns, not audited")
    return {p: (found[p].data if p in found and found[p].error is None else None) for p in paths}


async def audit_task(
    client: AsyncClient, task: Task, limit: asyncio.Semaphore, *, max_patches: int = 24, acquire_timeout: float = 120.0
) -> AuditVerdict:
    """Grade ``task``'s gold patch, the empty patch and its wrong patches; the verdict (pure
    after the grades: a wrong patch is accepted when it earns the gold patch's reward)."""
    v = AuditVerdict(task.id, "strong")
    if not task.spec.gold_patch:
        return AuditVerdict(task.id, "invalid_task", problems=["no gold patch: nothing to tell wrong patches from"])
    gold = task.spec.gold_patch.encode()
    try:
        paths = list(dict.fromkeys(fp.old_path or fp.new_path or "" for fp in parse_patch(gold)))
        async with limit:
            base = await _base_files(client, task, paths, acquire_timeout)
        golden = _files(apply_file_patches(parse_patch(gold), base))
        wrong = wrong_patches(gold, base)[:max_patches]
    except PatchError as e:
        return AuditVerdict(task.id, "invalid_task", problems=[f"the gold patch does not apply: {e}"])
    except SandboxRPCError as e:
        return AuditVerdict(task.id, "infra_error", problems=[str(e)])
    grades = await asyncio.gather(
        _grade(client, task, golden, limit, acquire_timeout),
        _grade(client, task, {}, limit, acquire_timeout),
        *(_grade(client, task, w.files, limit, acquire_timeout) for w in wrong),
    )
    (gold_status, gold_reward, gold_message), (empty_status, empty_reward, _), rest = grades[0], grades[1], grades[2:]
    v.gold_reward, v.tried = gold_reward, len(wrong)
    infra = [m for status, _, m in grades if status == "infra_error"]
    if gold_status == "infra_error" or empty_status == "infra_error":
        return dataclasses.replace(v, verdict="infra_error", problems=infra[:3])
    if gold_status != "ok" or not gold_reward:
        return dataclasses.replace(v, verdict="gold_fails", problems=[f"the gold patch scores {gold_reward}: {gold_message}"])
    if empty_reward is not None and empty_reward >= gold_reward:
        v.verdict = "no_signal"
        v.accepted.append("the empty patch")
    v.accepted += [
        w.name for w, (status, reward, _) in zip(wrong, rest, strict=True) if reward is not None and reward >= gold_reward
    ]
    if v.verdict == "strong" and v.accepted:
        v.verdict = "weak"
    if infra:
        v.problems.append(f"{len(infra)} grade(s) were infrastructure errors (not counted): {infra[0]}")
    return v


async def audit(
    client: AsyncClient,
    tasks: list[Task],
    *,
    concurrency: int = 8,
    max_patches: int = 24,
    progress: Callable[[AuditVerdict], None] | None = None,
) -> AuditReport:
    """Audit ``tasks`` through ``client``'s daemon, ``concurrency`` grades at once."""
    started = time.monotonic()
    limit = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> AuditVerdict:
        verdict = await audit_task(client, task, limit, max_patches=max_patches)
        if progress:
            progress(verdict)
        return verdict

    return AuditReport(list(await asyncio.gather(*(one(t) for t in tasks))), time.monotonic() - started)


def audit_table(report: AuditReport) -> str:
    """One line per task, then the counts."""
    lines = [f"{'task':40} {'verdict':12} {'tried':>5}  accepted"]
    for v in report.tasks:
        lines.append(f"{v.task_id[:40]:40} {v.verdict:12} {v.tried:>5}  {'; '.join(v.accepted[:3]) or '-'}")
    counts = ", ".join(f"{k} {n}" for k, n in report.counts().items() if n)
    lines.append(f"{len(report.tasks)} task(s): {counts} ({report.duration:.1f} s)")
    return "\n".join(lines)


__all__ = ["AUDIT_VERDICTS", "AuditReport", "AuditVerdict", "WrongPatch", "audit", "audit_table", "audit_task", "wrong_patches"]
