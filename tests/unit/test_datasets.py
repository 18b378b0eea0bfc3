"""Real dataset records as published (../shared/datasets, read in place): every record imports
into a task that names the record's tests the way the record's own harness does, or is refused
with a message that says what to give. Field by field against the record: these repositories
cannot be had here (the round trip through a daemon is tests/integration/test_dataset_round_trip.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers import commit_all
from rlsandbox.daemon import cli
from rlsandbox.daemon.cli_tasks import read_records
from rlsandbox.daemon.errors import InvalidArgument
from rlsandbox.daemon.grading.importers import (
    eval_script_command,
    from_swebench,
    multiswebench_record,
    patch_files,
    record_harness,
)
from rlsandbox.daemon.grading.reports import Outcome, TestCase, TestReport, parse_gotest, parse_report, parse_tap
from rlsandbox.daemon.grading.rewards import compute_reward, grade_tests, id_match_note
from rlsandbox.daemon.grading.task import EvaluationSpec, RewardSpec, TaskError, load_tasks

ROOT = Path(__file__).resolve().parent.parent.parent
DATASETS = ROOT.parent / "shared" / "datasets"
SWEBENCH = DATASETS / "swe-bench"
pytestmark = pytest.mark.skipif(not DATASETS.is_dir(), reason=f"no shared dataset records beside the checkout ({DATASETS})")


def ids(value: Any) -> list[str]:
    return json.loads(value) if isinstance(value, str) else list(value)


def swebench_records() -> list[dict[str, Any]]:
    return [r for f in sorted(SWEBENCH.glob("*.jsonl")) for r in read_records(f)]


# -- reading the files as published ----------------------------------------------------------------
def test_parquet_is_read_as_published_and_holds_what_the_converted_sample_holds() -> None:
    """The Lite dev split as SWE-bench published it (Parquet: before, a UnicodeDecodeError), and
    the sample converted from it: the same records, field for field."""
    rows = read_records(SWEBENCH / "SWE-bench_Lite-dev.parquet")
    assert len(rows) == 23 and len({r["instance_id"] for r in rows}) == 23
    by_id = {r["instance_id"]: r for r in rows}
    sample = read_records(SWEBENCH / "SWE-bench_Lite-dev.sample.jsonl")
    assert len(sample) == 5
    for record in sample:
        assert by_id[record["instance_id"]] == record


def test_a_folder_of_dataset_files_and_unreadable_files_say_which_file_and_line(tmp_path: Path) -> None:
    assert len(read_records(SWEBENCH)) == 23 + 5 + 5 + 3  # the parquet and the three samples
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"instance_id": "a"}\n{oops\n')
    with pytest.raises(InvalidArgument, match=r"bad.jsonl:2: not a JSON line"):
        read_records(bad)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"PAR1 not really")
    with pytest.raises(InvalidArgument, match="not a readable Parquet file"):
        read_records(junk)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidArgument, match="without dataset files"):
        read_records(tmp_path / "empty")


# -- every record: imported as its harness grades it -----------------------------------------------
ALL_SWEBENCH = [*read_records(SWEBENCH / "SWE-bench_Lite-dev.parquet"), *swebench_records()] if DATASETS.is_dir() else []


@pytest.mark.parametrize("record", ALL_SWEBENCH, ids=lambda r: r["instance_id"])
def test_every_swebench_record_imports_field_by_field(record: dict[str, Any]) -> None:
    iid = record["instance_id"]
    if record["log_parser"] == "parse_log_maven":
        with pytest.raises(TaskError, match=r"parse_log_maven, which rlsandbox has no reader for yet.*--test-command"):
            from_swebench(record, image="swebench/sweb.eval.x86_64.{docker_id}:latest")
        return
    spec = from_swebench(record, image="swebench/sweb.eval.x86_64.{docker_id}:latest")
    ev = spec.evaluation
    assert spec.id == iid and spec.image == record["image"]  # the image the dataset publishes
    assert ev.fail_to_pass == ids(record["FAIL_TO_PASS"]) and ev.pass_to_pass == ids(record["PASS_TO_PASS"])
    assert ev.test_patch == record["test_patch"] and spec.gold_patch == record["patch"]
    assert spec.metadata["base_commit"] == record["base_commit"] and spec.metadata["log_parser"] == record["log_parser"]
    assert spec.problem_statement == record["problem_statement"]
    assert spec.workspace.source == "image" and spec.workspace.path == "/testbed"
    assert spec.env == ev.env  # the episode's commands get the tests' environment
    test_files = patch_files(record["test_patch"])
    assert all(f in ev.test_files for f in test_files)
    own = eval_script_command(record)
    if record["repo"] == "django/django":
        assert ev.report_format == "unittest" and ev.test_command.startswith("./tests/runtests.py")
    elif record["log_parser"] in ("parse_log_gotest", "parse_log_tap"):
        # Not Python: the record's own command (its `( ... ) | cat` taken off: it hid the exit code).
        assert ev.test_command == own and "| cat" not in ev.test_command and ev.id_match == "exact"
        assert ev.report_format == {"parse_log_gotest": "gotest", "parse_log_tap": "tap"}[record["log_parser"]]
    else:
        assert ev.report_format == "pytest" and ev.test_command.endswith(" ".join(test_files))
        assert all(f in own for f in test_files)  # the harness runs the same files (SymPy's with bin/test)
        assert ev.id_match == ("name" if record["repo"] == "sympy/sympy" else "first-word")


def test_the_cut_ids_of_the_records_are_matched_as_their_harness_matches_them() -> None:
    """SWE-bench's pytest parsers keep the first word of a result line, so a parametrized id with
    a space is listed cut (27 of the 300 Lite test records, 82 of 225 dev). Before, such a test
    was "missing": the gold patch could never score 1.0. Now the cut id stands for every reported
    test it begins, and passes only when all of them pass: never looser than the full id."""
    record = next(r for r in read_records(SWEBENCH / "SWE-bench_Lite-dev.sample.jsonl") if r["instance_id"].endswith("1359"))
    listed = ids(record["PASS_TO_PASS"])
    cut = [t for t in listed if t.endswith("-Missing") and "test_make_error" in t]
    assert cut == ["tests/test_fields.py::TestErrorMessages::test_make_error[required-Missing"]
    ev = from_swebench(record, pool="p").evaluation
    full = "tests/test_fields.py::TestErrorMessages::test_make_error[required-Missing data for required field.]"
    other = "tests/test_fields.py::TestErrorMessages::test_make_error[required-Missing other]"
    passing = {t: TestCase(t, Outcome.PASSED) for t in ev.graded_ids if t not in cut}
    report = TestReport("pytest", {**passing, full: TestCase(full, Outcome.PASSED)}, True)
    graded = grade_tests(ev, report)
    assert compute_reward(ev.reward, graded) == 1.0
    behind = next(t for t in graded if t.id == cut[0])
    assert behind.matched == (full,) and behind.outcome == "passed"
    assert "cut at the first space" in id_match_note(graded, ev.id_match) and not id_match_note(graded, "exact")
    # Two tests behind one cut id: one failing is a failure (SWE-bench's harness took the last line).
    report2 = TestReport("pytest", {**report.tests, other: TestCase(other, Outcome.FAILED)}, True)
    assert compute_reward(ev.reward, grade_tests(ev, report2)) == 0.0
    # A skip behind it is not a pass; and the full id is not taken for a longer one without a space.
    skipped = TestReport("pytest", {**report.tests, other: TestCase(other, Outcome.SKIPPED)}, True)
    assert compute_reward(ev.reward, grade_tests(ev, skipped)) == 0.0
    longer = full.replace("required-Missing data", "required-Missingdata")
    unrelated = TestReport("pytest", {**passing, longer: TestCase(longer, Outcome.PASSED)}, True)
    assert compute_reward(ev.reward, grade_tests(ev, unrelated)) == 0.0
    # Under exact matching (a task of one's own) nothing changes: the cut id is missing.
    exact = ev.model_copy(update={"id_match": "exact"})
    assert compute_reward(exact.reward, grade_tests(exact, report)) == 0.0


@pytest.mark.processes
def test_the_cut_ids_of_a_real_record_against_a_real_pytest_run(tmp_path: Path) -> None:
    """The marshmallow record's cut ids against what a real pytest -rA prints for the same
    parametrization (ids with spaces): the listed tests are all found, and pass."""
    record = next(r for r in read_records(SWEBENCH / "SWE-bench_Lite-dev.sample.jsonl") if r["instance_id"].endswith("1359"))
    cut = [t for t in ids(record["PASS_TO_PASS"]) if "test_make_error[" in t]
    assert len(cut) == 4
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_fields.py").write_text(
        textwrap.dedent(
            """
            import pytest

            class TestErrorMessages:
                @pytest.mark.parametrize(("key", "message"), [
                    ("required", "Missing data for required field."),
                    ("null", "Field may not be null."),
                    ("custom", "Custom error message."),
                    ("validator_failed", "Invalid value."),
                ])
                def test_make_error(self, key, message):
                    assert key and message
            """
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", "tests/test_fields.py"],
        cwd=tmp_path, capture_output=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )  # fmt: skip
    report = parse_report("pytest", run.stdout, exit_code=run.returncode)
    assert run.returncode == 0 and len(report.tests) == 4 and all(" " in t for t in report.tests)
    ev = EvaluationSpec(test_command="x", fail_to_pass=cut, id_match="first-word")
    graded = grade_tests(ev, report)
    assert [t.outcome for t in graded] == ["passed"] * 4 and compute_reward(RewardSpec(), graded) == 1.0
    assert sorted(m for t in graded for m in t.matched) == sorted(report.tests)


def test_the_harness_of_each_kind_of_record() -> None:
    records = {r["instance_id"]: r for r in swebench_records()}
    assert record_harness(records["sympy__sympy-20590"]).id_match == "name"
    go = record_harness(records["gin-gonic__gin-1805"])
    assert go.test_command == 'go test -v . -run "^Test.*Router"' and go.report_format == "gotest"
    tap = record_harness(records["axios__axios-4731"])
    assert tap.test_command == "npx mocha -R tap test/unit/adapters/http.js -g 'body length'" and tap.report_format == "tap"
    assert record_harness(records["google__gson-1014"]).test_command is None
    # A command of one's own for the Maven record: taken, read as the format given.
    own = from_swebench(records["google__gson-1014"], pool="java", test_command="mvn -q test; cp r.xml {report}",
                        report_format="junit")  # fmt: skip
    assert own.evaluation.report_format == "junit" and own.evaluation.fail_to_pass == records["google__gson-1014"]["FAIL_TO_PASS"]


def test_go_test_v_text_is_read_as_swebench_reads_it() -> None:
    """gin's record lists bare test names (``TestMiddlewareCalledOnceByRouterStaticFSNotFound``),
    as ``go test -v`` prints them; a test started and never finished is an error."""
    out = b"""=== RUN   TestRouterNotFound
