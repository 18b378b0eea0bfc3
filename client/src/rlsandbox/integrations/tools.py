"""Tool calls an agent makes in a sandbox, shared by the adapters: ``bash``, ``view``, ``edit``,
``write`` and ``submit``, over a blocking :class:`rlsandbox.client.Session` (``run``) or an
:class:`rlsandbox.client.AsyncSession` (``arun``). Each returns the text
the model reads next; a tool used wrongly (a missing file, an edit whose text is not found once)
is an observation saying so, never an exception: it is the policy's mistake, not the sandbox's.

A call is a dict ``{"tool": "edit", "path": ..., "old": ..., "new": ...}`` or a plain string (a
bash command). As text (what a model writes), a JSON object with a ``tool`` key is a call, any
other text a bash command.

Also shared: :func:`grade_record` (a grade as plain data), :func:`task_from_file` (a task of an
importer's JSONL, by id), and what a call that failed because the episode killed its own sandbox
(``SandboxRPCError.fault``) is instead of an infra error: :func:`lost` (the episode's grade,
reward 0) and :func:`died` (a command's result, as a container backend shows an OOM-killed
container). Dying must not pay better than failing: a masked sample would.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Generator, Optional, Tuple, Union

from rlsandbox.client import AsyncSession, ExecResult, GradeResult, InvalidArgumentError, SandboxRPCError, Session

ToolCall = Union[str, Dict[str, Any]]
MAX_VIEW = 400  # lines a view shows at most
OUTPUT_CAP = 64 << 10  # characters of a command's output in an observation


@dataclass
class Observation:
    text: str
    exit_code: Optional[int] = None
    grade: Optional[GradeResult] = None  # set by submit

    @property
    def submitted(self) -> bool:
        return self.grade is not None


def died(error: SandboxRPCError) -> Optional[ExecResult]:
    """A command's result for a call that failed because the sandbox died of the episode's own
    doing (``error.fault``): killed (SIGKILL, exit 137 in a shell), the fault on stderr, as a
    container backend shows a command of an OOM-killed container. None when the failure is the
    node's: raise it."""
    if not error.fault:
        return None
    why = f"{error.fault}\n".encode()
    return ExecResult(None, 9, False, b"", why, 0, len(why), False, False, 0.0)


def lost(session: Session, error: SandboxRPCError) -> Optional[GradeResult]:
    """The episode's grade when a call failed because its sandbox died of the episode's own doing
    (``error.fault``): the node's (reward 0, the fault its limit; it is in the run's rewards), or
    the same made here where the node cannot grade (a session without a task). None when the
    failure is the node's: mask that sample."""
    if not error.fault:
        return None
    try:
        return session.grade()
    except SandboxRPCError:
        return _zero(session, error.fault)


async def alost(session: AsyncSession, error: SandboxRPCError) -> Optional[GradeResult]:
    """``lost`` over an async session."""
    if not error.fault:
        return None
    try:
        return await session.grade()
    except SandboxRPCError:
        return _zero(session, error.fault)


def _zero(session: Union[Session, AsyncSession], fault: str) -> GradeResult:
    return GradeResult(
        status="ok", reward=0.0, resolved=False, message=f"reward 0: {fault}", tests=[], counts={}, exit_code=None,
        timed_out=False, report_complete=False, tampering=[], log=b"", duration=0.0, mode="", task_id=session.info.task_id,
        session_id=session.id, limits=[fault],
    )  # fmt: skip


def parse(call: ToolCall) -> Dict[str, Any]:
    """A call as a dict: text that is a JSON object with a ``tool`` key is one, other text is bash."""
    if isinstance(call, dict):
        return call
    text = call.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError:
            value = None
        if isinstance(value, dict) and isinstance(value.get("tool"), str):
            return value
    return {"tool": "bash", "command": call}


def describe(result: ExecResult) -> str:
    """A command's result as the model reads it: its output (capped, saying so) and exit code."""
    out = result.stdout_text
    err = result.stderr.decode("utf-8", errors="replace")
    if err:
        out += ("" if not out or out.endswith("\n") else "\n") + err
    if len(out) > OUTPUT_CAP:
        out = out[:OUTPUT_CAP] + f"\n[output cut at {OUTPUT_CAP} characters]"
    if result.stdout_truncated or result.stderr_truncated:
        out += "\n[output truncated by the sandbox]"
    status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    return f"{out}\n[{status}]" if out else f"[{status}]"


def run(session: Session, call: ToolCall, *, timeout: float = 120.0, cwd: str = "") -> Observation:
    """Run one tool call in ``session``. Arguments the node refuses (INVALID_ARGUMENT: a timeout
    over its limit, a path it cannot take) are the policy's doing: an observation, as a misused
    tool is; every other error is the node's and is raised."""
    try:
        steps = _steps(parse(call), timeout, cwd, 0)
        reply: Any = None
        while True:
            kind, arg = steps.send(reply)
            if kind == "exec":
                reply = session.exec(arg.pop("command"), **arg)
            elif kind == "read":
                reply = session.read_files([arg]).get(arg)
            elif kind == "write":
                session.write_files(arg)
                reply = None
            else:
                reply = session.grade()
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except InvalidArgumentError as e:
        return refused(e)


