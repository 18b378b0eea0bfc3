"""The task format, the SWE-bench importer, workspace diffs and reward policies (pure code)."""

from __future__ import annotations

import dataclasses
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from pydantic import ValidationError
from rlsandbox.daemon import cli
from rlsandbox.daemon.grading.importers import from_r2egym, from_swebench, patch_files, r2egym_log_outcomes, record_variant
from rlsandbox.daemon.grading.prepare import READ_AROUND_ENTRIES, Workspaces, _joined
from rlsandbox.daemon.grading.reports import Outcome, TestCase, TestReport
from rlsandbox.daemon.grading.rewards import (
    MISSING,
    GradedTest,
    TestGroup,
    cap_log,
    compute_reward,
    grade_tests,
    parse_command_reward,
    parse_reward_file,
)
from rlsandbox.daemon.grading.task import (
    DEFAULT_PROTECTED,
    EvaluationSpec,
    RewardSpec,
    Task,
    TaskError,
    TaskSpec,
    json_schema,
    load_tasks,
    matches,
)
from rlsandbox.daemon.grading.validate import RunOutcome, judge
from rlsandbox.daemon.grading.workspace import Entry, Snapshot, changes_tar, plan, snapshot_from_archive
from rlsandbox.daemon.model import FileStat

ROOT = Path(__file__).resolve().parent.parent.parent
TASKS = ROOT / "tests" / "fixtures" / "tasks"


def test_committed_schema_is_current() -> None:
    committed = json.loads((ROOT / "docs" / "task.schema.json").read_text())
    assert committed == json_schema(), "run: rlsandbox tasks schema --out docs/task.schema.json"


def test_sample_tasks_load_self_contained() -> None:
    tasks = {t.id: t for t in load_tasks(TASKS)}
    assert set(tasks) == {"py-calc", "node-strings", "node-mocha-slug", "node-jest-slug", "py-flaky", "py-broken", "py-textkit"}
    calc = tasks["py-calc"]
    assert calc.spec.workspace.dir is None and calc.spec.evaluation.hidden_tests_dir is None
    assert "tests/test_multiply.py" in calc.spec.evaluation.hidden_tests
    with tarfile.open(fileobj=io.BytesIO(calc.workspace_tar)) as tar:
        names = tar.getnames()
    assert "calc/__init__.py" in names and "tests/test_multiply.py" not in names
    # Round trip over the wire.
    again = Task.from_wire(calc.spec_json(), calc.workspace_tar)
    assert again.spec == calc.spec


def test_workspace_tarball_is_deterministic_and_skips_git(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / "__pycache__").mkdir()
    (ws / "a.py").write_text("x = 1\n")
    (tmp_path / "task.yaml").write_text("id: t\npool: python\nworkspace: {dir: ws}\nevaluation: {test_command: 'pytest -rA'}\n")
    first = load_tasks(tmp_path / "task.yaml")[0].workspace_tar
    (ws / "a.py").touch()  # a new mtime changes nothing
    assert load_tasks(tmp_path / "task.yaml")[0].workspace_tar == first
    with tarfile.open(fileobj=io.BytesIO(first)) as tar:
        assert tar.getnames() == ["a.py"]


@pytest.mark.parametrize(
    "doc,message",
    [
        ({"id": "t", "pool": "p"}, "evaluation: Field required"),
        ({"id": "t", "pool": "p", "evaluation": {"test_command": "x", "report_format": "nose"}}, "unknown report format 'nose'"),
        ({"id": "t", "pool": "p", "evaluation": {"test_command": "x", "hidden_tests": {"../x.py": ""}}}, "stay inside"),
        ({"id": "t", "pool": "p", "evaluation": {"test_command": "x", "reward": {"policy": "command"}}}, "needs reward.command"),
        ({"id": "t", "pool": "p", "evaluation": {"test_command": "x"}, "surprise": 1}, "surprise: Extra inputs"),
        ({"id": "t", "pool": "p", "workspace": {"path": "rel"}, "evaluation": {"test_command": "x"}}, "absolute path"),
    ],
)
def test_invalid_task_documents_say_what_is_wrong(doc: dict[str, object], message: str) -> None:
    with pytest.raises(TaskError, match=message):
        Task.from_wire(json.dumps(doc))


def test_file_references_are_refused_over_the_wire() -> None:
    doc = {"id": "t", "pool": "p", "workspace": {"dir": "/etc"}, "evaluation": {"test_command": "x"}}
    with pytest.raises(TaskError, match="file references"):
        Task.from_wire(json.dumps(doc))


def test_duplicate_ids_in_a_folder(tmp_path: Path) -> None:
    for n in (1, 2):
        (tmp_path / f"task{n}.json").write_text(
            json.dumps({"id": "same", "pool": "p", "workspace": {"source": "image"}, "evaluation": {"test_command": "x"}})
        )
    with pytest.raises(TaskError, match="appears twice"):
        load_tasks(tmp_path)


