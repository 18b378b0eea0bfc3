"""The task format: what an episode starts from and how its result is graded.

A task file (YAML or JSON, one task; or JSONL, one task per line) names its workspace as a
directory or tarball next to it, or as already present in the image. ``load_tasks`` resolves those
references into a self-contained ``Task``: the spec plus the workspace as tar bytes, which is what
travels to the daemon (``rlsandbox.v1.Task``). Hidden tests travel inside the spec and only ever
reach the clean-room sandbox where grading happens, never the agent's.

The JSON Schema of the format is ``docs/task.schema.json`` (``rlsandbox tasks schema``).
"""

from __future__ import annotations

import fnmatch
import io
import json
import os
import posixpath
import re
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from rlsandbox.daemon.grading.reports import OUTPUT_FORMATS, REPORT_FORMATS
from rlsandbox.daemon.model import check_image_reference, image_pool_name

MAX_WORKSPACE_BYTES = 32 << 20  # a workspace sent inline through the API (its field's limit)
MAX_BUNDLE_WORKSPACE_BYTES = 256 << 20  # a workspace that travels as a bundle (grading/bundles.py)
# Never copied from a workspace directory: history (see WorkspaceSpec.git) and caches.
WORKSPACE_EXCLUDES = (".git", "__pycache__", ".pytest_cache", ".mypy_cache", "node_modules/.cache")

# Files that decide how tests run rather than what the code does. The agent's changes to them are
# discarded in the clean room and reported as tampering (see docs/GRADING.md).
DEFAULT_PROTECTED = (
    "**/conftest.py",
    "**/pytest.ini",
    "**/.pytest.ini",
    "**/pytest.toml",  # pytest >= 9
    "**/.pytest.toml",
    "**/tox.ini",
    "**/setup.cfg",
    "**/pyproject.toml",
    "**/sitecustomize.py",
    "**/usercustomize.py",
    "**/*.pth",
    "**/*.pyc",
    "**/__pycache__/**",
    "**/*.dist-info/**",
    "**/*.egg-info/**",
    "**/*.egg-info",  # a PKG-INFO file is a distribution too (no entry points, but a name and version)
    "**/*.egg-link",
    "**/package.json",
    "**/.npmrc",
    "**/node_modules/**",
    # JavaScript runners' configuration: a transform rewrites the tests, a reporter writes results.
    "**/jest.config.*",
    "**/babel.config.*",
    "**/.babelrc",
    "**/.babelrc.*",
    "**/.mocharc*",
    "**/vitest.config.*",
    "**/vite.config.*",
    "**/*.node",
    "**/go.mod",
    "**/go.sum",
    # Native code runs below every check the grader makes in the test process.
    "**/*.so",
    "**/*.so.*",
    "**/*.pyd",
    "**/*.dylib",
)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkspaceSpec(_Model):
    """Where the project lives in the sandbox and where it comes from."""

    path: str = Field("/workspace", description="Absolute path of the workspace inside the sandbox.")
    source: Literal["bundle", "image"] = Field(
        "bundle",
        description="'bundle': copied in from `dir` or `tar` at session start; 'image': already in the task image at `path`.",
    )
    dir: str | None = Field(None, description="Task files only: a directory (relative to the task file) to copy in.")
    tar: str | None = Field(None, description="Task files only: a tarball (relative to the task file) to copy in.")
    git: Literal["reset", "keep"] = Field(
        "reset",
        description="'reset': the workspace history is one commit (the base), so the fix cannot be found in it; "
        "'keep': leave any .git as it is (needs git in the image for 'reset').",
    )
    patch: str | None = Field(
        None,
        description="A unified diff applied to the workspace before its history is reset, in the episode and in the "
        "clean room alike: the task's starting state (SWE-smith's bug patch, for one). Already applied: left as it is.",
    )

    exclude: list[str] = Field(
        default_factory=list,
        description="Workspace-relative paths that are the image's, not the project's (a virtualenv inside the "
        "repository, such as R2E-Gym's .venv): never read for grading nor carried to the clean room, which keeps "
        "its own copy, and left out of the reset history. The agent's changes there count for nothing.",
    )

    @field_validator("path")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not v.startswith("/") or posixpath.normpath(v) in ("/", "//"):
            raise ValueError("workspace.path must be an absolute path below / (for example /workspace)")
        return posixpath.normpath(v)

    @field_validator("exclude")
    @classmethod
    def _plain_paths(cls, v: list[str]) -> list[str]:
        out = []
        for path in v:
            norm = check_relative(path)
            if norm == "." or any(c in norm for c in "*?[]\\\n") or norm.split("/")[0] == ".git":
                raise ValueError(f"workspace.exclude {path!r}: a plain path below the workspace (no globs, not .git)")
            out.append(norm)
        return out

    def excluded(self, rel: str) -> bool:
        """Whether the workspace-relative ``rel`` is, or is inside, an excluded path."""
        return within(rel, self.exclude)


