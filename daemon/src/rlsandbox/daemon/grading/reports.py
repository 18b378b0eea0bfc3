"""Test report parsers: pure functions from a test tool's output to per-test outcomes.

Every parser takes the bytes a tool wrote (report file or captured output) and returns a
``TestReport``. Output is untrusted (the agent's code runs inside the test process), so parsers
never raise on malformed input: what cannot be read is left out and the report is marked
incomplete. A test that appears twice keeps its worst outcome (pytest prints a test that passed
and then errored in teardown on two lines).

Formats (``REPORT_FORMATS``):

- ``pytest``: the text of ``pytest -rA`` (short summary lines) and/or ``-v`` (progress lines); ids
  are pytest node ids (``tests/test_x.py::TestC::test_y[param]``).
- ``junit`` (alias ``pytest-junit``): JUnit XML; ids are ``classname::name``, and match pytest node ids
  through ``canonical_id``.
- ``unittest``: ``python -m unittest -v`` (its stderr); ids are ``module.Class.test``.
- ``tap``: TAP 13/14, as written by ``node --test --test-reporter=tap``; ids join nested test names
  with `` > ``; only leaf tests count.
- ``jest`` (alias ``vitest``): Jest's ``--json`` (Vitest's json reporter writes the same shape); ids
  are ``file > ancestors > title`` with the file relative to ``root``.
- ``go``: ``go test -json``; ids are ``package/TestName[/subtest]``.
- ``gotest``: the text of ``go test -v`` (``--- PASS: TestName (0.00s)`` lines), as SWE-bench
  Multilingual's harness reads it; ids are ``TestName[/subtest]`` (no package).
- ``exit-code``: one pseudo-test ``exit_code`` that passed when the command exited 0.
"""

from __future__ import annotations

import enum
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

MAX_REPORT_BYTES = 32 << 20


class Outcome(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Outcome.SKIPPED: 0, Outcome.PASSED: 1, Outcome.FAILED: 2, Outcome.ERROR: 3}


@dataclass(frozen=True, slots=True)
class TestCase:
    __test__ = False  # a domain name, not a pytest test class
    id: str
    outcome: Outcome
    message: str = ""
    duration: float | None = None


@dataclass(frozen=True, slots=True)
class TestReport:
    __test__ = False  # a domain name, not a pytest test class
    format: str
    tests: dict[str, TestCase]
    complete: bool
    problems: tuple[str, ...] = ()

    def count(self, outcome: Outcome) -> int:
        return sum(1 for t in self.tests.values() if t.outcome is outcome)

    @property
    def any_failed(self) -> bool:
        return any(t.outcome in (Outcome.FAILED, Outcome.ERROR) for t in self.tests.values())


@dataclass(slots=True)
class _Builder:
    format: str
    tests: dict[str, TestCase] = field(default_factory=dict)
    complete: bool = True
    problems: list[str] = field(default_factory=list)

    def add(self, test_id: str, outcome: Outcome, message: str = "", duration: float | None = None) -> None:
        test_id = test_id.strip()
        if not test_id:
            return
        old = self.tests.get(test_id)
        if old is None or outcome.rank > old.outcome.rank:
            self.tests[test_id] = TestCase(test_id, outcome, message[:2000], duration)

    def build(self) -> TestReport:
        return TestReport(self.format, dict(self.tests), self.complete, tuple(self.problems))


def _text(data: bytes) -> str:
    return data[:MAX_REPORT_BYTES].decode("utf-8", errors="replace")


# -- pytest ---------------------------------------------------------------------------------------
_PYTEST_SUMMARY = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (\S.*?)(?: - (.*))?$")
_PYTEST_VERBOSE = re.compile(r"^(\S+::\S.*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)(?: \(.*\))?\s*(?:\[\s*\d+%\])?$")
_PYTEST_FINAL = re.compile(
    r"^=+ .*\b(passed|failed|error|errors|skipped|deselected|xfailed|xpassed|no tests ran)\b.* in [\d.]+s.* =+$"
)
_PYTEST_MAP = {
    "PASSED": Outcome.PASSED,
    "FAILED": Outcome.FAILED,
    "ERROR": Outcome.ERROR,
    "SKIPPED": Outcome.SKIPPED,
    "XFAIL": Outcome.SKIPPED,  # an expected failure is not a pass of the test
    "XPASS": Outcome.PASSED,  # strict xfail turns this into FAILED, which pytest prints as such
}