async def arun(session: AsyncSession, call: ToolCall, *, timeout: float = 120.0, cwd: str = "", seq: int = 0) -> Observation:
    """``run`` over an async session; ``seq``: the call's step number (a retried call never runs twice)."""
    try:
        steps = _steps(parse(call), timeout, cwd, seq)
        reply: Any = None
        while True:
            kind, arg = steps.send(reply)
            if kind == "exec":
                reply = await session.exec(arg.pop("command"), **arg)
            elif kind == "read":
                reply = (await session.read_files([arg])).get(arg)
            elif kind == "write":
                await session.write_files(arg)
                reply = None
            else:
                reply = await session.grade()
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    except InvalidArgumentError as e:
        return refused(e)


Step = Tuple[str, Any]  # ("exec", exec arguments), ("read", path), ("write", files) or ("grade", None)


def _steps(c: Dict[str, Any], timeout: float, cwd: str, seq: int) -> Generator[Step, Any, Observation]:
    """One tool call as the session calls it needs (each answered with the call's result), then
    the observation: the tools' logic once, for the blocking ``run`` and the async ``arun``."""
    tool = c.get("tool")
    if tool == "bash":
        kwargs = _bash(c, timeout, cwd)
        if isinstance(kwargs, Observation):
            return kwargs
        if seq:
            kwargs["seq"] = seq
        result = yield "exec", kwargs
        return Observation(describe(result), result.exit_code)
    if tool in ("view", "edit"):
        path = c.get("path")
        if not isinstance(path, str) or not path:
            return Observation("a 'path' (string) is needed")
        text = read_text(path, (yield "read", path))
        outcome = text if isinstance(text, Observation) else view_or_edit(text, c)
        if isinstance(outcome, str):
            yield "write", {path: outcome}
            return Observation(f"edited {path}")
        return outcome
    if tool == "write":
        if not isinstance(c.get("path"), str) or not isinstance(c.get("content"), str):
            return Observation("write needs 'path' and 'content' (strings)")
        yield "write", {c["path"]: c["content"]}
        return Observation(f"wrote {len(c['content'].encode())} bytes to {c['path']}")
    if tool == "submit":
        grade = yield "grade", None
        return Observation(submitted(grade), grade=grade)
    return Observation(f"unknown tool {tool!r}: use bash, view, edit, write or submit")


def _bash(c: Dict[str, Any], timeout: float, cwd: str) -> Union[Dict[str, Any], Observation]:
    """A bash call's exec arguments (``command`` among them), or what is wrong with it."""
    command = c.get("command")
    if not isinstance(command, str) or not command.strip():
        return Observation("bash needs a non-empty 'command'")
    seconds = number(c.get("timeout"))
    if seconds is None or seconds < 0:
        return Observation("bash's 'timeout' must be a positive number of seconds")
    if c.get("cwd") is not None and not isinstance(c.get("cwd"), str):
        return Observation("bash's 'cwd' must be a path (a string)")
    kwargs: Dict[str, Any] = {"command": command, "timeout": seconds or timeout}
    if cwd or c.get("cwd"):
        kwargs["cwd"] = c.get("cwd") or cwd
    return kwargs


# -- the pure parts, shared with the async adapters --------------------------------------------
def submitted(grade: GradeResult) -> str:
    return f"submitted: {grade.status}" + (f", reward {grade.reward}" if grade.reward is not None else f" ({grade.message})")


def read_text(path: str, found: Any) -> Union[str, Observation]:
    """A file read back (a ``FileRead`` or None) as text, or why it could not be read."""
    if found is None or found.error:
        return Observation(f"cannot read {path}: {found.error if found else 'not found'}")
    return str(found.data.decode("utf-8", errors="replace"))


def refused(e: InvalidArgumentError) -> Observation:
    return Observation(f"refused by the sandbox: {e.message}")


def number(value: Any) -> Optional[float]:
    """A model's numeric argument: absent or empty is 0; None when it is not a finite number."""
    if value is None or value == "":
        return 0.0
    if isinstance(value, bool):
        return None
    try:
        n = float(value)
    except (TypeError, ValueError):
        return None
    return n if math.isfinite(n) else None


def view_or_edit(text: str, c: Dict[str, Any]) -> Union[str, Observation]:
    """A view of ``text``, or its edit: the new text to write, or why not."""
    return view_text(text, c) if c.get("tool") == "view" else edited(text, c)