--- PASS: TestRouterNotFound (0.00s)
=== RUN   TestMiddlewareCalledOnceByRouterStaticFSNotFound
    routes_test.go:470: wrong
--- FAIL: TestMiddlewareCalledOnceByRouterStaticFSNotFound (0.01s)
=== RUN   TestSub
=== RUN   TestSub/one
    --- SKIP: TestSub/one (0.00s)
--- PASS: TestSub (0.00s)
FAIL
FAIL\tgithub.com/gin-gonic/gin\t0.05s
"""
    report = parse_gotest(out)
    assert report.complete
    assert {k: v.outcome for k, v in report.tests.items()} == {
        "TestRouterNotFound": Outcome.PASSED,
        "TestMiddlewareCalledOnceByRouterStaticFSNotFound": Outcome.FAILED,
        "TestSub/one": Outcome.SKIPPED,
        "TestSub": Outcome.PASSED,
    }
    cut = parse_gotest(b"=== RUN   TestA\n--- PASS: TestA (0.00s)\n=== RUN   TestB\n")
    assert not cut.complete and cut.tests["TestB"].outcome is Outcome.ERROR


def test_mochas_tap_titles_are_the_records_ids() -> None:
    record = next(r for r in swebench_records() if r["instance_id"] == "axios__axios-4731")
    title = record["FAIL_TO_PASS"][0]
    report = parse_tap(f"1..2\nok 1 {title}\nnot ok 2 supports http with nodejs should other\n".encode())
    ev = from_swebench(record, pool="node").evaluation
    graded = grade_tests(ev, report)
    assert [(t.id, t.outcome) for t in graded][:1] == [(title, "passed")]


# -- Multi-SWE-bench and SWE-smith ------------------------------------------------------------------
def test_multiswebench_records_import_and_say_what_they_lack() -> None:
    """Its own layout (before: "missing FAIL_TO_PASS", no hint). Fields written as Python
    literals in strings are read; every test the fix must make pass (failed, skipped or absent
    before) is FAIL_TO_PASS; its test names are JUnit classes."""
    records = read_records(DATASETS / "multi-swe-bench" / "google__gson_dataset.first3.jsonl")
    assert [r["instance_id"] for r in records] == ["google__gson-1787", "google__gson-1703", "google__gson-1555"]
    for record in records:
        with pytest.raises(TaskError, match=r"carries no test command.*--test-command"):
            from_swebench(record, pool="java")
        spec = from_swebench(record, pool="java", test_command="mvn -q test && cat target/surefire-reports/*.xml > {report}")
        ev = spec.evaluation
        plain = multiswebench_record(record)
        assert spec.id == record["instance_id"] and spec.metadata["base_commit"] == record["base"]["sha"]
        assert spec.gold_patch == record["fix_patch"] and ev.test_patch == record["test_patch"]
        assert ev.report_format == "junit" and ev.id_match == "class"
        assert ev.fail_to_pass == plain["FAIL_TO_PASS"] and ev.fail_to_pass
        assert spec.problem_statement
    first = multiswebench_record(records[0])
    assert "com.google.gson.typeadapters.PostConstructAdapterFactoryTest" in first["FAIL_TO_PASS"]  # an n2p test
    # A class passes only when every one of its tests does.
    ev = from_swebench(records[0], pool="java", test_command="x {report}").evaluation
    cls = "com.google.gson.typeadapters.PostConstructAdapterFactoryTest"
    cases = {f"{c}::t": TestCase(f"{c}::t", Outcome.PASSED) for c in ev.graded_ids}
    assert compute_reward(ev.reward, grade_tests(ev, TestReport("junit", cases, True))) == 1.0
    cases[f"{cls}::t2"] = TestCase(f"{cls}::t2", Outcome.FAILED)
    assert compute_reward(ev.reward, grade_tests(ev, TestReport("junit", cases, True))) == 0.0


def test_the_swesmith_record_names_its_published_image() -> None:
    record = read_records(DATASETS / "swe-smith" / "pandas-dev__pandas.95280573.pr_53652.json")[0]
    spec = from_swebench(record, image="field")
    assert spec.image == "jyangballin/swesmith.x86_64.pandas-dev_1776_pandas.95280573:latest"
    assert spec.evaluation.fail_to_pass == record["FAIL_TO_PASS"] and spec.workspace.patch == record["patch"]
    assert spec.gold_patch and spec.metadata["image_name"] == record["image_name"]


# -- the command line as a new user runs it ---------------------------------------------------------
def test_import_with_a_relative_out_and_a_clone_and_nothing_left_when_it_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--repo`` with a relative ``--out`` (before: "could not open 'rel.workspaces/...tar'",
    empty files left behind); the workspace goes where the pools' images keep it (/workspace);
    a run that fails leaves no file of its own."""
    repo = tmp_path / "clone"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "m.py").write_text("X = 1\n")
    base = commit_all(repo)
    record = next(r for r in read_records(SWEBENCH / "SWE-bench_Lite-dev.sample.jsonl") if r["instance_id"].endswith("1359"))
    (tmp_path / "in.jsonl").write_text(json.dumps({**record, "base_commit": base}) + "\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    argv = ["tasks", "import-swebench", "../in.jsonl", "--pool", "python", "--repo", "../clone", "--env", "PYTHONPATH=src"]
    assert cli.main([*argv, "--out", "rel.jsonl"]) == 0
    task = load_tasks(work / "rel.jsonl")[0]
    assert task.spec.workspace.path == "/workspace" and task.spec.env == {"PYTHONPATH": "src"}
    assert task.workspace_tar and (work / "rel.workspaces").is_dir()
    # A record whose base commit the clone lacks: an error, and nothing of this run left.
    (tmp_path / "in.jsonl").write_text(json.dumps({**record, "base_commit": "0" * 40}) + "\n")
    assert cli.main([*argv, "--out", "other.jsonl"]) != 0
    assert "git archive" in capsys.readouterr().err
    assert sorted(p.name for p in work.iterdir()) == ["rel.jsonl", "rel.workspaces"]
    assert cli.main([*argv[:-2], "--repo", "../in.jsonl", "--out", "x.jsonl"]) != 0  # not a clone
    assert "not a git clone" in capsys.readouterr().err


def test_import_a_parquet_file_from_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "lite-dev.jsonl"
    assert cli.main(["tasks", "import-swebench", str(SWEBENCH / "SWE-bench_Lite-dev.parquet"), "--image",
                     "swebench/sweb.eval.x86_64.{docker_id}:latest", "--out", str(out)]) == 0  # fmt: skip
    tasks = load_tasks(out)
    assert len(tasks) == 23 and all(t.spec.evaluation.id_match == "first-word" for t in tasks)


def test_a_record_that_cannot_be_imported_is_skipped_and_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One bad record among good ones (a line that is not JSON, a record without tests): the rest
    are imported and each skipped one is named with its reason; --strict stops at the first."""
    good = [r for r in read_records(SWEBENCH / "SWE-bench_Lite-dev.sample.jsonl")][:2]
    bad = {**good[0], "instance_id": "broken__record-1", "FAIL_TO_PASS": "[oops"}
    lines = [json.dumps(good[0]), "{not json", json.dumps(bad), json.dumps(good[1])]
    (tmp_path / "in.jsonl").write_text("\n".join(lines) + "\n")
    argv = ["tasks", "import-swebench", str(tmp_path / "in.jsonl"), "--image", "x/{instance_id}"]
    assert cli.main([*argv, "--out", str(tmp_path / "out.jsonl")]) == 0
    err = capsys.readouterr().err
    assert [t.spec.id for t in load_tasks(tmp_path / "out.jsonl")] == [good[0]["instance_id"], good[1]["instance_id"]]
    assert "in.jsonl:2: not a JSON line" in err and "skipped broken__record-1" in err, err
    assert "2 task(s) imported, 2 record(s) skipped" in err, err
    assert cli.main([*argv, "--strict", "--out", str(tmp_path / "strict.jsonl")]) != 0
    assert "in.jsonl:2" in capsys.readouterr().err and not (tmp_path / "strict.jsonl").exists()