SWE = {
    "instance_id": "astropy__astropy-12907",
    "repo": "astropy/astropy",
    "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
    "problem_statement": "Modeling's separability_matrix does not compute separability correctly for nested CompoundModels",
    "patch": "diff --git a/astropy/modeling/separable.py b/astropy/modeling/separable.py\n--- a/astropy/modeling/separable.py\n"
    "+++ b/astropy/modeling/separable.py\n@@ -242,7 +242,7 @@\n-        cright[-right.shape[0]:, -right.shape[1]:] = 1\n"
    "+        cright[-right.shape[0]:, -right.shape[1]:] = right\n",
    "test_patch": "diff --git a/astropy/modeling/tests/test_separable.py b/astropy/modeling/tests/test_separable.py\n"
    "--- a/astropy/modeling/tests/test_separable.py\n+++ b/astropy/modeling/tests/test_separable.py\n@@ -28,6 +28,13 @@\n+x\n",
    "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]',
    "PASS_TO_PASS": ["astropy/modeling/tests/test_separable.py::test_coord_matrix"],
    "version": "4.3",
}


def test_swebench_import() -> None:
    spec = from_swebench(SWE, pool="astropy-4.3")
    assert spec.id == "astropy__astropy-12907" and spec.workspace.source == "image" and spec.workspace.path == "/testbed"
    ev = spec.evaluation
    assert ev.fail_to_pass == ["astropy/modeling/tests/test_separable.py::test_separable[compound_model6-result6]"]
    assert ev.pass_to_pass == ["astropy/modeling/tests/test_separable.py::test_coord_matrix"]
    assert ev.test_files == ["astropy/modeling/tests/test_separable.py", "astropy/modeling/tests/**"]
    assert ev.test_command.endswith("astropy/modeling/tests/test_separable.py")
    assert ev.test_patch == SWE["test_patch"] and spec.gold_patch == SWE["patch"]
    assert spec.metadata["base_commit"] == SWE["base_commit"]
    # The images' test environment is their conda env, activated only in bash's rc file.
    assert ev.env["PATH"].startswith("/opt/miniconda3/envs/testbed/bin:") and spec.env == {"PATH": ev.env["PATH"]}
    assert from_swebench(SWE, pool="p", env={"PATH": "/venv/bin"}).evaluation.env == {"PATH": "/venv/bin"}
    with pytest.raises(TaskError, match="not a JSON list"):
        from_swebench({**SWE, "FAIL_TO_PASS": "nope"}, pool="p")


DJANGO = {
    "instance_id": "django__django-11099",
    "repo": "django/django",
    "base_commit": "d26b2424437dabeeca94d7900b37d2df4410da0c",
    "problem_statement": "UsernameValidator allows trailing newline in usernames",
    "patch": "diff --git a/django/contrib/auth/validators.py b/django/contrib/auth/validators.py\n",
    "test_patch": "diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py\n"
    "--- a/tests/auth_tests/test_validators.py\n+++ b/tests/auth_tests/test_validators.py\n@@ -237,7 +237,7 @@\n+x\n",
    "FAIL_TO_PASS": '["test_ascii_validator (auth_tests.test_validators.UsernameValidatorsTests)"]',
    "PASS_TO_PASS": ["test_help_text (auth_tests.test_validators.UserAttributeSimilarityValidatorTest)"],
    "version": "3.0",
}


def test_a_django_instance_runs_djangos_runner_read_as_unittest() -> None:
    """As SWE-bench's harness runs them; the ids it lists ("t (module.Class)") are found in the
    report of unittest's output and of the unittest guard ("module.Class.t")."""
    from rlsandbox.daemon.grading.reports import Outcome, TestCase, TestReport, lookup

    ev = from_swebench(DJANGO, pool="django-3.0").evaluation
    assert ev.report_format == "unittest"
    assert ev.test_command == "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 auth_tests.test_validators"
    report = TestReport("guard", {"auth_tests.test_validators.UsernameValidatorsTests.test_ascii_validator": TestCase(
        "auth_tests.test_validators.UsernameValidatorsTests.test_ascii_validator", Outcome.PASSED)}, True)  # fmt: skip
    assert lookup(report, ev.fail_to_pass)[ev.fail_to_pass[0]] is not None
    # A command or a format of the caller's own stays theirs.
    assert from_swebench(DJANGO, pool="p", report_format="tap").evaluation.test_command.startswith("python -m pytest")
    own = from_swebench(DJANGO, pool="p", test_command="python tests/runtests.py {test_modules}").evaluation
    assert own.test_command == "python tests/runtests.py auth_tests.test_validators" and own.report_format == "pytest"


def test_swebench_import_with_one_image_per_instance() -> None:
    """SWE-bench names each instance's image (``__`` -> ``_1776_``); R2E-Gym and SWE-smith records
    carry it in a field. Either way the task names an image, and its pool is made on demand."""
    from rlsandbox.daemon.model import image_pool_name

    spec = from_swebench(SWE, image="swebench/sweb.eval.x86_64.{docker_id}:latest")
    assert spec.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest" and spec.pool == ""
    assert spec.pool_name == image_pool_name(spec.image) and Task.from_wire(spec.model_dump_json()).spec == spec
    r2e = {**SWE, "docker_image": "namanjain12/astropy_final:d16bfe05"}
    assert from_swebench(r2e, image="field").image == "namanjain12/astropy_final:d16bfe05"
    with pytest.raises(TaskError, match="no image field"):
        from_swebench(SWE, image="field")
    with pytest.raises(TaskError, match="image template"):
        from_swebench(SWE, image="x/{repo_name}")
    with pytest.raises(ValueError, match="exactly one of pool"):
        from_swebench(SWE, pool="p", image="x/{instance_id}")