def parse_pytest(data: bytes, exit_code: int | None = None) -> TestReport:
    b = _Builder("pytest", complete=False)
    for raw in _text(data).splitlines():
        line = raw.rstrip()
        if m := _PYTEST_SUMMARY.match(line):
            b.add(m.group(2), _PYTEST_MAP[m.group(1)], m.group(3) or "")
        elif m := _PYTEST_VERBOSE.match(line):
            b.add(m.group(1), _PYTEST_MAP[m.group(2)])
        elif _PYTEST_FINAL.match(line):
            b.complete = True
    if not b.complete:
        b.problems.append("no final pytest summary line: the run was cut short or the output truncated")
    return b.build()


# -- JUnit XML ------------------------------------------------------------------------------------
def parse_junit(data: bytes, exit_code: int | None = None) -> TestReport:
    b = _Builder("junit")
    data = data[:MAX_REPORT_BYTES]
    if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
        b.complete = False
        b.problems.append("JUnit XML with a DOCTYPE or entities is refused")
        return b.build()
    parser: Any = ET.XMLPullParser(events=("end",))  # typeshed's event types are too loose to use
    try:
        parser.feed(data)
        parser.close()
    except ET.ParseError as e:
        b.complete = False
        b.problems.append(f"JUnit XML is malformed or truncated ({e}); kept the test cases read before it")
    for _, elem in _pull_events(parser, b):
        if not isinstance(elem, ET.Element) or elem.tag != "testcase":
            continue
        name = elem.get("name", "")
        classname = elem.get("classname", "")
        test_id = f"{classname}::{name}" if classname else name
        outcome, message = Outcome.PASSED, ""
        for child in elem:
            tag = child.tag
            if tag in ("failure", "error"):
                outcome = Outcome.FAILED if tag == "failure" else Outcome.ERROR
                message = child.get("message") or (child.text or "")
                break
            if tag == "skipped":
                outcome, message = Outcome.SKIPPED, child.get("message") or ""
        try:
            duration: float | None = float(elem.get("time", ""))
        except ValueError:
            duration = None
        b.add(test_id, outcome, message, duration)
    if not b.tests and b.complete and not data.strip():
        b.complete = False
        b.problems.append("empty JUnit report")
    return b.build()


def _pull_events(parser: Any, b: _Builder) -> list[tuple[str, Any]]:
    """The events parsed before any error (the pull parser re-raises a parse error in read_events)."""
    out: list[tuple[str, Any]] = []
    events = parser.read_events()
    while True:
        try:
            out.append(next(events))
        except StopIteration:
            return out
        except ET.ParseError as e:
            if b.complete:
                b.complete = False
                b.problems.append(f"JUnit XML is malformed or truncated ({e}); kept the test cases read before it")
            return out


# -- unittest -------------------------------------------------------------------------------------
# "test_x (mod.Class.test_x)" on Python >= 3.11, "test_x (mod.Class)" before.
_UT_START = re.compile(r"^(\w+) \(([\w.]+)\)(?: \((.*)\))?")
_UT_RESULT = re.compile(r"(?:^| \.\.\. ?|^\s*)(ok|FAIL|ERROR|skipped(?: .*)?|expected failure|unexpected success)$")
_UT_HEADER = re.compile(r"^(FAIL|ERROR): (\w+) \(([\w.]+)\)")
_UT_RAN = re.compile(r"^Ran (\d+) tests? in ")
_UT_MAP = {"ok": Outcome.PASSED, "FAIL": Outcome.FAILED, "ERROR": Outcome.ERROR, "expected failure": Outcome.SKIPPED}


def _ut_id(method: str, where: str) -> str:
    return where if where.endswith("." + method) else f"{where}.{method}"


def parse_unittest(data: bytes, exit_code: int | None = None) -> TestReport:
    b = _Builder("unittest", complete=False)
    pending: str | None = None
    for raw in _text(data).splitlines():
        line = raw.rstrip()
        if m := _UT_HEADER.match(line):
            b.add(_ut_id(m.group(2), m.group(3)), Outcome.FAILED if m.group(1) == "FAIL" else Outcome.ERROR)
            pending = None
            continue
        if _UT_RAN.match(line):
            b.complete = True
            pending = None
            continue
        m = _UT_START.match(line.lstrip())
        if m:  # an indented sub-test line "  test_x (...) (i=1) ... FAIL" belongs to its test
            pending = _ut_id(m.group(1), m.group(2))
        if pending is None:
            continue
        r = _UT_RESULT.search(line)
        if r:
            word = r.group(1)
            if word.startswith("skipped"):
                outcome = Outcome.SKIPPED
            elif word == "unexpected success":
                outcome = Outcome.FAILED  # unittest counts it as a failure of the run
            else:
                outcome = _UT_MAP[word]
            b.add(pending, outcome)
            pending = None
    if not b.complete:
        b.problems.append("no 'Ran N tests' line: the run was cut short or the output truncated")
    return b.build()


