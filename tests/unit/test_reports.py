"""The report parsers on real outputs of each tool (tests/fixtures/reports/README.md says how each was made)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rlsandbox.daemon.grading.reports import REPORT_FORMATS, Outcome, canonical_id, lookup, parse_report

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "reports"
P, F, E, S = Outcome.PASSED, Outcome.FAILED, Outcome.ERROR, Outcome.SKIPPED

PYTEST_CALC = {
    "tests/test_calc.py::test_add": P,
    "tests/test_calc.py::test_add_wrong": F,
    "tests/test_calc.py::test_param[1-1-2]": P,
    "tests/test_calc.py::test_param[2-3-6]": F,
    "tests/test_calc.py::test_param[\\xe9-\\xfc-\\xe9\\xfc]": P,
    "tests/test_calc.py::test_param[x y-/z-x y/z]": P,
    "tests/test_calc.py::TestGroup::test_in_class": P,
    "tests/test_calc.py::TestGroup::test_ünïcode_name": P,
    "tests/test_calc.py::test_xfail": S,
    "tests/test_calc.py::test_fixture_error": E,
}


def outcomes(fmt: str, name: str, **kw: object) -> dict[str, Outcome]:
    report = parse_report(fmt, (FIXTURES / name).read_bytes(), **kw)  # type: ignore[arg-type]
    assert report.complete, report.problems
    return {k: v.outcome for k, v in report.tests.items()}


@pytest.mark.parametrize("name", ["pytest7-rA.txt", "pytest9-rA.txt"])
def test_pytest_summary_lines(name: str) -> None:
    assert outcomes("pytest", name) == PYTEST_CALC


@pytest.mark.parametrize("name", ["pytest7-junit.xml", "pytest9-junit.xml"])
def test_junit_from_pytest_matches_node_ids(name: str) -> None:
    report = parse_report("junit", (FIXTURES / name).read_bytes())
    assert report.complete
    found = lookup(report, PYTEST_CALC)
    assert {k: (v.outcome if v else None) for k, v in found.items()} == PYTEST_CALC
    # The skipped test has no node id in -rA's summary (pytest prints its location only).
    assert report.tests["tests.test_calc::test_skipped"].outcome is S
    assert "assert 4 == 5" in report.tests["tests.test_calc::test_add_wrong"].message


def test_pytest_crash_mid_run_keeps_what_finished_and_says_incomplete() -> None:
    report = parse_report("pytest", (FIXTURES / "pytest7-crash-v.txt").read_bytes(), exit_code=3)
    assert not report.complete
    assert {k: v.outcome for k, v in report.tests.items()} == {"tests/test_crash.py::test_before_crash": P}


def test_pytest_worst_outcome_wins() -> None:
    text = b"PASSED t.py::a\nERROR t.py::a - teardown failed\n==== 1 passed, 1 error in 0.1s ====\n"
    assert parse_report("pytest", text).tests["t.py::a"].outcome is E


def test_truncated_junit_keeps_complete_test_cases() -> None:
    data = (FIXTURES / "pytest7-junit.xml").read_bytes()
    cut = data[: data.index(b"test_param[x y")]
    report = parse_report("junit", cut)
    assert not report.complete
    assert report.tests["tests.test_calc::test_add"].outcome is P
    assert report.tests["tests.test_calc::test_add_wrong"].outcome is F
    assert "tests.test_calc.TestGroup::test_in_class" not in report.tests


def test_junit_refuses_entities() -> None:
    bomb = b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaa">]><testsuite><testcase name="t">&a;</testcase></testsuite>'
    report = parse_report("junit", bomb)
    assert not report.complete and not report.tests


def test_unittest_verbose() -> None:
    assert outcomes("unittest", "unittest-v.txt") == {
        "test_ut.CalcTest.test_error": E,
        "test_ut.CalcTest.test_expected_failure": S,
        "test_ut.CalcTest.test_fail": F,
        "test_ut.CalcTest.test_noisy": P,  # its own stderr output split the "... ok" line
        "test_ut.CalcTest.test_ok": P,
        "test_ut.CalcTest.test_skip": S,
        "test_ut.CalcTest.test_subtests": F,  # one failing sub-test fails the test
        "test_ut.CalcTest.test_ünicode": P,
    }


def test_unittest_truncated_is_incomplete() -> None:
    data = (FIXTURES / "unittest-v.txt").read_bytes()
    report = parse_report("unittest", data[: data.index(b"test_ok")])
    assert not report.complete
    assert report.tests["test_ut.CalcTest.test_fail"].outcome is F


@pytest.mark.parametrize(
    "name,broken", [("node-tap.txt", "/fx/node/test/broken.test.js"), ("node20-tap.txt", "/tmp/fx/node/test/broken.test.js")]
)
def test_node_tap(name: str, broken: str) -> None:
    assert outcomes("tap", name) == {
        broken: F,  # the file failed to load: reported as a failed test of its own
        "adds": P,
        "fails": F,
        "skipped one": S,
        "later": S,
        "group > nested ok": P,
        "group > nested ünïcode # not a directive": F,  # an escaped '#' is part of the name
    }


def test_tap_truncated_is_incomplete() -> None:
    data = (FIXTURES / "node-tap.txt").read_bytes()
    report = parse_report("tap", data[: data.index(b"# Subtest: group")])
    assert not report.complete
    assert report.tests["fails"].outcome is F and "group > nested ok" not in report.tests


@pytest.mark.parametrize("fmt,name,prefix", [("jest", "jest.json", "src"), ("vitest", "vitest.json", "vsrc")])
def test_jest_and_vitest_json(fmt: str, name: str, prefix: str) -> None:
    assert outcomes(fmt, name, root="/tmp/jsfix") == {
        f"{prefix}/calc.test.js > calc > adds": P,
        f"{prefix}/calc.test.js > calc > fails": F,
        f"{prefix}/calc.test.js > calc > skipped": S,
        f"{prefix}/calc.test.js > calc > todo later": S,
        f"{prefix}/calc.test.js > calc > nested ünïcode > add(1, 1) = 2": P,
        f"{prefix}/calc.test.js > calc > nested ünïcode > add(2, 2) = 5": F,
        f"{prefix}/calc.test.js > top level": P,
        f"{prefix}/broken.test.js": E,  # the suite failed to run
    }


def test_jest_truncated() -> None:
    data = (FIXTURES / "jest.json").read_bytes()
    report = parse_report("jest", data[: len(data) // 2])
    assert not report.complete and not report.tests


def test_go_test_json() -> None:
    assert outcomes("go", "go-test.jsonl") == {
        "example.com/fx/broken": E,  # build failed: a plain text line in go test's stdout
        "example.com/fx/calc/TestAdd": P,
        "example.com/fx/calc/TestFail": F,
        "example.com/fx/calc/TestSkip": S,
        "example.com/fx/calc/TestTable": F,
        "example.com/fx/calc/TestTable/one_plus_one": P,
        "example.com/fx/calc/TestTable/two/two": F,
        "example.com/fx/panics/TestOK": P,
        "example.com/fx/panics/TestPanic": F,
    }


def test_go_truncated_marks_running_tests() -> None:
    lines = (FIXTURES / "go-test.jsonl").read_bytes().splitlines(keepends=True)
    cut = b"".join(line for line in lines if b'"TestAdd"' not in line or b'"run"' in line)
    report = parse_report("go", cut)
    assert not report.complete
    assert report.tests["example.com/fx/calc/TestAdd"].outcome is E


def test_exit_code() -> None:
    assert parse_report("exit-code", b"", exit_code=0).tests["exit_code"].outcome is P
    assert parse_report("exit-code", b"", exit_code=1).tests["exit_code"].outcome is F
    assert parse_report("exit-code", b"", exit_code=None).tests["exit_code"].outcome is E


def test_unknown_format_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"unknown report format 'nose'.*pytest"):
        parse_report("nose", b"")


def test_canonical_ids() -> None:
    assert canonical_id("tests/test_a.py::C::t[a/b.py::x]") == "tests.test_a.C.t[a/b.py::x]"
    assert canonical_id("tests.test_a.C::t[a/b.py::x]") == "tests.test_a.C.t[a/b.py::x]"
    # unittest's own spelling, before and since Python 3.11, and SWE-bench's for Django's tests
    assert canonical_id("test_x (auth_tests.test_a.C)") == canonical_id("test_x (auth_tests.test_a.C.test_x)")
    assert canonical_id("test_x (auth_tests.test_a.C)") == "auth_tests.test_a.C.test_x"


@pytest.mark.parametrize("fmt", sorted(REPORT_FORMATS))
@given(data=st.binary(max_size=2000))
def test_parsers_never_raise_on_garbage(fmt: str, data: bytes) -> None:
    report = parse_report(fmt, data, exit_code=1)
    assert all(t.id for t in report.tests.values())