class RewardSpec(_Model):
    policy: Literal["resolved", "fraction", "weighted", "command", "file"] = Field(
        "resolved",
        description="resolved: 1.0 when every FAIL_TO_PASS and PASS_TO_PASS test passes, else 0.0; fraction: share "
        "of those tests that pass; weighted: weighted share (`weights`); command: the last line of `command`'s stdout; "
        "file: the number the test command wrote into the first of `files` that exists (Harbor's reward file).",
    )
    weights: dict[str, float] = Field(default_factory=dict, description="weighted: test id -> weight.")
    default_weight: float = Field(1.0, ge=0, description="weighted: weight of tests not in `weights`.")
    command: str | None = Field(
        None,
        description="command: a shell command run in the clean room after the tests (it runs on what the tests' "
        "code left there; prefer `file`).",
    )
    files: list[str] = Field(
        default_factory=list,
        max_length=8,
        description="file: absolute paths (or workspace-relative), tried in order; read by the daemon once the test "
        "command and every process it started have ended. A number (`.json`: its `reward` key); anything else, or no "
        "file, scores 0.0.",
    )

    @model_validator(mode="after")
    def _command(self) -> RewardSpec:
        if self.policy == "command" and not self.command:
            raise ValueError("reward.policy 'command' needs reward.command")
        if self.policy == "file" and not self.files:
            raise ValueError("reward.policy 'file' needs reward.files (e.g. [\"/logs/verifier/reward.txt\"])")
        for path in self.files:
            if not path or "\0" in path or ".." in path.split("/"):
                raise ValueError(f"reward.files: {path!r} is not a plain path (no '..', no NUL)")
        return self