# The layout of SWE-smith's published records (SWE-bench/SWE-smith on Hugging Face): no test patch,
# no fix; ``patch`` puts the bug in, the tests are the repository's own. Values made up.
SMITH = {
    "instance_id": "pallets__click.fde47b4b.func_pm_op_swap__4kq2f1xz",
    "repo": "swesmith/pallets__click.fde47b4b",
    "base_commit": "8d6b4b1a7c3e2f0a9b8c7d6e5f4a3b2c1d0e9f8a",
    "image_name": "swesmith.x86_64.pallets__click.fde47b4b",
    "problem_statement": "Formatting a long option name wraps at the wrong column.",
    "patch": "diff --git a/src/click/formatting.py b/src/click/formatting.py\nindex 1111111..2222222 100644\n"
    "--- a/src/click/formatting.py\n+++ b/src/click/formatting.py\n@@ -10,3 +10,3 @@ def wrap_text(\n"
    "     width: int = 78,\n-    return width - indent\n+    return indent - width\n \n",
    "FAIL_TO_PASS": ["tests/test_formatting.py::test_wrapping_long_options", "tests/test_basic.py::test_help"],
    "PASS_TO_PASS": [
        "tests/test_formatting.py::test_basic_functionality",
        "tests/test_basic.py::test_repr",
        "tests/test_options.py::test_prefixes",
    ],
    "created_at": "2025-03-14T19:58:21",
}


def test_swesmith_records_start_from_their_bug_and_are_fixed_by_its_reverse() -> None:
    assert record_variant(SMITH) == "swesmith" and record_variant(SWE) == "swebench"
    spec = from_swebench(SMITH, image="jyangballin/{image_docker_id}:latest")
    assert spec.image == "jyangballin/swesmith.x86_64.pallets_1776_click.fde47b4b:latest"
    assert spec.workspace.source == "image" and spec.workspace.git == "reset"
    assert spec.workspace.patch == SMITH["patch"]  # the bug, in place before the history is reset
    assert spec.gold_patch is not None and "+    return width - indent" in spec.gold_patch
    assert "-    return indent - width" in spec.gold_patch
    ev = spec.evaluation
    assert ev.test_patch is None and ev.fail_to_pass == SMITH["FAIL_TO_PASS"]
    assert ev.test_command == "python -m pytest -rA -p no:cacheprovider tests/test_formatting.py tests/test_basic.py"
    # Only the files that run are graded: a PASS_TO_PASS test elsewhere would be missing, a failure.
    assert ev.pass_to_pass == ["tests/test_formatting.py::test_basic_functionality", "tests/test_basic.py::test_repr"]
    assert ev.test_files == ["tests/test_formatting.py", "tests/test_basic.py", "tests/**"]
    assert spec.metadata["variant"] == "swesmith" and spec.metadata["image_name"] == SMITH["image_name"]
    assert from_swebench(SMITH, image="field").image == "jyangballin/swesmith.x86_64.pallets_1776_click.fde47b4b:latest"
    # The same record read as SWE-bench's layout says what it lacks.
    with pytest.raises(TaskError, match="missing test_patch"):
        from_swebench(SMITH, pool="p", variant="swebench")
    with pytest.raises(TaskError, match="unknown record variant"):
        from_swebench(SMITH, pool="p", variant="smith")
    go = {**SMITH, "FAIL_TO_PASS": ["TestWrap", "TestWrap/long"]}
    with pytest.raises(TaskError, match="name no file"):
        from_swebench(go, pool="p")
    go_ev = from_swebench(go, pool="p", test_command="go test -v ./...", report_format="go").evaluation
    assert go_ev.fail_to_pass == ["TestWrap", "TestWrap/long"] and go_ev.report_format == "go"
    assert matches("wrap/wrap_test.go", go_ev.test_files) and not matches("wrap/wrap.go", go_ev.test_files)
    assert go_ev.pass_to_pass == SMITH["PASS_TO_PASS"]  # all run: nothing to cut them to
    mixed = from_swebench({**SMITH, "FAIL_TO_PASS": ["tests/test_a.py::t", "TestWrap"]}, pool="p", test_command="make test")
    assert matches("tests/test_a.py", mixed.evaluation.test_files) and matches("x_test.go", mixed.evaluation.test_files)
    with pytest.raises(TaskError, match="needs its patch"):
        from_swebench({**SMITH, "patch": ""}, pool="p", variant="swesmith")


