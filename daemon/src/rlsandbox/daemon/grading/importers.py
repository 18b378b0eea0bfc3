"""Importers: tasks from datasets as they are published (SWE-bench-style JSONL; Harbor and
Terminal-Bench task folders)."""

from __future__ import annotations

import ast
import json
import posixpath
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlsandbox.daemon.grading.patches import PatchError, reverse_patch
from rlsandbox.daemon.grading.task import (
    DEFAULT_PROTECTED,
    TEST_FOLDER,
    EvaluationSpec,
    RewardSpec,
    TaskError,
    TaskSpec,
    WorkspaceSpec,
    check_relative,
)
from rlsandbox.integrations.harbor_tasks import dockerfile_workdir, harbor_image, harbor_task_id


# -- SWE-bench ------------------------------------------------------------------------------------
def _id_list(value: Any, field: str, instance_id: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise TaskError(f"{instance_id}: {field} is a string but not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TaskError(f"{instance_id}: {field} must be a list of test ids")
    return list(value)


def patch_files(patch: str) -> list[str]:
    """The files a unified diff touches (its ``+++ b/...`` lines; deleted files by their ``---``)."""
    files: list[str] = []
    old = ""
    for line in patch.splitlines():
        if line.startswith("--- "):
            old = line[4:].split("\t")[0]
        elif line.startswith("+++ "):
            new = line[4:].split("\t")[0]
            name = new if new != "/dev/null" else old
            name = name[2:] if name.startswith(("a/", "b/")) else name
            if name not in files:
                files.append(name)
    return files


def folder_globs_of_tests(test_files: list[str]) -> list[str]:
    """``folder/**`` for each folder of ``test_files`` named like a test folder: its __init__.py,
    conftest files, helpers and data belong to the tests (the grader also finds these itself)."""
    folders = {posixpath.dirname(f) for f in test_files if posixpath.dirname(f)}
    named = sorted(f for f in folders if TEST_FOLDER.search(posixpath.basename(f)))
    return [f"{f}/**" for f in named if not any(f.startswith(g + "/") for g in named)]


VARIANTS = ("auto", "swebench", "swesmith", "r2e-gym", "multi-swe-bench")
# The test environment in SWE-bench's, SWE-Gym's and SWE-smith's images is the conda env
# `testbed`, which their eval scripts activate in bash (their images put the activation in
# /root/.bashrc only). A task's test command runs under sh: the env goes first on its PATH, or
# `python -m pytest` is the base interpreter's, without pytest or the project's dependencies.
DATASET_IMAGE_PATH = (
    "/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)


def evaluation_env(env: Mapping[str, str] | None, *, image_workspace: bool) -> dict[str, str]:
    """The test command's environment: ``env``, with the datasets' conda env on PATH when the
    repository is the image's (a PATH given in ``env`` wins)."""
    return {"PATH": DATASET_IMAGE_PATH, **(env or {})} if image_workspace else dict(env or {})


def record_variant(instance: Mapping[str, Any]) -> str:
    """Which published layout a record has. SWE-bench, SWE-Gym, SWE-bench-extra and R2E-Gym's
    SWE-bench-style sets carry a test patch and a fix; SWE-smith's carry neither: its tests are in
    the repository and its ``patch`` puts the bug in (the fix is its reverse). R2E-Gym's own
    records (``expected_output_json``, tests in the image) are ``r2e-gym`` (:func:`from_r2egym`)."""
    if instance.get("fix_patch") and "base" in instance:
        return "multi-swe-bench"
    if instance.get("test_patch"):
        return "swebench"
    if "expected_output_json" in instance and not instance.get("FAIL_TO_PASS"):
        return "r2e-gym"
    if instance.get("FAIL_TO_PASS") and instance.get("patch"):
        return "swesmith"
    return "swebench"


SWEBENCH_TEST_COMMAND = "python -m pytest -rA -p no:cacheprovider {test_files}"
# Django's instances run its own runner, as SWE-bench's harness runs them: unittest's output, one
# process (the unittest guard takes the first Python process for the runner).
DJANGO_TEST_COMMAND = "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {test_modules}"

# SWE-bench's log parsers (a record's ``log_parser``) that read ``pytest -rA`` lines as
# parse_log_pytest does: the test id is the first word after the status, so a listed id is cut at
# its first space (EvaluationSpec.id_match "first-word").
SWEBENCH_PYTEST_PARSERS = frozenset(
    {
        "parse_log_pytest", "parse_log_pytest_options", "parse_log_pytest_v2", "parse_log_seaborn",
        "parse_log_matplotlib", "parse_log_astroid", "parse_log_flask", "parse_log_marshmallow", "parse_log_pvlib",
        "parse_log_pyvista", "parse_log_sqlfluff", "parse_log_xarray", "parse_log_pydicom", "parse_log_requests",
        "parse_log_pylint", "parse_log_astropy", "parse_log_scikit", "parse_log_sphinx",
    }
)  # fmt: skip
# Log parsers whose output rlsandbox reads with a format of its own, running the record's own test
# command (its eval_script's): the report format, and how the record's ids name the report's tests.
SWEBENCH_OWN_COMMAND_PARSERS = {
    "parse_log_gotest": ("gotest", "exact"),  # go test -v: bare test names, as the record lists them
    "parse_log_tap": ("tap", "exact"),  # mocha/node TAP: the test's full title
}
MULTI_SWE_BENCH = "multi-swe-bench"  # the log_parser of a record of Multi-SWE-bench's layout
_EVAL_START, _EVAL_END = ": '>>>>> Start Test Output'", ": '>>>>> End Test Output'"
_PIPED_TO_CAT = re.compile(r"^\((.*)\)\s*\|\s*cat$", re.DOTALL)


def eval_script_command(instance: Mapping[str, Any]) -> str:
    """The test command of a record's ``eval_script`` (the lines SWE-bench's harness runs between
    its start and end markers), without the ``( ... ) | cat`` around it, which would hide its exit
    code from the grader's check; "" when the record has no such script."""
    script = str(instance.get("eval_script") or "")
    start, end = script.find(_EVAL_START), script.find(_EVAL_END)
    if start < 0 or end < start:
        return ""
    command = script[start + len(_EVAL_START) : end].strip()
    if m := _PIPED_TO_CAT.match(command):
        command = m.group(1).strip()
    return command


@dataclass(frozen=True, slots=True)
class Harness:
    """How a record's tests run and are read: a test command (None: the record has none that
    rlsandbox reads), its report format, and how the record's ids name the report's tests."""

    test_command: str | None
    report_format: str
    id_match: str


def record_harness(instance: Mapping[str, Any]) -> Harness:
    """The harness a record's dataset grades it with, as rlsandbox runs it. Django's instances
    run its runner (read as unittest); SymPy's list bare function names (parse_log_sympy), found
    in pytest's report by name; the pytest family runs pytest on the patch's test files, ids cut
    at the first space; Go's and TAP's run the record's own command. Records without a
    ``log_parser`` (the older layout) are pytest's, as SWE-bench's harness defaults."""
    parser = str(instance.get("log_parser") or "")
    if instance.get("repo") == "django/django" or parser == "parse_log_django":
        return Harness(DJANGO_TEST_COMMAND, "unittest", "exact")
    if instance.get("repo") == "sympy/sympy" or parser == "parse_log_sympy":
        return Harness(SWEBENCH_TEST_COMMAND, "pytest", "name")
    if not parser or parser in SWEBENCH_PYTEST_PARSERS:
        return Harness(SWEBENCH_TEST_COMMAND, "pytest", "first-word")
    if parser in SWEBENCH_OWN_COMMAND_PARSERS:
        fmt, match = SWEBENCH_OWN_COMMAND_PARSERS[parser]
        return Harness(eval_script_command(instance) or None, fmt, match)
    if parser == MULTI_SWE_BENCH:  # test classes, read from the JUnit XML the caller's command writes
        return Harness(None, "junit", "class")
    return Harness(None, "pytest", "exact")


def test_modules(test_files: list[str], root: str = "tests/") -> list[str]:
    """The dotted modules of the test files under ``root`` (Django's runtests.py takes
    ``admin_views.tests`` for tests/admin_views/tests.py)."""
    return [f[len(root) : -len(".py")].replace("/", ".") for f in test_files if f.startswith(root) and f.endswith(".py")]


def _harness(instance: Mapping[str, Any], iid: str, test_command: str | None, report_format: str | None) -> Harness:
    """The record's harness with the caller's command and format over it."""
    own = record_harness(instance)
    if test_command is None and report_format not in (None, own.report_format) and own.test_command == DJANGO_TEST_COMMAND:
        own = Harness(SWEBENCH_TEST_COMMAND, own.report_format, own.id_match)  # another format than Django's: pytest
    command = test_command or own.test_command
    parser = instance.get("log_parser")
    if command is None and parser == MULTI_SWE_BENCH:
        raise TaskError(
            f"{iid}: a Multi-SWE-bench record carries no test command (its harness keeps one per repository): give "
            "--test-command, writing a JUnit XML report to {report} (its test names are JUnit classes)"
        )
    if command is None:
        readable = sorted({"parse_log_django", "parse_log_sympy", *SWEBENCH_PYTEST_PARSERS, *SWEBENCH_OWN_COMMAND_PARSERS})
        raise TaskError(
            f"{iid}: its tests are read by SWE-bench's {parser}, which rlsandbox has no reader for yet (it reads "
            f"{', '.join(readable)}): give --test-command and --report-format (junit for a Maven or Gradle report, "
            "say), or leave the record out"
        )
    fmt = report_format or (own.report_format if test_command is None or parser else "pytest")
    return Harness(command, fmt, own.id_match)


def from_swebench(
    instance: Mapping[str, Any],
    *,
    pool: str = "",
    image: str = "",
    workspace_path: str = "/testbed",
    test_command: str | None = None,
    env: Mapping[str, str] | None = None,
    workspace_tar: str | None = None,
    variant: str = "auto",
    report_format: str | None = None,
    tests: Mapping[str, str] | None = None,
) -> TaskSpec:
    """A task from a SWE-bench-style instance (instance_id, repo, base_commit, patch, test_patch,
    FAIL_TO_PASS / PASS_TO_PASS as lists or JSON strings). The repository is expected in the pool's
    image at ``workspace_path``, checked out at ``base_commit``; or, with ``workspace_tar`` (a
    tarball path relative to the task file), it is copied in. ``env`` is the environment of the
    test command and of the episode's commands alike (``PYTHONPATH=...``). The protected test set
    is the patch's test files and the test folders that hold them.

    ``image`` instead of ``pool``: each instance runs in its own image (a pool made on demand, see
    :func:`instance_image` for the template).

    ``variant``: ``auto`` tells the layouts apart by their fields (:func:`record_variant`);
    ``r2e-gym`` records go to :func:`from_r2egym` (with ``tests``, the image's test files, or
    else the record's own); ``multi-swe-bench`` records (Multi-SWE-bench's own layout) are read
    by :func:`multiswebench_record` first;
    ``swesmith`` records become tasks whose workspace starts with the record's bug patch applied
    (``workspace.patch``), whose tests are the repository's own files that hold FAIL_TO_PASS (run
    and restored before grading, as SWE-smith runs them), and whose gold patch is the bug's reverse.

    The test command, its report format and how the record's ids are matched follow the
    record's harness (:func:`record_harness`: its ``log_parser``, its ``eval_script``); a
    ``test_command`` or ``report_format`` given here wins. ``{test_modules}`` in a command is
    replaced by the dotted modules of the patch's test files under ``tests/``."""
    if variant not in VARIANTS:
        raise TaskError(f"unknown record variant {variant!r}; use one of {', '.join(VARIANTS)}")
    kind = record_variant(instance) if variant == "auto" else variant
    if kind == "multi-swe-bench":
        instance = multiswebench_record(instance)
        kind = "swebench"
    if kind == "r2e-gym":
        if workspace_tar:
            raise TaskError(f"{r2egym_instance_id(instance)}: an R2E-Gym task runs in its own image (its virtualenv is there)")
        return from_r2egym(
            instance, tests, pool=pool, image=image or ("field" if not pool else ""), workspace_path=workspace_path,
            test_command=test_command or "", env=env,
        )  # fmt: skip
    iid = str(instance.get("instance_id") or "")
    if not iid:
        raise TaskError("SWE-bench instance without instance_id")
    if kind == "swesmith":
        return _from_swesmith(
            instance, iid, pool, image, workspace_path, test_command or SWEBENCH_TEST_COMMAND, env, workspace_tar,
            report_format or "pytest",
        )  # fmt: skip
    for key in ("test_patch", "FAIL_TO_PASS"):
        if not instance.get(key):
            raise TaskError(f"{iid}: missing {key}")
    test_patch = str(instance["test_patch"])
    test_files = patch_files(test_patch)
    harness = _harness(instance, iid, test_command, report_format)
    assert harness.test_command is not None
    command = harness.test_command.replace("{test_modules}", " ".join(shlex.quote(m) for m in test_modules(test_files)))
    workspace = (
        WorkspaceSpec(path=workspace_path, source="bundle", tar=workspace_tar, git="reset")
        if workspace_tar
        else WorkspaceSpec(path=workspace_path, source="image", git="reset")
    )
    test_env = evaluation_env(env, image_workspace=not workspace_tar)
    return TaskSpec(
        id=iid,
        pool=pool,
        image=instance_image(instance, image) if image else "",
        problem_statement=str(instance.get("problem_statement", "")),
        env=test_env,  # the episode's commands: the same environment as the tests' (an agent runs them too)
        workspace=workspace,
        evaluation=EvaluationSpec(
            test_command=command.replace("{test_files}", " ".join(shlex.quote(f) for f in test_files)),
            report_format=harness.report_format,
            id_match=harness.id_match,  # type: ignore[arg-type]  # one of ID_MATCHES, checked by the model
            env=test_env,
            test_patch=test_patch,
            test_files=[*test_files, *folder_globs_of_tests(test_files)],
            fail_to_pass=_id_list(instance.get("FAIL_TO_PASS"), "FAIL_TO_PASS", iid),
            pass_to_pass=_id_list(instance.get("PASS_TO_PASS"), "PASS_TO_PASS", iid),
        ),
        gold_patch=str(instance["patch"]) if instance.get("patch") else None,
        metadata={k: instance[k] for k in ("repo", "base_commit", "version", "created_at", "log_parser") if k in instance},
    )


# -- Multi-SWE-bench's own layout -------------------------------------------------------------------
def _loose_value(value: Any) -> Any:
    """A field Multi-SWE-bench writes as an object, JSON, or a Python literal in a string."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        pass
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value


def multiswebench_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """A Multi-SWE-bench record (``org``, ``repo``, ``number``, ``base.sha``, ``fix_patch``,
    ``test_patch``, ``f2p_tests``/``s2p_tests``/``n2p_tests``/``p2p_tests`` as maps from test name
    to outcomes) in SWE-bench's field names. Every test its harness requires to pass after the fix
    and not before (failed, skipped or absent before) is FAIL_TO_PASS; ``p2p_tests`` PASS_TO_PASS.
    Its test names are its harness's (Maven's test classes, for one). It carries no test command:
    its harness keeps one per repository."""
    org, repo = str(record.get("org") or ""), str(record.get("repo") or "")
    iid = str(record.get("instance_id") or (f"{org}__{repo}-{record.get('number')}" if org and repo else ""))
    if not iid:
        raise TaskError("Multi-SWE-bench record without instance_id (or org, repo and number)")
    base = _loose_value(record.get("base"))
    sha = str(base.get("sha") or "") if isinstance(base, dict) else ""
    if not sha or not record.get("fix_patch") or not record.get("test_patch"):
        raise TaskError(f"{iid}: a Multi-SWE-bench record needs base.sha, fix_patch and test_patch")
    tests: dict[str, list[str]] = {}
    for field_name in ("f2p_tests", "s2p_tests", "n2p_tests", "p2p_tests"):
        value = _loose_value(record.get(field_name)) or {}
        if not isinstance(value, dict):
            raise TaskError(f"{iid}: {field_name} must map test names to outcomes")
        tests[field_name] = sorted(str(k) for k in value)
    issues = _loose_value(record.get("resolved_issues")) or []
    statement = (
        "\n\n".join(f"{i.get('title', '')}\n\n{i.get('body') or ''}".strip() for i in issues if isinstance(i, dict))
        or f"{record.get('title', '')}\n\n{record.get('body') or ''}".strip()
    )
    return {
        "instance_id": iid,
        "repo": f"{org}/{repo}",
        "base_commit": sha,
        "patch": str(record["fix_patch"]),
        "test_patch": str(record["test_patch"]),
        "FAIL_TO_PASS": tests["f2p_tests"] + tests["s2p_tests"] + tests["n2p_tests"],
        "PASS_TO_PASS": tests["p2p_tests"],
        "problem_statement": statement,
        "log_parser": MULTI_SWE_BENCH,  # no command of its own: the caller gives one
    }


# Test files by the conventions of the languages SWE-smith covers (Python, Go, JavaScript and
# TypeScript, Rust, Java, ...).
TEST_FILE_GLOBS = (
    "**/test_*.py",
    "**/*_test.py",
    "**/*_test.go",
    "**/testdata/**",
    "**/*.test.*",
    "**/*.spec.*",
    "**/__tests__/**",
    "**/tests/**",
    "**/test/**",
    "**/*Test.java",
    "**/*Tests.java",
)


# SWE-smith publishes each image_name (``swesmith.x86_64.<owner>__<repo>.<commit>``) on Docker Hub
# under its user, with ``__`` written ``_1776_``.
SWESMITH_PUBLISHED_IMAGE = "jyangballin/{image_docker_id}:latest"


def _from_swesmith(
    instance: Mapping[str, Any],
    iid: str,
    pool: str,
    image: str,
    workspace_path: str,
    test_command: str,
    env: Mapping[str, str] | None,
    workspace_tar: str | None,
    report_format: str,
) -> TaskSpec:
    if not instance.get("patch"):
        raise TaskError(f"{iid}: a SWE-smith record needs its patch (the one that puts the bug in)")
    fail_to_pass = _id_list(instance.get("FAIL_TO_PASS"), "FAIL_TO_PASS", iid)
    if not fail_to_pass:
        raise TaskError(f"{iid}: missing FAIL_TO_PASS")
    test_files = list(dict.fromkeys(t.split("::", 1)[0] for t in fail_to_pass if "::" in t))
    fileless = any("::" not in t for t in fail_to_pass)
    if "{test_files}" in test_command and fileless:
        raise TaskError(
            f"{iid}: FAIL_TO_PASS has ids that name no file (not pytest's path::name, as SWE-smith's Go or "
            "JavaScript sets have): give a test command without {test_files} that runs them"
        )
    # Only the files of FAIL_TO_PASS run (SWE-smith's own test command): the PASS_TO_PASS tests
    # elsewhere would be missing from the report, which fails a test here (SWE-smith counts a
    # missing test as passed; a policy could make any test go missing).
    pass_to_pass = [
        t for t in _id_list(instance.get("PASS_TO_PASS"), "PASS_TO_PASS", iid) if fileless or t.split("::", 1)[0] in test_files
    ]
    # Ids that name no file (Go's, JavaScript's): every file named like a test, in any language,
    # is the tests' (restored before grading, the agent's own discarded).
    protected_tests = [*test_files, *folder_globs_of_tests(test_files), *(TEST_FILE_GLOBS if fileless else ())]
    bug = str(instance["patch"])
    try:
        gold: str | None = reverse_patch(bug.encode()).decode()
    except PatchError:
        gold = None  # a binary bug: validation says the task has no gold patch
    source: Literal["bundle", "image"] = "bundle" if workspace_tar else "image"
    if image == "field" and "/" not in str(instance.get("image_name") or "/"):
        image = SWESMITH_PUBLISHED_IMAGE  # its image_name has no registry part: the name it is published under
    test_env = evaluation_env(env, image_workspace=not workspace_tar)
    return TaskSpec(
        id=iid,
        pool=pool,
        image=instance_image(instance, image) if image else "",
        problem_statement=str(instance.get("problem_statement", "")),
        env={"PATH": test_env["PATH"]} if not workspace_tar else {},  # the episode's commands: the same
        workspace=WorkspaceSpec(path=workspace_path, source=source, tar=workspace_tar, git="reset", patch=bug),
        evaluation=EvaluationSpec(
            test_command=test_command.replace("{test_files}", " ".join(shlex.quote(f) for f in test_files)),
            report_format=report_format,
            env=test_env,
            test_files=protected_tests,
            fail_to_pass=fail_to_pass,
            pass_to_pass=pass_to_pass,
        ),
        gold_patch=gold,
        metadata={
            "variant": "swesmith",
            **{k: instance[k] for k in ("repo", "base_commit", "image_name", "created_at") if k in instance},
        },
    )


# -- R2E-Gym's own layout ---------------------------------------------------------------------------
# Its images hold the repository at /testbed at the commit before the fix, with its virtualenv
# inside (/testbed/.venv), and the hidden tests at /r2e_tests. R2E-Gym's own runtime only moves
# them to /root, where its root agent can still read them: here they travel in the task, only to
# the clean room, and the episode's setup deletes the image's copy. The runner is R2E-Gym's
# run_tests.sh, `.venv/bin/python -W ignore -m pytest -rA r2e_tests`, named by absolute path so
# the grader probes (and guards) the virtualenv's pytest.
R2E_TESTS_IN_IMAGE = "/r2e_tests"
R2E_TESTS = "r2e_tests"  # where the clean room gets them, in the workspace (R2E-Gym links them there)
R2E_VENV = ".venv"
R2E_TEST_COMMAND = "{workspace}/.venv/bin/python -W ignore -m pytest -rA -p no:cacheprovider r2e_tests"
_R2E_ISSUE = re.compile(r"\[ISSUE\](.*)\[/ISSUE\]", re.DOTALL)


def r2egym_instance_id(instance: Mapping[str, Any]) -> str:
    """An R2E-Gym record's id: its own ``instance_id``, else its repository and fix commit."""
    if instance.get("instance_id"):
        return str(instance["instance_id"])
    repo, commit = str(instance.get("repo_name") or ""), str(instance.get("commit_hash") or "")
    if not repo or not commit:
        raise TaskError("R2E-Gym record without instance_id, repo_name or commit_hash: cannot name its task")
    return f"{repo}__{commit[:12]}"


def top_level_names(source: str) -> set[str]:
    """The functions and classes a test module defines at its top level (what pytest collects)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):  # TestX = make_tests(...)
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def r2egym_test_ids(iid: str, expected: Mapping[str, str], tests: Mapping[str, str], folder: str = R2E_TESTS) -> list[str]:
    """pytest node ids of the tests R2E-Gym expects to pass. Its ids drop the file
    (``TestX.test_y[p]`` for ``r2e_tests/test_1.py::TestX::test_y[p]``: its log parser joins what
    follows the file with dots); each is found in the hidden test module that defines its first
    name, so it matches the report only there (a same-named test the agent adds elsewhere does not
    count). A name defined in several modules is expected in each."""
    modules = {path: top_level_names(text) for path, text in tests.items() if path.endswith(".py")}
    ids: list[str] = []
    for key, status in expected.items():
        if status != "PASSED" or not key:
            continue  # R2E-Gym expects some tests to fail even after the fix: they are not graded here
        head, bracket, params = key.partition("[")
        parts = head.split(".")
        where = sorted(path for path, names in modules.items() if parts[0] in names)
        if not where:
            raise TaskError(f"{iid}: the expected test {key!r} is defined in none of the image's {folder} files")
        ids.extend(f"{folder}/{path}::{'::'.join(parts)}{bracket}{params}" for path in where)
    return list(dict.fromkeys(ids))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def r2egym_log_outcomes(log: str) -> dict[str, str]:
    """R2E-Gym's reading of a ``pytest -rA`` log: its short summary's lines, by file-less test id."""
    outcomes: dict[str, str] = {}
    summary = False
    for raw in log.splitlines():
        line = _ANSI.sub("", raw)
        if "short test summary info" in line:
            summary = True
            continue
        if not summary:
            continue
        status = line.split(" ", 1)[0]
        if status in ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS") and "::" in line:
            outcomes[".".join(line.split(" ", 1)[1].split("::")[1:]).split(" - ")[0]] = status
    return outcomes


def r2egym_record_tests(instance: Mapping[str, Any]) -> dict[str, str]:
    """The test files an R2E-Gym record carries (``execution_result_content``'s
    ``test_file_names`` and ``test_file_codes``), by path below /r2e_tests."""
    execution = _r2egym_execution(instance)
    names, codes = execution.get("test_file_names") or [], execution.get("test_file_codes") or []
    if len(names) != len(codes) or not all(isinstance(x, str) for x in (*names, *codes)):
        return {}
    return {check_relative(n.removeprefix(f"{R2E_TESTS}/")): c for n, c in zip(names, codes, strict=True)}


def _r2egym_execution(instance: Mapping[str, Any]) -> dict[str, Any]:
    raw = instance.get("execution_result_content")
    try:
        execution = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {}
    return execution if isinstance(execution, dict) else {}


def from_r2egym(
    instance: Mapping[str, Any],
    tests: Mapping[str, str] | None = None,
    *,
    pool: str = "",
    image: str = "field",
    workspace_path: str = "/testbed",
    test_command: str = "",
    env: Mapping[str, str] | None = None,
) -> TaskSpec:
    """A task from an R2E-Gym record of its own layout (``docker_image``, ``expected_output_json``,
    the problem statement between ``[ISSUE]`` tags, ``execution_result_content`` with the test
    files and the logs of the tests before and after the fix) and ``tests``: its image's
    ``/r2e_tests`` (path below it -> text) when given, else the record's own test files.

    The episode runs in the record's image at ``/testbed``, whose history is reset (the fix is a
    later commit), with ``/r2e_tests`` deleted before the policy starts. The tests reach only the
    clean room, at ``r2e_tests/``, and run with the image's virtualenv, which is excluded from the
    workspace (``workspace.exclude``): never read for grading, never taken from the agent.
    Graded: the tests R2E-Gym expects to pass, each in its own module; those that passed before the
    fix too (its log of the old commit) are PASS_TO_PASS, the others FAIL_TO_PASS. Not carried over: R2E-Gym
    requires the tests it expects to fail to keep failing, and a missing test here fails (R2E-Gym
    only compares counts). No gold patch (R2E-Gym's is a parsed commit, not a diff)."""
    iid = r2egym_instance_id(instance)
    if "{test_files}" in test_command:
        test_command = ""  # a command for SWE-bench's layout (the CLI's default): R2E-Gym's own instead
    raw = instance.get("expected_output_json")
    try:
        expected = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        raise TaskError(f"{iid}: expected_output_json is not JSON") from None
    if not isinstance(expected, dict) or not all(isinstance(v, str) for v in expected.values()):
        raise TaskError(f"{iid}: expected_output_json must map test names to PASSED/FAILED/ERROR")
    tests = dict(tests) if tests else r2egym_record_tests(instance)
    if not tests:
        raise TaskError(
            f"{iid}: no test files in the record (execution_result_content): read them from its image's "
            f"{R2E_TESTS_IN_IMAGE} (rlsandbox tasks import-swebench --tests-from-image)"
        )
    before = r2egym_log_outcomes(str(_r2egym_execution(instance).get("old_commit_res_stdout") or ""))
    passing_before = {k for k, v in expected.items() if v == "PASSED" and before.get(k) == "PASSED"}
    fail_to_pass = r2egym_test_ids(iid, {k: v for k, v in expected.items() if k not in passing_before}, tests)
    pass_to_pass = r2egym_test_ids(iid, {k: expected[k] for k in passing_before}, tests)
    if not fail_to_pass:
        raise TaskError(f"{iid}: expected_output_json lists no test that the fix makes pass")
    statement = str(instance.get("problem_statement") or "")
    issue = _R2E_ISSUE.search(statement)
    test_env = evaluation_env(env, image_workspace=False)
    venv_path = f"{workspace_path}/{R2E_VENV}/bin:{DATASET_IMAGE_PATH.split(':', 2)[2]}"
    return TaskSpec(
        id=iid,
        pool=pool,
        image=instance_image({**instance, "instance_id": iid}, image) if not pool else "",
        problem_statement=(issue.group(1) if issue else statement).strip(),
        env={"PATH": venv_path},  # R2E-Gym's agents find the virtualenv's python first, as here
        # Its hidden tests (and any link or copy of them, and the runner script that names them).
        setup=[f"rm -rf {R2E_TESTS_IN_IMAGE} {R2E_TESTS} run_tests.sh"],
        # The image's, not the project's: its virtualenv; where the tests arrive in the clean room
        # and the runner script (what the agent puts there is never read).
        workspace=WorkspaceSpec(path=workspace_path, source="image", git="reset", exclude=[R2E_VENV, R2E_TESTS, "run_tests.sh"]),
        evaluation=EvaluationSpec(
            test_command=test_command or R2E_TEST_COMMAND.format(workspace=workspace_path),
            env=test_env,
            hidden_tests={f"{R2E_TESTS}/{p}": text for p, text in tests.items()},
            fail_to_pass=fail_to_pass,
            pass_to_pass=pass_to_pass,
        ),
        metadata={
            "variant": "r2e-gym",
            **{k: instance[k] for k in ("repo_name", "commit_hash", "docker_image") if k in instance},
        },
    )


# Fields that name an instance's own image in the published variants (R2E-Gym, SWE-smith, SWE-Gym).
IMAGE_FIELDS = ("image_name", "docker_image", "image")


def instance_image(instance: Mapping[str, Any], template: str) -> str:
    """The image of one instance: ``template`` with ``{instance_id}``, ``{docker_id}`` (SWE-bench's
    image naming: ``__`` becomes ``_1776_``, lower case), ``{swegym_id}`` (SWE-Gym's: ``_s_``) and
    ``{image_name}`` (the instance's own
    image field) filled in; or, with the template ``field``, the instance's own image field
    (``image_name``, ``docker_image`` or ``image``). SWE-smith's images on Docker Hub, for one:
    ``jyangballin/{image_name}`` with its ``__`` written ``_1776_``: ``{image_docker_id}``."""
    iid = str(instance.get("instance_id") or "")
    own = next((str(instance[name]) for name in IMAGE_FIELDS if instance.get(name)), "")
    if template == "field" or ("{image_" in template and not own):
        if own:
            return own
        raise TaskError(f"{iid}: no image field ({', '.join(IMAGE_FIELDS)}) in the instance")
    try:
        return template.format(
            instance_id=iid,
            docker_id=iid.replace("__", "_1776_").lower(),
            swegym_id=iid.replace("__", "_s_").lower(),
            image_name=own,
            image_docker_id=own.replace("__", "_1776_").lower(),
        )
    except (KeyError, IndexError, ValueError) as e:
        raise TaskError(
            f"image template {template!r}: {e} (use {{instance_id}}, {{docker_id}}, {{swegym_id}}, {{image_name}} or "
            "{image_docker_id}, or 'field')"
        ) from None


# -- Harbor / Terminal-Bench task folders --------------------------------------------------------
HARBOR_TESTS = ".rlsandbox-harbor-tests"  # where the clean room receives tests/ (then moved to /tests)
# Harbor's reward files, read by the daemon once the verifier and every process it started have
# ended (reward.policy "file": never by a command in the room, which the code under test could have
# replaced). Whatever is there that is not a number (a symlink, a FIFO, garbage, a huge file) scores
# 0.0: never an error, which would make the episode an invalid task, masked instead of penalised.
HARBOR_REWARD_FILES = ["/logs/verifier/reward.txt", "/logs/verifier/reward.json"]


@dataclass(frozen=True)
class HarborImage:
    """The image a Harbor task's ``environment/`` builds (``docker build`` of that folder)."""

    tag: str
    context: Path


def is_harbor_task(folder: Path) -> bool:
    return (folder / "task.toml").is_file() and (folder / "instruction.md").is_file()


def from_harbor(
    folder: Path, *, image_prefix: str = "rlsandbox-harbor", workdir: str = ""
) -> tuple[TaskSpec, HarborImage | None]:
    """A task from a Harbor (or migrated Terminal-Bench) task folder: ``instruction.md`` is the
    problem statement, ``environment/Dockerfile`` the image (tagged by its content; build it with
    ``rlsandbox tasks import-harbor --build``) unless ``task.toml`` names a ``docker_image``, and its
    last ``WORKDIR`` the workspace (default ``/app``). ``tests/`` reaches only the clean room, at
    ``/tests``, where ``bash /tests/test.sh`` runs with the verifier's timeout and environment,
    and the reward is what it writes to ``/logs/verifier/reward.txt`` (or ``reward.json``'s
    ``reward``): Harbor's convention, non-binary rewards included. ``solution/solve.sh`` is kept
    in the metadata (``solution_script``). Tests that need the network cannot run: clean rooms
    have none."""
    folder = folder.resolve()
    if not is_harbor_task(folder):
        raise TaskError(f"{folder}: not a Harbor task folder (task.toml and instruction.md are needed)")
    try:
        config = tomllib.loads((folder / "task.toml").read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise TaskError(f"{folder / 'task.toml'}: {e}") from None
    name = str((config.get("task") or {}).get("name") or folder.name)
    task_id = harbor_task_id(folder, name)
    verifier = config.get("verifier") or {}
    environment = config.get("environment") or {}
    tests_dir = folder / "tests"
    if not (tests_dir / "test.sh").is_file():
        raise TaskError(f"{folder}: tests/test.sh is missing (Harbor's verifier entry point)")
    hidden: dict[str, str] = {}
    for path in sorted(p for p in tests_dir.rglob("*") if p.is_file()):
        try:
            hidden[f"{HARBOR_TESTS}/{path.relative_to(tests_dir).as_posix()}"] = path.read_text()
        except UnicodeDecodeError:
            raise TaskError(f"{path}: binary test files are not supported (hidden tests are text)") from None
    image_build: HarborImage | None = None
    dockerfile = folder / "environment" / "Dockerfile"
    if environment.get("docker_image"):
        image = str(environment["docker_image"])
    elif dockerfile.is_file():
        image = harbor_image(folder, task_id, image_prefix)
        image_build = HarborImage(image, dockerfile.parent)
    else:
        raise TaskError(f"{folder}: no environment/Dockerfile and no [environment] docker_image in task.toml")
    workspace = workdir or (dockerfile_workdir(dockerfile.read_text()) if dockerfile.is_file() else "") or "/app"
    test_command = (
        f"rm -rf /tests /logs/verifier && mkdir -p /tests /logs/verifier && cp -a {HARBOR_TESTS}/. /tests/ "
        f"&& rm -rf {HARBOR_TESTS} && bash /tests/test.sh"
    )
    metadata: dict[str, Any] = {"format": "harbor", "source": str(folder)}
    for key in ("metadata", "agent", "environment"):
        if config.get(key):
            metadata[key] = config[key]
    solve = folder / "solution" / "solve.sh"
    if solve.is_file():
        metadata["solution_script"] = solve.read_text()
    spec = TaskSpec(
        id=task_id,
        image=image,
        problem_statement=(folder / "instruction.md").read_text(),
        workspace=WorkspaceSpec(path=workspace, source="image", git="keep"),
        evaluation=EvaluationSpec(
            test_command=test_command,
            report_format="exit-code",
            timeout=float(verifier.get("timeout_sec") or 600.0),
            env={str(k): str(v) for k, v in (verifier.get("env") or {}).items()},
            hidden_tests=hidden,
            # What the agent writes where the tests arrive is discarded (and reported as tampering).
            protected=[*DEFAULT_PROTECTED, f"{HARBOR_TESTS}/**", HARBOR_TESTS],
            reward=RewardSpec(policy="file", files=HARBOR_REWARD_FILES),
        ),
        metadata=metadata,
    )
    return spec, image_build