class EvaluationSpec(_Model):
    test_command: str = Field(description="Shell command run in the workspace; `{report}` is replaced by the report path.")
    report_format: str = Field("pytest", description=f"One of: {', '.join(sorted(REPORT_FORMATS))}.")
    timeout: float = Field(300.0, gt=0, le=24 * 3600, description="Seconds before the test command is killed.")
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment of the test command.")
    fail_to_pass: list[str] = Field(default_factory=list, description="Tests the solution must make pass.")
    pass_to_pass: list[str] = Field(default_factory=list, description="Tests that must keep passing.")
    id_match: Literal["exact", "first-word", "name", "class"] = Field(
        "exact",
        description="How fail_to_pass/pass_to_pass name the report's tests, when not by the runner's own ids "
        "(exact). first-word: as SWE-bench's pytest log parsers list them, cut at the first space; name: a pytest "
        "function name in any file (SymPy's lists); class: a JUnit class (Multi-SWE-bench's Maven lists). A listed id "
        "stands for every reported test it names this way and passes only when all of them pass.",
    )
    hidden_tests: dict[str, str] = Field(
        default_factory=dict, description="Test files (workspace-relative path -> content) added only in the clean room."
    )
    hidden_tests_dir: str | None = Field(
        None, description="Task files only: a directory of hidden tests (relative to the task file)."
    )
    test_patch: str | None = Field(None, description="A unified diff adding or changing tests, applied only in the clean room.")
    test_files: list[str] = Field(
        default_factory=list, description="Globs (workspace-relative) of the original test files: restored before grading."
    )
    protected: list[str] = Field(
        default_factory=lambda: list(DEFAULT_PROTECTED),
        description="Globs of files whose changes by the agent are discarded (and reported as tampering).",
    )
    reward: RewardSpec = Field(default_factory=lambda: RewardSpec())
    tampering_policy: Literal["strict", "report"] | None = Field(
        None,
        description="strict: tampering detected while grading (the runner patched in-process, a forged report, code "
        "that reaches into the runner) makes the reward the policy's minimum; report: it is only listed. "
        "Default: the node's grading_tampering_policy (strict).",
    )
    second_opinion: Literal["off", "fail_to_pass", "all"] | None = Field(
        None,
        description="When a pytest grade pays, which of its passing tests run again, each alone in a fresh interpreter "
        "(a test that passed in the full run and not alone is tampering): fail_to_pass, all (at most 16, sampled), or "
        "off. Default: the node's grading_second_opinion (fail_to_pass).",
    )
    warm_runner: bool = Field(
        True,
        description="In a recycling pool, a test command of the form `python3 -m pytest ARGS` may be forked from a "
        "warm interpreter that imported pytest once (same user, path, arguments and environment as a fresh one). "
        "false: every grade starts a fresh interpreter (for tests that depend on one, such as on hash randomization).",
    )

    @field_validator("report_format")
    @classmethod
    def _format(cls, v: str) -> str:
        if v not in REPORT_FORMATS:
            raise ValueError(f"unknown report format {v!r}; use one of {', '.join(sorted(REPORT_FORMATS))}")
        return v

    @field_validator("hidden_tests")
    @classmethod
    def _relative_paths(cls, v: dict[str, str]) -> dict[str, str]:
        for p in v:
            check_relative(p)
        return v

    @model_validator(mode="after")
    def _report_placeholder(self) -> EvaluationSpec:
        if self.report_format not in OUTPUT_FORMATS and "{report}" not in self.test_command:
            raise ValueError(
                f"report format {self.report_format!r} is read from a file: put {{report}} in test_command "
                "where the tool takes its output path (for example --junitxml={report})"
            )
        return self

    @property
    def graded_ids(self) -> list[str]:
        return [*self.fail_to_pass, *(t for t in self.pass_to_pass if t not in self.fail_to_pass)]


class TaskSpec(_Model):
    """One task. ``docs/task.schema.json`` is generated from this model."""

    version: Literal[1] = 1
    id: str = Field(min_length=1, max_length=256, description="Unique id of the task.")
    pool: str = Field("", description="The daemon pool the task runs in (or give image).")
    image: str = Field(
        "",
        max_length=512,
        description="A container image to run the task in, instead of a pool: the node makes a pool for it "
        "from its image_pools templates (one image per instance, as SWE-bench, SWE-Gym and R2E-Gym publish them).",
    )
    problem_statement: str = Field("", description="What the agent is asked to do.")
    workspace: WorkspaceSpec = Field(default_factory=lambda: WorkspaceSpec())
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment of the episode's commands (a session's own env adds to it and wins): "
        "PATH=... for an image whose tools are off the default PATH, say.",
    )
    setup: list[str] = Field(
        default_factory=list, description="Shell commands run in the workspace at session start, with the task's env."
    )
    setup_timeout: float = Field(300.0, gt=0, le=24 * 3600)
    evaluation: EvaluationSpec
    gold_patch: str | None = Field(None, description="A unified diff that solves the task (used by validation).")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Free-form (repository, difficulty, ...).")

    @model_validator(mode="after")
    def _pool_or_image(self) -> TaskSpec:
        if bool(self.pool) == bool(self.image):
            raise ValueError("give exactly one of pool (a configured pool) and image (a pool made for it on demand)")
        if self.image:
            check_image_reference(self.image)
        return self

    @property
    def pool_name(self) -> str:
        """The pool the task runs in: the configured one, or the one a node makes for its image."""
        return self.pool or image_pool_name(self.image)


def check_relative(path: str) -> str:
    """A workspace-relative path that stays inside the workspace."""
    norm = posixpath.normpath(path)
    if not path or path.startswith("/") or norm == ".." or norm.startswith("../") or "\x00" in path:
        raise ValueError(f"path {path!r} must be relative to the workspace and stay inside it")
    return norm