# -- TAP (node --test) ----------------------------------------------------------------------------
_TAP_LINE = re.compile(r"^(\s*)(ok|not ok)\b\s*(\d+)?\s*(?:-\s*)?(.*)$")
_TAP_SUBTEST = re.compile(r"^(\s*)# Subtest: (.*)$")
_TAP_PLAN = re.compile(r"^\s*1\.\.(\d+)")
_TAP_DIRECTIVE = re.compile(r"(?<!\\)#\s*(SKIP|TODO)\b.*$", re.IGNORECASE)


def _tap_unescape(s: str) -> str:
    return s.replace("\\#", "#").replace("\\\\", "\\")


def parse_tap(data: bytes, exit_code: int | None = None) -> TestReport:
    b = _Builder("tap", complete=False)
    stack: list[tuple[int, str]] = []  # (indent, name) of open subtests
    had_children: set[tuple[str, ...]] = set()
    leaves: list[tuple[tuple[str, ...], Outcome, str]] = []
    top_plan = False
    for raw in _text(data).splitlines():
        if m := _TAP_SUBTEST.match(raw):
            indent = len(m.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, _tap_unescape(m.group(2).strip())))
            continue
        if m := _TAP_LINE.match(raw):
            indent = len(m.group(1))
            desc = m.group(4)
            directive = _TAP_DIRECTIVE.search(desc)
            name = _tap_unescape(_TAP_DIRECTIVE.sub("", desc).strip())
            while stack and stack[-1][0] > indent:
                stack.pop()
            parents = tuple(n for i, n in stack if i < indent)
            if stack and stack[-1][0] == indent:
                name = stack[-1][1] or name
                stack.pop()
            path = (*parents, name)
            if parents:
                had_children.add(parents)
            if directive:
                outcome = Outcome.SKIPPED
            else:
                outcome = Outcome.PASSED if m.group(2) == "ok" else Outcome.FAILED
            leaves.append((path, outcome, ""))
            continue
        if (m := _TAP_PLAN.match(raw)) and not raw.startswith(" "):
            top_plan = True
        if raw.startswith("Bail out!"):
            b.problems.append("TAP producer bailed out")
    for path, outcome, message in leaves:
        if path not in had_children:
            b.add(" > ".join(path), outcome, message)
    b.complete = top_plan
    if not top_plan:
        b.problems.append("no TAP plan at the top level: the run was cut short or the output truncated")
    return b.build()


# -- Jest / Vitest JSON ---------------------------------------------------------------------------
_JEST_MAP = {
    "passed": Outcome.PASSED,
    "failed": Outcome.FAILED,
    "pending": Outcome.SKIPPED,
    "skipped": Outcome.SKIPPED,
    "todo": Outcome.SKIPPED,
    "disabled": Outcome.SKIPPED,
    "focused": Outcome.PASSED,
}


def _relative(path: str, root: str) -> str:
    root = root.rstrip("/")
    if root and path.startswith(root + "/"):
        return path[len(root) + 1 :]
    return path


def parse_jest(data: bytes, exit_code: int | None = None, root: str = "") -> TestReport:
    b = _Builder("jest")
    try:
        doc = json.loads(data[:MAX_REPORT_BYTES])
    except (ValueError, UnicodeDecodeError) as e:
        b.complete = False
        b.problems.append(f"Jest JSON is malformed or truncated: {e}")
        return b.build()
    if not isinstance(doc, dict) or not isinstance(doc.get("testResults"), list):
        b.complete = False
        b.problems.append("Jest JSON without a testResults list")
        return b.build()
    for suite in doc["testResults"]:
        if not isinstance(suite, dict):
            continue
        file = _relative(str(suite.get("name", "")), root)
        results = suite.get("assertionResults") or []
        for a in results:
            if not isinstance(a, dict):
                continue
            titles = [str(t) for t in a.get("ancestorTitles") or []]
            test_id = " > ".join([file, *titles, str(a.get("title", ""))])
            outcome = _JEST_MAP.get(str(a.get("status")), Outcome.ERROR)
            message = "\n".join(str(m) for m in a.get("failureMessages") or [])
            dur = a.get("duration")
            b.add(test_id, outcome, message, float(dur) / 1000 if isinstance(dur, int | float) else None)
        if not results and suite.get("status") == "failed":
            # The test file itself failed to run (syntax error, missing module).
            b.add(file, Outcome.ERROR, str(suite.get("message", "")))
    if doc.get("wasInterrupted"):
        b.complete = False
        b.problems.append("Jest reports the run as interrupted")
    return b.build()