R2E_TEST_FILE = (
    "import pytest\nfrom pkg import f\n\n\ndef test_new():\n    assert f()\n\n\nclass TestOld:\n"
    "    @pytest.mark.parametrize('x', [1.5])\n    def test_p(self, x):\n        assert x\n\n\ndef test_flaky():\n    pass\n"
)
R2E = {
    "repo_name": "aiohttp",
    "commit_hash": "f0d74880" + "0" * 32,
    "docker_image": "namanjain12/aiohttp_final:f0d74880",
    "problem_statement": "Intro.\n[ISSUE]\nf() is wrong\n[/ISSUE]\nmore",
    # R2E-Gym's ids drop the file: its log parser joins what follows it with dots.
    "expected_output_json": json.dumps({"test_new": "PASSED", "TestOld.test_p[1.5]": "PASSED", "test_flaky": "FAILED"}),
    "execution_result_content": json.dumps(
        {
            "test_file_names": ["test_1.py"],
            "test_file_codes": [R2E_TEST_FILE],
            "old_commit_res_stdout": "=== short test summary info ===\n"
            "\x1b[32mPASSED\x1b[0m r2e_tests/test_1.py::TestOld::test_p[1.5]\n"
            "FAILED r2e_tests/test_1.py::test_new - AssertionError\n",
        }
    ),
}


def test_r2e_gym_records_of_their_own_layout_run_in_their_image_with_their_tests_hidden() -> None:
    assert record_variant(R2E) == "r2e-gym"
    spec = from_swebench(R2E, image="field")  # auto, R2E-Gym's test command over the SWE-bench default
    ev = spec.evaluation
    assert spec.id == "aiohttp__f0d748800000" and spec.image == R2E["docker_image"] and spec.problem_statement == "f() is wrong"
    # Each id found in the module that defines it; what passed before the fix too is PASS_TO_PASS;
    # what R2E-Gym expects to fail is not graded.
    assert ev.fail_to_pass == ["r2e_tests/test_1.py::test_new"]
    assert ev.pass_to_pass == ["r2e_tests/test_1.py::TestOld::test_p[1.5]"]
    assert ev.hidden_tests == {"r2e_tests/test_1.py": R2E_TEST_FILE}
    assert ev.test_command.startswith("/testbed/.venv/bin/python -W ignore -m pytest -rA")  # the venv's, probed by path
    assert spec.workspace.exclude == [".venv", "r2e_tests", "run_tests.sh"] and spec.workspace.git == "reset"
    assert spec.setup == ["rm -rf /r2e_tests r2e_tests run_tests.sh"]  # the image's copy: never the policy's to read
    assert spec.env["PATH"].startswith("/testbed/.venv/bin:") and spec.gold_patch is None
    assert from_swebench(R2E, pool="p", test_command="bash my_tests.sh").evaluation.test_command == "bash my_tests.sh"
    with pytest.raises(TaskError, match="defined in none"):
        from_r2egym({**R2E, "expected_output_json": json.dumps({"test_elsewhere": "PASSED"})})
    with pytest.raises(TaskError, match="--tests-from-image"):
        from_r2egym({**R2E, "execution_result_content": "{}"})
    with pytest.raises(TaskError, match="no test that the fix makes pass"):
        from_r2egym({**R2E, "expected_output_json": json.dumps({"TestOld.test_p[1.5]": "PASSED"})})
    # The image's own tests win over the record's when given; a name in two modules counts in each.
    two = from_r2egym(R2E, {"test_1.py": R2E_TEST_FILE, "sub/test_2.py": "def test_new():\n    pass\n"})
    assert two.evaluation.fail_to_pass == ["r2e_tests/sub/test_2.py::test_new", "r2e_tests/test_1.py::test_new"]
    assert r2egym_log_outcomes("PASSED a.py::t\n") == {}  # only the short summary counts


def test_workspace_exclude_is_plain_paths_below_the_workspace() -> None:
    ev = {"test_command": "true", "report_format": "exit-code"}
    ok = TaskSpec.model_validate({"id": "t", "pool": "p", "workspace": {"exclude": ["./.venv/", "a/b"]}, "evaluation": ev})
    assert ok.workspace.exclude == [".venv", "a/b"]
    assert ok.workspace.excluded(".venv/bin/python") and not ok.workspace.excluded(".venv2")
    for bad in ("../x", "/abs", "*.venv", ".", ".git", "a\nb"):
        with pytest.raises(ValidationError, match=r"exclude|relative"):
            TaskSpec.model_validate({"id": "t", "pool": "p", "workspace": {"exclude": [bad]}, "evaluation": ev})


def test_swegym_images_are_named_with_their_own_separator() -> None:
    spec = from_swebench(SWE, image="xingyaoww/sweb.eval.x86_64.{swegym_id}:latest")
    assert spec.image == "xingyaoww/sweb.eval.x86_64.astropy_s_astropy-12907:latest"
    with pytest.raises(TaskError, match="no image field"):
        from_swebench(SWE, image="x/{image_name}")