def within(path: str, places: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``places`` or inside one (plain relative paths, no globs)."""
    return any(path == p or path.startswith(p + "/") for p in places)


# Patterns whose files are found by a consumer that ignores case: importlib.metadata lists every
# folder whose lower-cased name ends in .dist-info or .egg-info as a distribution (with its entry
# points: pytest's plugins), so RLEvil-1.0.DIST-INFO is one too. These match in any case.
CASELESS_PATTERNS = frozenset(("**/*.dist-info/**", "**/*.egg-info/**", "**/*.egg-info", "**/*.egg-link"))


def matches(path: str, patterns: list[str] | tuple[str, ...]) -> bool:
    """Glob match of a workspace-relative path, where ``**/`` also matches no folder at all; the
    patterns of ``CASELESS_PATTERNS`` match in any case."""
    lowered = ""
    for pattern in patterns:
        subject = path
        if pattern in CASELESS_PATTERNS:
            subject = lowered = lowered or path.lower()
        if fnmatch.fnmatchcase(subject, pattern):
            return True
        if pattern.startswith("**/") and fnmatch.fnmatchcase(subject, pattern[3:]):
            return True
    return False


class TaskError(ValueError):
    """A task file or document that cannot be used, with the reason."""


@dataclass(frozen=True, slots=True)
class Task:
    """A self-contained task: the spec and, for bundle workspaces, the workspace as a tarball."""

    spec: TaskSpec
    workspace_tar: bytes = b""
    source: str = ""

    @property
    def id(self) -> str:
        return self.spec.id

    def spec_json(self) -> str:
        return self.spec.model_dump_json(exclude_none=True)

    @classmethod
    def from_wire(cls, spec_json: str | bytes, workspace_tar: bytes = b"", *, workspace_limit: int = MAX_WORKSPACE_BYTES) -> Task:
        """Validate a task received over the API (or as a bundle, with a bundle's ``workspace_limit``);
        raises TaskError with what is wrong."""
        try:
            spec = TaskSpec.model_validate_json(spec_json)
        except ValidationError as e:
            raise TaskError(f"invalid task: {_errors(e)}") from None
        if spec.workspace.dir or spec.workspace.tar or spec.evaluation.hidden_tests_dir:
            raise TaskError(
                f"task {spec.id}: workspace.dir, workspace.tar and evaluation.hidden_tests_dir are file references; "
                "load the task with rlsandbox.daemon.grading.task.load_tasks (or send the tarball) instead"
            )
        if spec.workspace.source == "bundle" and workspace_tar:
            _check_tar(workspace_tar, spec.id, workspace_limit)
        return cls(spec, workspace_tar)


def _errors(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'task'}: {err['msg']}" for err in e.errors())


def _check_tar(data: bytes, task_id: str, limit: int = MAX_WORKSPACE_BYTES) -> None:
    if len(data) > limit:
        hint = "" if limit >= MAX_BUNDLE_WORKSPACE_BYTES else " inline (push the task as a bundle for up to 256 MiB)"
        raise TaskError(f"task {task_id}: workspace tarball is {len(data)} bytes; the limit is {limit}{hint}")
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for m in tar:
                check_relative(m.name)
                if m.islnk() or m.isdev():
                    raise TaskError(f"task {task_id}: workspace tarball member {m.name!r} is a hard link or device")
    except (tarfile.TarError, ValueError) as e:
        raise TaskError(f"task {task_id}: workspace tarball is not usable: {e}") from None


def tar_directory(root: Path, excludes: tuple[str, ...] = WORKSPACE_EXCLUDES, limit: int = MAX_WORKSPACE_BYTES) -> bytes:
    """A deterministic tarball of ``root``'s contents (paths relative to it, sorted, fixed mtimes)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = Path(dirpath).relative_to(root)
            dirnames[:] = sorted(d for d in dirnames if (rel_dir / d).as_posix() not in excludes and d not in excludes)
            for name in sorted(dirnames) + sorted(filenames):
                full = Path(dirpath) / name
                rel = (rel_dir / name).as_posix()
                info = tar.gettarinfo(str(full), arcname=rel)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                if info.isreg():
                    with full.open("rb") as f:
                        tar.addfile(info, f)
                elif info.isdir() or info.issym():
                    tar.addfile(info)
    data = buf.getvalue()
    if len(data) > limit:
        raise TaskError(f"workspace {root} is {len(data)} bytes as a tarball; the limit is {limit}")
    return data


def tar_files(files: Mapping[str, str | bytes], base: bytes = b"") -> bytes:
    """A workspace tarball from workspace-relative paths and contents (folders are implied), after
    the members of the tarball ``base`` when given."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        if base:
            with tarfile.open(fileobj=io.BytesIO(base)) as src:
                for member in src:
                    tar.addfile(member, src.extractfile(member) if member.isreg() else None)
        for path, content in sorted(files.items()):
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(check_relative(path))
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _read_dir_texts(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            out[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
    return out


def resolve(doc: Mapping[str, Any], base_dir: Path, source: str = "", workspace_limit: int = MAX_WORKSPACE_BYTES) -> Task:
    """Validate one task document and resolve its file references against ``base_dir``."""
    try:
        spec = TaskSpec.model_validate(doc)
    except ValidationError as e:
        raise TaskError(f"{source or 'task'}: {_errors(e)}") from None
    ws, ev = spec.workspace, spec.evaluation
    tar = b""
    if ws.source == "bundle":
        if bool(ws.dir) == bool(ws.tar):
            raise TaskError(f"{source or spec.id}: a bundle workspace needs exactly one of workspace.dir and workspace.tar")
        if ws.dir:
            d = (base_dir / ws.dir).resolve()
            if not d.is_dir():
                raise TaskError(f"{source or spec.id}: workspace.dir {d} is not a directory")
            tar = tar_directory(d, limit=workspace_limit)
        else:
            tar = (base_dir / str(ws.tar)).read_bytes()
            _check_tar(tar, spec.id, workspace_limit)
    hidden = dict(ev.hidden_tests)
    if ev.hidden_tests_dir:
        d = (base_dir / ev.hidden_tests_dir).resolve()
        if not d.is_dir():
            raise TaskError(f"{source or spec.id}: evaluation.hidden_tests_dir {d} is not a directory")
        hidden.update(_read_dir_texts(d))
    spec = spec.model_copy(
        update={
            "workspace": ws.model_copy(update={"dir": None, "tar": None}),
            "evaluation": ev.model_copy(update={"hidden_tests": hidden, "hidden_tests_dir": None}),
        }
    )
    return Task(spec, tar, source)


def _documents(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    if path.suffix == ".jsonl":
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    yield json.loads(line), f"{path}:{n}"
                except ValueError as e:
                    raise TaskError(f"{path}:{n}: not JSON: {e}") from None
        return
    text = path.read_text(encoding="utf-8")
    try:
        doc = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise TaskError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: {e}") from None
    if not isinstance(doc, dict):
        raise TaskError(f"{path}: a task file holds one task (a mapping)")
    yield doc, str(path)


TASK_SUFFIXES = (".yaml", ".yml", ".json", ".jsonl")


def load_tasks(path: str | Path, *, workspace_limit: int = MAX_WORKSPACE_BYTES) -> list[Task]:
    """Tasks from a file (.yaml, .yml, .json, .jsonl) or from every task file below a directory
    (``workspace_limit``: MAX_BUNDLE_WORKSPACE_BYTES for tasks pushed as bundles)."""
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.suffix in TASK_SUFFIXES and f.name.startswith("task"))
        if not files:
            raise TaskError(f"{p}: no task files (task*.yaml, task*.json, task*.jsonl) below it")
    elif p.is_file():
        files = [p]
    else:
        raise TaskError(f"{p}: no such file or directory")
    tasks = [resolve(doc, f.parent, src, workspace_limit) for f in files for doc, src in _documents(f)]
    seen: dict[str, str] = {}
    for t in tasks:
        if t.id in seen:
            raise TaskError(f"task id {t.id!r} appears twice: {seen[t.id]} and {t.source}")
        seen[t.id] = t.source
    return tasks


def json_schema() -> dict[str, Any]:
    schema = TaskSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://rlsandbox.dev/schemas/task-v1.json"
    return schema


# A folder named like one that holds tests (tests, test_utils, unit_tests, testing, spec, __tests__).
TEST_FOLDER = re.compile(r"(^|[_.-])tests?($|[_.-])|^testing$|^spec$|^__tests__$")