# -- go test -json --------------------------------------------------------------------------------
_GO_BUILD_FAILED = re.compile(r"^FAIL\s+(\S+) \[(build failed|setup failed)\]")
_GO_MAP = {"pass": Outcome.PASSED, "fail": Outcome.FAILED, "skip": Outcome.SKIPPED}


def parse_go(data: bytes, exit_code: int | None = None) -> TestReport:
    b = _Builder("go")
    running: set[str] = set()
    for raw in _text(data).splitlines():
        line = raw.strip()
        if not line:
            continue
        if not line.startswith("{"):
            if m := _GO_BUILD_FAILED.match(line):
                b.add(m.group(1), Outcome.ERROR, m.group(2))
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            b.complete = False
            b.problems.append("an unreadable go test -json line (truncated output?)")
            continue
        if not isinstance(ev, dict):
            continue
        action, pkg, test = ev.get("Action"), str(ev.get("Package", "")), ev.get("Test")
        if not test:
            if action == "fail" and not any(t.startswith(pkg + "/") for t in b.tests):
                b.add(pkg, Outcome.ERROR, "package failed before running tests")
            continue
        test_id = f"{pkg}/{test}"
        if action == "run":
            running.add(test_id)
        elif action in _GO_MAP:
            running.discard(test_id)
            elapsed = ev.get("Elapsed")
            b.add(test_id, _GO_MAP[action], duration=float(elapsed) if isinstance(elapsed, int | float) else None)
    for test_id in sorted(running):
        b.add(test_id, Outcome.ERROR, "started but never finished")
        b.complete = False
    if running:
        b.problems.append(f"{len(running)} test(s) started and never finished")
    return b.build()


# -- go test -v (text) ----------------------------------------------------------------------------
_GOV_RUN = re.compile(r"^\s*=== RUN\s+(\S+)")
_GOV_RESULT = re.compile(r"^\s*--- (PASS|FAIL|SKIP): (\S+) \([\d.]+\s*s?\)")
_GOV_END = re.compile(r"^(?:(?:ok|FAIL)\s+\S+|PASS|FAIL)\b")
_GOV_MAP = {"PASS": Outcome.PASSED, "FAIL": Outcome.FAILED, "SKIP": Outcome.SKIPPED}


def parse_gotest(data: bytes, exit_code: int | None = None) -> TestReport:
    """``go test -v``'s text. A test with the same name in two packages keeps its worst outcome;
    one that started (``=== RUN``) and never reported is an error."""
    b = _Builder("gotest", complete=False)
    running: set[str] = set()
    for raw in _text(data).splitlines():
        if m := _GOV_RUN.match(raw):
            running.add(m.group(1))
        elif m := _GOV_RESULT.match(raw):
            running.discard(m.group(2))
            b.add(m.group(2), _GOV_MAP[m.group(1)])
        elif m := _GO_BUILD_FAILED.match(raw):
            b.add(m.group(1), Outcome.ERROR, m.group(2))
        elif _GOV_END.match(raw):
            b.complete = True
    for name in sorted(running):
        b.add(name, Outcome.ERROR, "started but never finished")
    if running:
        b.complete = False
        b.problems.append(f"{len(running)} test(s) started and never finished")
    elif not b.complete:
        b.problems.append("no final ok/FAIL/PASS line from go test: the run was cut short or the output truncated")
    return b.build()


# -- exit code ------------------------------------------------------------------------------------
def parse_exit_code(data: bytes, exit_code: int | None = None) -> TestReport:
    b = _Builder("exit-code")
    if exit_code is None:
        b.complete = False
        b.add("exit_code", Outcome.ERROR, "the command did not exit normally")
    else:
        b.add("exit_code", Outcome.PASSED if exit_code == 0 else Outcome.FAILED, f"exit code {exit_code}")
    return b.build()


Parser = Callable[..., TestReport]

REPORT_FORMATS: dict[str, Parser] = {
    "pytest": parse_pytest,
    "junit": parse_junit,
    "pytest-junit": parse_junit,
    "unittest": parse_unittest,
    "tap": parse_tap,
    "jest": parse_jest,
    "vitest": parse_jest,
    "go": parse_go,
    "gotest": parse_gotest,
    "exit-code": parse_exit_code,
}
# Formats read from the captured output of the test command (the others from a report file).
OUTPUT_FORMATS = frozenset({"pytest", "unittest", "tap", "go", "gotest", "exit-code"})