def view_text(text: str, c: Dict[str, Any]) -> Observation:
    """A file's lines ``start`` to ``end`` (1-based), numbered, at most MAX_VIEW of them."""
    lines = text.splitlines()
    first, last = number(c.get("start")), number(c.get("end"))
    if first is None or last is None:
        return Observation("view's 'start' and 'end' must be line numbers")
    start = max(int(first or 1), 1)
    end = min(int(last or len(lines)), start + MAX_VIEW - 1, len(lines))
    shown = "\n".join(f"{n:6d}\t{lines[n - 1]}" for n in range(start, end + 1))
    more = f"\n[{len(lines) - end} more lines: view with start={end + 1}]" if end < len(lines) else ""
    return Observation(shown + more)


def edited(text: str, c: Dict[str, Any]) -> Union[str, Observation]:
    """``text`` with ``old`` replaced by ``new`` (``old`` must occur exactly once), or why not."""
    old, new = c.get("old"), c.get("new")
    if not isinstance(old, str) or not old or not isinstance(new, str):
        return Observation("edit needs 'path', 'old' (the exact text to replace, non-empty) and 'new'")
    found = text.count(old)
    if found != 1:
        return Observation(f"'old' occurs {found} times in {c.get('path')}; it must occur exactly once (add context)")
    return text.replace(old, new, 1)


def task_statement(task: Any) -> str:
    """A task's problem statement, whatever form the task was given in ('' for a bare ref)."""
    if isinstance(task, tuple) and len(task) == 2:
        task = task[0]
    if isinstance(task, str):
        try:
            task = json.loads(task)
        except ValueError:
            return ""
    if isinstance(task, dict):
        return str(task.get("problem_statement", ""))
    spec = getattr(task, "spec", None)
    return str(getattr(spec, "problem_statement", "") or "")


def session_options(
    *, image: str = "", pool: str = "", task: Any = None, labels: Any = None, env: Any = None, workdir: str = ""
) -> Dict[str, Any]:
    """``create_session`` keywords for an adapter's sandbox from a task, an image or a pool (the
    pool is create_session's positional argument: it is only checked here)."""
    if not (image or pool or task is not None):
        raise ValueError("give an image, a pool or a task for the sandbox")
    options: Dict[str, Any] = {
        "labels": {str(k): str(v) for k, v in dict(labels or {}).items()},
        "env": dict(env or {}),
    }
    if workdir:
        options["workdir"] = workdir
    if task is not None:
        options["task"] = tuple(task) if isinstance(task, list) else task
    elif image:
        options["image"] = image
    return options


ExecOutcome = Tuple[int, str, str]  # (exit_code, stdout, stderr), as slime and harbor report a command
TIMED_OUT = 124  # the exit code of a command past its timeout, as timeout(1) has it


def outcome(result: ExecResult) -> ExecOutcome:
    """A command's result as ``(exit_code, stdout, stderr)``: 128 + signal for a killed command,
    124 for one past its timeout."""
    err = result.stderr_text
    if result.timed_out:
        return TIMED_OUT, result.stdout_text, err + f"\n[rlsandbox: the command timed out after {result.duration:.0f} s]"
    if result.exit_code is None:
        return 128 + (result.signal or 0), result.stdout_text, err
    return result.exit_code, result.stdout_text, err


def grade_record(grade: GradeResult) -> Dict[str, Any]:
    """A grade as plain data (JSON-ready), as the adapters hand it to their framework."""
    return {
        "status": grade.status,
        "reward": grade.reward,
        "resolved": grade.resolved,
        "message": grade.message,
        "counts": dict(grade.counts),
        "tampering": list(grade.tampering),
        "limits": list(grade.limits),
        "exit_code": grade.exit_code,
        "timed_out": grade.timed_out,
        "duration": grade.duration,
        "session_id": grade.session_id,
    }


_TASK_FILES: Dict[Tuple[str, int, int], Dict[str, Dict[str, Any]]] = {}  # (path, mtime, size) -> id -> spec


def task_from_file(path: Union[str, Path], task_id: str) -> Dict[str, Any]:
    """The spec of ``task_id`` in a JSONL file of ``rlsandbox tasks import-*``: one file serves every
    episode of a run (read once per version of the file)."""
    where = Path(path)
    try:
        st = where.stat()
    except OSError as e:
        raise FileNotFoundError(
            f"{where}: the tasks file is not readable ({e.strerror}): make it with "
            "'rlsandbox tasks import-harbor TASKS_DIR --build --out FILE'"
        ) from e
    key = (str(where.resolve()), st.st_mtime_ns, st.st_size)
    specs = _TASK_FILES.get(key)
    if specs is None:
        specs = {}
        with where.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    spec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{where}:{number}: not a JSON task spec ({e.msg})") from e
                if not isinstance(spec, dict) or not isinstance(spec.get("id"), str):
                    raise ValueError(f"{where}:{number}: a task spec needs an 'id'")
                specs[spec["id"]] = spec
        _TASK_FILES.clear()  # one file per process at a time, in practice: keep only the newest
        _TASK_FILES[key] = specs
    found = specs.get(task_id)
    if found is None:
        raise LookupError(
            f"task {task_id!r} is not in {where} ({len(specs)} tasks): import its folder with "
            "'rlsandbox tasks import-harbor' into that file"
        )
    return found