def test_swebench_import_from_a_local_clone_with_env(tmp_path: Path) -> None:
    """A repository at each instance's base commit (not an image), PYTHONPATH kept, no -rA needed."""
    repo = tmp_path / "repo"
    (repo / "src" / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "src" / "pkg" / "__init__.py").write_text("X = 1\n")
    (repo / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    base = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (repo / "src" / "pkg" / "__init__.py").write_text("X = 2  # the fix, later\n")
    subprocess.run([*git, "commit", "-qam", "fix"], check=True)
    instance = {**SWE, "instance_id": "org__pkg-1", "base_commit": base, "test_patch": SWE["test_patch"]}
    (tmp_path / "in.jsonl").write_text(json.dumps(instance) + "\n")
    out = tmp_path / "tasks" / "tasks.jsonl"
    out.parent.mkdir()
    code = cli.main(
        ["tasks", "import-swebench", str(tmp_path / "in.jsonl"), "--pool", "python", "--repo", str(repo),
         "--workspace", "/workspace", "--env", "PYTHONPATH=src", "--test-command", "python3 -m pytest {test_files}",
         "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    task = load_tasks(out)[0]
    assert task.spec.workspace.source == "bundle" and task.spec.evaluation.env == {"PYTHONPATH": "src"}
    assert task.spec.env == {"PYTHONPATH": "src"}  # the episode runs the tests too: the same environment
    assert task.spec.evaluation.test_command == "python3 -m pytest astropy/modeling/tests/test_separable.py"
    with tarfile.open(fileobj=io.BytesIO(task.workspace_tar)) as tar:
        assert tar.extractfile("src/pkg/__init__.py").read() == b"X = 1\n"  # type: ignore[union-attr]


def test_patch_files_include_deleted_and_new_files() -> None:
    patch = "--- a/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1 @@\n+y\n"
    assert patch_files(patch) == ["gone.py", "new.py"]


@pytest.mark.processes
def test_every_spelling_of_a_distribution_the_importer_finds_is_protected(tmp_path: Path) -> None:
    """importlib.metadata lists a folder as a distribution (its entry points: pytest's plugins)
    whatever the case of its .dist-info / .egg-info suffix: each spelling it finds, from any import
    root, is a protected path (issue 44, class 1: RLEvil-1.0.DIST-INFO loaded a plugin)."""
    import random

    rng = random.Random(7)
    spellings = [".dist-info", ".DIST-INFO", ".Dist-Info", ".egg-info", ".EGG-INFO"]
    spellings += ["".join(c.upper() if rng.random() < 0.5 else c for c in s) for s in (".dist-info", ".egg-info") * 6]
    roots = ["", "src/", "lib/deep/"]
    made = []
    for n, (suffix, root) in enumerate((s, r) for s in spellings for r in roots):
        folder = tmp_path / f"{root}Evil{n}-1.0{suffix}"
        folder.mkdir(parents=True)
        (folder / ("PKG-INFO" if "egg" in suffix.lower() else "METADATA")).write_text(f"Name: evil{n}\nVersion: 1.0\n")
        (folder / "entry_points.txt").write_text(f"[pytest11]\nevil{n} = evil_plugin\n")
        made.append((f"{root}Evil{n}-1.0{suffix}/entry_points.txt", f"evil{n}"))
    path = [str(tmp_path / r) for r in roots]
    found = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m, sys; sys.path[:0] = sys.argv[1:]; "
         "print('\\n'.join(e.name for e in m.entry_points(group='pytest11')))", *path],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for rel, name in made:
        assert name in found, (rel, "the importer does not find it: the test's premise is wrong")
        assert matches(rel, DEFAULT_PROTECTED), rel
    assert not matches("src/dist-info-notes/readme.txt", DEFAULT_PROTECTED)


def test_glob_matching() -> None:
    assert matches("conftest.py", ["**/conftest.py"]) and matches("a/b/conftest.py", ["**/conftest.py"])
    assert matches("x.dist-info/entry_points.txt", ["**/*.dist-info/**"])
    assert not matches("src/conftest_helpers.py", ["**/conftest.py"])


# -- workspace diffs -----------------------------------------------------------------------------
def snap(**files: str | None) -> Snapshot:
    entries = {}
    for name, content in files.items():
        path = name.replace("__", "/").replace("_DOT_", ".")
        entries[path] = Entry("dir", 0o755) if content is None else Entry("file", 0o644, content.encode())
    return Snapshot(entries)


def test_plan_keeps_source_changes_and_discards_test_changes() -> None:
    base = snap(src=None, src__m_DOT_py="a", tests=None, tests__t_DOT_py="t")
    agent = snap(src=None, src__m_DOT_py="b", src__new_DOT_py="n", tests=None, tests__t_DOT_py="hacked", conftest_DOT_py="c")
    changes = plan(base, agent, protected=["**/conftest.py"], test_files=["tests/**"], hidden=["tests/hidden.py"])
    assert set(changes.writes) == {"src/m.py", "src/new.py"}
    assert not changes.deletes
    assert any(d.startswith("tests/t.py") for d in changes.discarded)
    assert any(d.startswith("conftest.py") for d in changes.discarded)


def test_plan_deleting_a_test_folder_keeps_the_tests_and_their_data_and_deletes_the_rest() -> None:
    base = snap(tests=None, tests__t_DOT_py="t", tests__data_DOT_txt="d", old_DOT_py="o")
    agent = snap()
    changes = plan(base, agent, protected=[], test_files=["tests/t.py"], hidden=[])
    assert sorted(changes.deletes) == ["old.py"]
    assert any(d.startswith("tests/t.py: deleted") for d in changes.discarded)
    assert any(d.startswith("tests/data.txt: deleted (in a test folder") for d in changes.discarded)


def test_plan_refuses_a_symlink_in_place_of_a_folder_with_tests() -> None:
    base = snap(tests=None, tests__t_DOT_py="t")
    agent = Snapshot({"tests": Entry("symlink", 0o777, target="/usr/lib/python3")})
    changes = plan(base, agent, protected=[], test_files=["tests/**"], hidden=[])
    assert changes.empty
    assert any("replaces a folder" in d for d in changes.discarded)


def test_plan_type_change_deletes_first_and_binary_is_kept() -> None:
    base = snap(data="text")
    agent = Snapshot({"data": Entry("dir", 0o755), "data/blob.bin": Entry("file", 0o600, bytes(range(256)))})
    changes = plan(base, agent, protected=[], test_files=[], hidden=[])
    assert changes.deletes == ["data"]
    tar_bytes = changes_tar(changes.writes, {"tests/h.py": b"hidden"})
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        blob = tar.extractfile("data/blob.bin")
        assert blob is not None and blob.read() == bytes(range(256))
        assert tar.getmember("data/blob.bin").mode == 0o600
        assert tar.getnames().index("data") < tar.getnames().index("data/blob.bin")
        assert tar.extractfile("tests/h.py").read() == b"hidden"  # type: ignore[union-attr]


def test_excluded_paths_are_in_no_snapshot_and_their_folders_are_never_deleted() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("ws/a.py", "ws/.venv/bin/python", "ws/.venv2", "ws/lib/.venv/x"):
            info = tarfile.TarInfo(name)
            tar.addfile(info, io.BytesIO(b""))
    assert set(snapshot_from_archive(buf.getvalue(), [".venv", "lib/.venv"]).entries) == {"a.py", ".venv2"}
    # The agent deleted the folder that holds an excluded path: the clean room keeps it.
    base = snap(lib=None, lib__m_DOT_py="m")
    changes = plan(base, snap(), protected=[], test_files=[], hidden=[], kept=["lib/.venv"])
    assert changes.deletes == ["lib/m.py"]
    file_in_place = plan(
        base, Snapshot({"lib": Entry("file", 0o644, b"x")}), protected=[], test_files=[], hidden=[], kept=["lib/.venv"]
    )
    assert "lib" not in file_in_place.writes and any("replaces a folder" in d for d in file_in_place.discarded)


def test_an_archive_joined_around_excluded_paths_reads_like_the_engines() -> None:
    def one(name: str, data: bytes) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    joined = _joined("testbed", ["", "lib"], [("testbed/", one("a.py", b"a")), ("testbed/lib", one("m.py", b"m"))])
    snapshot = snapshot_from_archive(joined)
    assert snapshot.entries["a.py"].data == b"a" and snapshot.entries["lib/m.py"].data == b"m"
    assert snapshot.entries["lib"].type == "dir"


def test_snapshot_from_engine_archive_strips_the_folder_name_and_git() -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("workspace/a.py", b"a"), ("workspace/.git/HEAD", b"h")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("workspace/l")
        link.type = tarfile.SYMTYPE
        link.linkname = "a.py"
        tar.addfile(link)
    s = snapshot_from_archive(buf.getvalue())
    assert s.entries == {"a.py": Entry("file", 0o644, b"a"), "l": Entry("symlink", 0o644, target="a.py")}


# -- rewards -------------------------------------------------------------------------------------
def report(**outcomes: Outcome) -> TestReport:
    return TestReport("pytest", {k: TestCase(k, v) for k, v in outcomes.items()}, True)


EV = EvaluationSpec(test_command="x", fail_to_pass=["f1", "f2"], pass_to_pass=["p1"])


def test_missing_listed_tests_count_as_failed() -> None:
    tests = grade_tests(EV, report(f1=Outcome.PASSED, p1=Outcome.PASSED, extra=Outcome.FAILED))
    assert [(t.id, t.outcome, t.group) for t in tests] == [
        ("f1", "passed", TestGroup.FAIL_TO_PASS),
        ("f2", MISSING, TestGroup.FAIL_TO_PASS),
        ("p1", "passed", TestGroup.PASS_TO_PASS),
        ("extra", "failed", TestGroup.OTHER),
    ]
    assert compute_reward(RewardSpec(policy="resolved"), tests) == 0.0
    assert compute_reward(RewardSpec(policy="fraction"), tests) == pytest.approx(2 / 3)
    weighted = RewardSpec(policy="weighted", weights={"f2": 2.0}, default_weight=1.0)
    assert compute_reward(weighted, tests) == pytest.approx(2 / 4)


def test_resolved_needs_every_listed_test() -> None:
    tests = grade_tests(EV, report(f1=Outcome.PASSED, f2=Outcome.PASSED, p1=Outcome.PASSED, other=Outcome.FAILED))
    assert compute_reward(RewardSpec(), tests) == 1.0  # unlisted failures do not count


def test_without_lists_every_test_counts_and_nothing_is_zero() -> None:
    ev = EvaluationSpec(test_command="x")
    assert compute_reward(RewardSpec(), grade_tests(ev, report(a=Outcome.PASSED, b=Outcome.SKIPPED))) == 1.0
    assert compute_reward(RewardSpec(), grade_tests(ev, report(a=Outcome.PASSED, b=Outcome.ERROR))) == 0.0
    assert compute_reward(RewardSpec(), grade_tests(ev, report())) == 0.0


def test_junit_ids_match_node_ids() -> None:
    ev = EvaluationSpec(test_command="x {report}", report_format="junit", fail_to_pass=["tests/test_a.py::TestC::test_x[1-2]"])
    tests = grade_tests(ev, report(**{"tests.test_a.TestC::test_x[1-2]": Outcome.PASSED}))
    assert tests[0].outcome == "passed" and len(tests) == 1


def test_command_reward_parsing() -> None:
    assert parse_command_reward(b"computing...\n0.75\n") == 0.75
    for bad in (b"", b"nan\n", b"great\n"):
        with pytest.raises(ValueError):
            parse_command_reward(bad)


def test_a_reward_file_scores_what_was_written_and_anything_else_zero() -> None:
    assert parse_reward_file(b"0.75\n", False) == (0.75, "")
    assert parse_reward_file(b'{"reward": 1, "tests": 3}', True) == (1.0, "")
    for data, as_json in [
        (b"", False),
        (b"great\n", False),
        (b"nan", False),
        (b"inf", False),
        (b"1e999", False),
        (b"1.0" + b" " * (64 << 10), False),  # past the cap, even if it would parse
        (b"[1]", True),
        (b'{"score": 1}', True),
        (b'{"reward": "NaN"}', True),
        (b"\xff\xfe", True),
    ]:
        value, why = parse_reward_file(data, as_json)
        assert value == 0.0 and why, data[:20]


def test_a_file_reward_names_its_files_plainly() -> None:
    assert RewardSpec(policy="file", files=["/logs/verifier/reward.txt"]).files == ["/logs/verifier/reward.txt"]
    with pytest.raises(ValidationError, match=r"needs reward\.files"):
        RewardSpec(policy="file")
    for bad in ["", "/logs/../etc/passwd", "a\0b"]:
        with pytest.raises(ValidationError, match="not a plain path"):
            RewardSpec(policy="file", files=[bad])


def test_log_cap_keeps_head_and_tail() -> None:
    log = cap_log(b"H" * 100_000 + b"TAIL", b"")
    assert log.startswith(b"--- stdout ---\nHHH") and b"bytes cut" in log and log.rstrip().endswith(b"TAIL")
    assert len(log) < 40_000


def test_graded_test_passed_property() -> None:
    assert GradedTest("a", "passed", TestGroup.OTHER).passed and not GradedTest("a", MISSING, TestGroup.OTHER).passed


def test_owned_tar_gives_every_member_and_implied_folder_to_the_user() -> None:
    from rlsandbox.daemon.grading.task import tar_files
    from rlsandbox.daemon.grading.workspace import owned_tar

    owned = owned_tar(tar_files({"a.txt": "x", "pkg/sub/mod.py": "y"}), 1000, 1001)
    with tarfile.open(fileobj=io.BytesIO(owned)) as tar:
        members = {m.name: (m.isdir(), m.uid, m.gid) for m in tar}
        data = tar.extractfile("pkg/sub/mod.py").read()  # type: ignore[union-attr]
    assert members == {"a.txt": (False, 1000, 1001), "pkg": (True, 1000, 1001), "pkg/sub": (True, 1000, 1001),
                       "pkg/sub/mod.py": (False, 1000, 1001)}  # fmt: skip
    assert data == b"y"


def test_tar_files_adds_to_a_base_tarball() -> None:
    from rlsandbox.daemon.grading.task import tar_files

    grown = tar_files({"new.txt": "n"}, tar_files({"a.txt": "x", "pkg/mod.py": "y"}))
    with tarfile.open(fileobj=io.BytesIO(grown)) as tar:
        contents = {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]
    assert contents == {"a.txt": b"x", "pkg/mod.py": b"y", "new.txt": b"n"}


async def test_reset_workspaces_are_kept_within_their_budget_both_tarballs_counted() -> None:
    """The cache of reset task workspaces (grading/prepare.py) counts the task's tarball it holds
    as well as the reset one, drops the least recently used first, and remembers a workspace too
    big once reset (its next sessions reset git themselves, reading nothing)."""
    from types import SimpleNamespace

    from rlsandbox.daemon.grading.prepare import Workspaces
    from rlsandbox.daemon.model import ExecResult

    class Reader:  # stands in for a sandbox: what its `tar -c` of the workspace gives
        def __init__(self, out: bytes) -> None:
            self.out = out

        async def exec(self, req: object) -> ExecResult:
            cap = req.stdout_cap  # type: ignore[attr-defined]
            cut = len(self.out) > cap
            return ExecResult(0, None, False, self.out[:cap], b"", len(self.out), 0, cut, False, 0.0)

    ws = Workspaces(SimpleNamespace(), {}, based_budget=1000)  # type: ignore[arg-type]
    for i in range(3):
        await ws._keep_based(Reader(b"r" * 300), "/w", ("k", i), b"t" * 100)  # type: ignore[arg-type]
    assert list(ws._based) == [("k", 1), ("k", 2)] and ws._based_bytes == 800  # 3 x 400 > 1000
    await ws._keep_based(Reader(b"r" * 2000), "/w", ("big",), b"t" * 100)  # type: ignore[arg-type]
    assert ws._based[("big",)][1] == b"" and ws._based_bytes == 900  # known too big: only the task's tar
    assert list(ws._based) == [("k", 1), ("k", 2), ("big",)]


class _Engine:
    """The engine's archive call, counted: each path's tarball holds one file named after it."""

    def __init__(self) -> None:
        self.reads: list[str] = []

    async def get_archive(self, container_id: str, path: str, max_bytes: int) -> bytes:
        self.reads.append(path)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            name = path.rstrip("/").rsplit("/", 1)[1]
            tar.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
        return buf.getvalue()


class _Listed:
    """A root episode's sandbox (not trusted) whose agent lists ``names`` at any folder."""

    pool, container_id = "p", "c"

    def __init__(self, names: list[str]) -> None:
        self.names = names

    async def list_dir(self, path: str, *, max_entries: int) -> tuple[list[FileStat], bool]:
        entries = [FileStat(f"{path}/{n}", True, "file") for n in self.names]
        return entries[:max_entries], len(entries) > max_entries


async def test_reading_around_an_excluded_path_costs_a_bounded_number_of_engine_reads() -> None:
    """The engine reads each entry beside the virtualenv on its own; a policy that floods the
    workspace root with files (or an agent that lists `..`) gets one read of the whole, never one
    engine call per file."""
    engine = _Engine()
    workspaces = Workspaces(engine, {})  # type: ignore[arg-type]
    sandbox = _Listed(["a.py", ".venv", "..", "setup.py"])
    data = await workspaces.read(sandbox, "/testbed", 1 << 20, fresh=False, exclude=[".venv"])  # type: ignore[arg-type]
    assert engine.reads == ["/testbed/a.py", "/testbed/setup.py"]
    assert set(snapshot_from_archive(data).entries) == {"a.py", "setup.py"}
    engine.reads.clear()
    flood = _Listed([f"f{i}" for i in range(READ_AROUND_ENTRIES + 1)])
    await workspaces.read(flood, "/testbed", 1 << 20, fresh=False, exclude=[".venv"])  # type: ignore[arg-type]
    assert engine.reads == ["/testbed"]


def test_validation_flags_a_task_whose_tests_the_policy_can_change() -> None:
    """A task that names none of its tests (no test_files, test_patch or hidden tests) is graded by
    the workspace's own tests, which the policy may rewrite: not valid, however its runs went."""
    [task] = load_tasks(TASKS / "py-flaky")
    ev = task.spec.evaluation
    runs = [
        RunOutcome("empty", "ok", {**dict.fromkeys(ev.fail_to_pass, "failed"), **dict.fromkeys(ev.pass_to_pass, "passed")}),
        RunOutcome("gold", "ok", dict.fromkeys(ev.graded_ids, "passed")),
    ]
    assert judge(task, runs, exclude_flaky=False).verdict == "valid"
    bare = ev.model_copy(update={"test_files": [], "hidden_tests": {}, "hidden_tests_dir": None, "test_patch": None})
    unprotected = dataclasses.replace(task, spec=task.spec.model_copy(update={"evaluation": bare}))
    verdict = judge(unprotected, runs, exclude_flaky=False)
    assert verdict.verdict == "tests_unprotected" and not verdict.usable
    assert "can change the tests it is graded by" in verdict.problems[-1]
    # A reward command of the task's own decides what counts: its tests are not judged here.
    command = bare.model_copy(update={"reward": bare.reward.model_copy(update={"policy": "command", "command": "echo 1"})})
    own = dataclasses.replace(task, spec=task.spec.model_copy(update={"evaluation": command}))
    assert judge(own, runs, exclude_flaky=False).verdict == "valid"


def test_every_file_pytest_reads_its_configuration_from_is_protected_by_default() -> None:
    """The names come from the installed pytest (9 added pytest.toml): a name a later pytest adds
    fails this test instead of leaving a way to reconfigure the runner open."""
    from _pytest.config import findpaths

    names = [*getattr(findpaths, "CONFIG_LOADERS_BY_NAME", ()), "conftest.py"]
    assert {"pytest.ini", "pyproject.toml", "conftest.py"} <= set(names)
    for name in names:
        for path in (name, f"pkg/sub/{name}"):
            assert matches(path, list(DEFAULT_PROTECTED)), path