def parse_report(fmt: str, data: bytes, *, exit_code: int | None = None, root: str = "") -> TestReport:
    """Parse ``data`` as ``fmt``; ``root`` makes absolute file paths relative (Jest/Vitest)."""
    parser = REPORT_FORMATS.get(fmt)
    if parser is None:
        raise ValueError(f"unknown report format {fmt!r}; known: {', '.join(sorted(REPORT_FORMATS))}")
    if parser is parse_jest:
        return parse_jest(data, exit_code, root=root)
    return parser(data, exit_code)


# -- test ids -------------------------------------------------------------------------------------
_UT_NAMED = re.compile(r"^(\w+) \(([\w.]+)\)$")


def unittest_dotted(test_id: str) -> str | None:
    """``t (tests.test_a.C)``, as unittest names a test (and a class fixture's error, ``setUpClass
    (m.C)``) and SWE-bench lists Django's, dotted: ``tests.test_a.C.t``; None for another spelling."""
    m = _UT_NAMED.match(test_id)
    return _ut_id(m[1], m[2]) if m else None


def canonical_id(test_id: str) -> str:
    """One spelling for the ids of pytest, JUnit and unittest: ``tests/test_a.py::C::t[x]`` and
    ``tests.test_a.C::t[x]`` both become ``tests.test_a.C.t[x]`` (parameters kept verbatim);
    ``t (tests.test_a.C)`` becomes ``tests.test_a.C.t`` (:func:`unittest_dotted`)."""
    if dotted := unittest_dotted(test_id):
        return dotted
    head, bracket, params = test_id.partition("[")
    head = head.replace("::", ".").replace("/", ".")
    head = re.sub(r"\.py(?=\.|$)", "", head)
    return head + bracket + params


def lookup(report: TestReport, ids: Iterable[str]) -> dict[str, TestCase | None]:
    """Find each id in the report, exactly or by ``canonical_id``; None when it is not there."""
    canon = {canonical_id(k): v for k, v in report.tests.items()}
    out: dict[str, TestCase | None] = {}
    for test_id in ids:
        out[test_id] = report.tests.get(test_id) or canon.get(canonical_id(test_id))
    return out


# How a dataset names the tests it lists, when that is not the runner's full id. SWE-bench's log
# parsers for pytest (parse_log_pytest and the per-repository ones built on it) keep the first
# whitespace-separated word of each result line: a parametrized id with a space in it is listed
# cut there (``tests/test_x.py::test_make_error[required-Missing``). SymPy's parser lists bare
# function names (``test_Symbol``); Multi-SWE-bench lists Maven's test classes.
ID_MATCHES = ("exact", "first-word", "name", "class")


def _first_word(test_id: str) -> str:
    words = test_id.split(None, 1)
    return words[0] if words else test_id


_ID_KEYS: dict[str, Callable[[str], str]] = {
    "first-word": _first_word,
    "name": lambda test_id: test_id.rsplit("::", 1)[-1],  # a pytest node id's function (and parameters)
    "class": lambda test_id: test_id.split("::", 1)[0],  # a JUnit id's class
}


def match_listed(report: TestReport, ids: Iterable[str], how: str = "exact") -> dict[str, tuple[TestCase, ...]]:
    """The reported tests each listed id stands for. ``exact``: the one test of that id (or
    ``canonical_id``). ``first-word``: as SWE-bench's harness reads its lists, every reported test
    whose id cut at the first whitespace is the listed id; ``name``: every test of that function
    name, in any file (SymPy's lists); ``class``: every test of that JUnit class (Multi-SWE-bench's
    Maven lists). An id that is itself in the report stands for that test alone. Several tests
    behind one listed id must all pass (:func:`combined_outcome`): stricter than SWE-bench's
    harness, where the last line printed wins."""
    if how not in ID_MATCHES:
        raise ValueError(f"unknown id match {how!r}; use one of {', '.join(ID_MATCHES)}")
    exact = lookup(report, ids)
    out: dict[str, tuple[TestCase, ...]] = {}
    cut: dict[str, list[TestCase]] = {}
    if key := _ID_KEYS.get(how):
        for case in report.tests.values():
            cut.setdefault(key(case.id), []).append(case)
    for test_id, found in exact.items():
        out[test_id] = (found,) if found else tuple(cut.get(test_id, ()))
    return out


def combined_outcome(cases: Iterable[TestCase]) -> Outcome | None:
    """One outcome for the tests behind one listed id: passed only when every one passed; else the
    worst of the others (a skip among passes is not a pass). None when there is none."""
    outcomes = [c.outcome for c in cases]
    if not outcomes:
        return None
    failing = [o for o in outcomes if o is not Outcome.PASSED]
    return max(failing, key=lambda o: o.rank) if failing else Outcome.PASSED
