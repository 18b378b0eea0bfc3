"""The grader's side of the guards (``pytest_guard.py`` under pytest or unittest, ``node_guard.js``
under ``node --test``): their set-up and their verified logs.

Pure functions over bytes: ``guard_setup`` makes the files and the environment that load the
guard into one clean-room run; ``read_guard_log`` finds the guard's records in the test command's
stderr (where the guard writes them through a copy of the original descriptor), checks every
record's HMAC and the sequence, and turns them into per-test outcomes and tampering findings. A
record with a bad signature, a gap, or a pass the runner never produced is tampering; other lines
of stderr are the tests' own.
"""

from __future__ import annotations

import ast
import hmac
import json
import posixpath
import re
import secrets
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

from rlsandbox.daemon.grading.reports import Outcome, TestCase, TestReport, unittest_dotted
from rlsandbox.daemon.model import WarmRun

GUARD_SOURCE = (Path(__file__).with_name("pytest_guard.py")).read_bytes()
NODE_GUARD_SOURCE = (Path(__file__).with_name("node_guard.js")).read_bytes()
CFG_ENV = "RLSANDBOX_GUARD_CFG"
NODE_CFG_ENV = "RLSANDBOX_NODE_GUARD_CFG"
# Formats whose test command runs pytest: the guard is loaded into them as a plugin (-p).
PYTEST_FORMATS = frozenset({"pytest", "junit", "pytest-junit"})
# Formats whose test command runs unittest (python -m unittest, Django's runtests.py): the guard
# is loaded by a .pth file into the command's first Python process as it starts.
UNITTEST_FORMATS = frozenset({"unittest"})
# Formats whose test command runs node's test runner (`node --test`, directly or through an npm
# script): the node guard is loaded into every node process through NODE_OPTIONS (--require).
NODE_FORMATS = frozenset({"tap", "jest"})


@dataclass(frozen=True, slots=True)
class GuardSetup:
    module: str  # random: no workspace file can be named like it in advance
    key: bytes
    config_path: str
    runner: str = "pytest"  # or "unittest", "node"

    def config(self, workspace: str, changed: list[str], only: Sequence[str] = ()) -> bytes:
        """The guard's configuration. ``only``: the ids of the one run's tests (a second opinion's
        run); the guard deselects every other test pytest collects, or leaves out of each unittest
        run every other test."""
        doc: dict[str, Any] = {"key": self.key.hex(), "workspace": workspace, "changed": sorted(changed), "runner": self.runner}
        if only:
            doc["only"] = sorted(only)
        return json.dumps(doc).encode()

    @property
    def source(self) -> tuple[str, bytes]:
        """The guard's file: its name and content."""
        if self.runner == "node":
            return self.module + ".js", NODE_GUARD_SOURCE
        return self.module + ".py", GUARD_SOURCE

    @property
    def pth(self) -> tuple[str, bytes] | None:
        """unittest: the .pth file (name, content) that imports the guard as the interpreter
        starts; first of its folder (site reads them sorted), before any other's code."""
        if self.runner != "unittest":
            return None
        # Only where the configuration is named: the process that takes the key removes the name
        # from its environment, so the runner's own child processes (a test's subprocess) start
        # without compiling the guard (~14 ms each).
        line = f"import os; os.environ.get({CFG_ENV!r}) and __import__({self.module!r})\n"
        return f"000-{self.module}.pth", line.encode()

    def env(self, task_env: dict[str, str], user_base: str | None = None) -> dict[str, str]:
        """The test command's environment additions; ``user_base``: the guard module is in the
        user site-packages of this PYTHONUSERBASE (not next to pytest: a read-only root)."""
        if self.runner == "node":
            # ``user_base`` is the guard's folder here; node reads NODE_OPTIONS in every process.
            guard_file = posixpath.join(user_base or "", self.module + ".js")
            options = task_env.get("NODE_OPTIONS", "")
            return {NODE_CFG_ENV: self.config_path, "NODE_OPTIONS": f"--require {guard_file} {options}".strip()}
        env = {CFG_ENV: self.config_path}
        if self.runner == "pytest":
            addopts = task_env.get("PYTEST_ADDOPTS", "")
            env["PYTEST_ADDOPTS"] = f"-p {self.module} {addopts}".strip()
        if user_base is not None:
            env["PYTHONUSERBASE"] = user_base
        return env


# The guard reaches pytest through the environment (PYTEST_ADDOPTS, and its config's path): a
# command that assigns or unsets it, clears the environment, or isolates Python keeps it out.
_KEEPS_OUT = re.compile(
    r"(?:^|[\s;&|(])(?:PYTEST_ADDOPTS=|RLSANDBOX_GUARD_CFG=|PYTHONUSERBASE=|unset\s+(?:-v\s+)?(?:PYTEST_ADDOPTS|RLSANDBOX_GUARD_CFG)\b"
    r"|env\s+(?:-\S*\s+)*-(?:i|-ignore-environment|u\s*PYTEST_ADDOPTS)\b|python[0-9.]*\s+(?:-\S+\s+)*-[A-Za-z]*[IE])"
)


# The unittest guard comes in through site's .pth files: -S (no site) keeps it out, and where it is
# in a user site-packages (a read-only root), so do -s and PYTHONNOUSERSITE.
_KEEPS_SITE_OUT = re.compile(r"python[0-9.]*\s+(?:-\S+\s+)*-[A-Za-z]*S")
_KEEPS_USER_SITE_OUT = re.compile(r"(?:^|[\s;&|(])(?:PYTHONNOUSERSITE=|python[0-9.]*\s+(?:-\S+\s+)*-[A-Za-z]*s)")


# The node guard reaches node through NODE_OPTIONS (and its config's path).
_KEEPS_NODE_OUT = re.compile(
    r"(?:^|[\s;&|(])(?:NODE_OPTIONS=|RLSANDBOX_NODE_GUARD_CFG=|unset\s+(?:-v\s+)?(?:NODE_OPTIONS|RLSANDBOX_NODE_GUARD_CFG)\b"
    r"|env\s+(?:-\S*\s+)*-(?:i|-ignore-environment|u\s*NODE_OPTIONS)\b)"
)


def keeps_guard_out(test_command: str, runner: str = "pytest", user_site: bool = False) -> bool:
    """Whether the test command keeps the guard from loading (see _KEEPS_OUT); ``user_site``:
    the unittest guard's .pth file is in a user site-packages."""
    if runner == "node":
        return bool(_KEEPS_NODE_OUT.search(test_command))
    if _KEEPS_OUT.search(test_command):
        return True
    if runner != "unittest":
        return False
    return bool(_KEEPS_SITE_OUT.search(test_command) or (user_site and _KEEPS_USER_SITE_OUT.search(test_command)))


# A test command a recycling room may fork from its warm pytest (agent/sandbox_agent.py, "warm
# Python"): `[NAME=value ...] python3 -m pytest ARGS`, made of words a shell reads as they are (no
# quotes, globs, expansions, redirections or lists), in an environment whose interpreter settings
# the warm run reproduces. Anything else runs as a shell command, as before.
_PLAIN = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_PYTHON = re.compile(r"python3?|/[A-Za-z0-9_./-]*/python3(?:\.[0-9]+)?")
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)")
# Interpreter settings the warm run reproduces (it starts with PYTHONDONTWRITEBYTECODE set, so a
# run needs it set too: sys.flags cannot differ); any other PYTHON* variable makes a run cold.
WARM_ENV = frozenset({"PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUSERBASE"})


def warm_pytest(command: str, env: Mapping[str, str]) -> tuple[WarmRun, dict[str, str]] | None:
    """The warm form of ``command`` and the variables it assigns inline, or None."""
    words = command.split()
    if not words or not all(_PLAIN.fullmatch(w) for w in words):
        return None
    assigned: dict[str, str] = {}
    while words and (m := _ASSIGN.fullmatch(words[0])):
        assigned[m[1]] = m[2]
        words.pop(0)
    if len(words) < 3 or not _PYTHON.fullmatch(words[0]) or words[1:3] != ["-m", "pytest"]:
        return None
    merged = {**env, **assigned}
    if any(k.startswith("PYTHON") and k not in WARM_ENV for k in merged) or not merged.get("PYTHONDONTWRITEBYTECODE"):
        return None
    return WarmRun(words[0], "pytest", tuple(words[3:])), assigned


def guard_setup(report_dir: str, runner: str = "pytest") -> GuardSetup:
    return GuardSetup(
        module=f"rlsandbox_guard_{secrets.token_hex(6)}",
        key=secrets.token_bytes(32),
        config_path=f"{report_dir}/guard.json",
        runner=runner,
    )


@dataclass(slots=True)
class GuardLog:
    started: bool = False
    ended: bool = False
    tests: dict[str, Outcome] = field(default_factory=dict)
    tampering: list[str] = field(default_factory=list)
    never_ran: list[str] = field(default_factory=list)  # planned by the runner, never reported
    notes: list[str] = field(default_factory=list)  # what weakens the guard, said in the result

    def report(self) -> TestReport:
        """The guard's outcomes as a report (what the runner's own summary would have said)."""
        return TestReport("guard", {i: TestCase(i, o) for i, o in self.tests.items()}, complete=self.ended and not self.never_ran)


def _phase_outcome(when: str, outcome: str, wasxfail: bool) -> Outcome:
    if outcome == "passed":
        return Outcome.PASSED
    if outcome == "skipped":
        return Outcome.SKIPPED
    return Outcome.FAILED if when == "call" else Outcome.ERROR


_RECORD = re.compile(rb"^\((\d+), '[a-z]+'.*\t([0-9a-f]{64})$")


def split_records(stderr: bytes, led: bool = False) -> tuple[list[bytes], bytes]:
    """The lines of ``stderr`` shaped like guard records, and the rest (the tests' own output).
    ``led``: each record was written after a newline of its own (the unittest guard's), which is
    taken out with it: a line the record cut in two is whole again."""
    records: list[bytes] = []
    rest: list[list[bytes]] = []  # each line in its pieces, joined once at the end (linear in the output)
    join_next = False
    for line in stderr.split(b"\n"):
        if _RECORD.match(line):
            records.append(line)
            if led and rest and rest[-1] == [b""]:
                rest.pop()  # the record's own newline, after a line that had ended
            elif led and rest:
                join_next = True  # the record cut this line: what follows it ends the line
            continue
        if join_next:
            rest[-1].append(line)
            join_next = False
        else:
            rest.append([line])
    return records, b"\n".join(b"".join(pieces) for pieces in rest)


def _verified(stderr: bytes, key: bytes, name: str, tampering: list[str]) -> Iterator[tuple[int, str, list[Any]]]:
    """The guard records in ``stderr`` whose signature holds, as (line number, kind, fields), in
    order; a bad signature, an unreadable record or a gap in the sequence goes to ``tampering``."""
    expected = 0
    for n, line in enumerate(split_records(stderr)[0], 1):
        body, _, mac = line.rpartition(b"\t")
        good = hmac.new(key, body, sha256).hexdigest().encode()
        if not hmac.compare_digest(mac, good):
            tampering.append(f"{name}: record line {n} has a bad signature: written by the code under test")
            continue
        try:
            seq, kind, *fields = ast.literal_eval(body.decode("utf-8"))
        except (ValueError, SyntaxError, TypeError, UnicodeDecodeError, MemoryError, RecursionError):
            tampering.append(f"{name}: line {n} is signed but unreadable")
            continue
        if seq != expected:
            tampering.append(f"{name}: record {expected} is missing from its log (found {seq}): log rewritten")
        expected = seq + 1
        yield n, kind, fields


def read_guard_log(stderr: bytes, key: bytes, runner: str = "pytest") -> GuardLog:
    """Verify and interpret the guard's records in ``stderr``. Never raises on bad input."""
    log = GuardLog()
    name = f"{runner} guard"
    raw: dict[tuple[str, str], str] = {}
    phases: dict[str, dict[str, Outcome]] = {}
    cases: dict[str, set[Outcome]] = {}
    planned: dict[str, None] = {}
    for n, kind, fields in _verified(stderr, key, name, log.tampering):
        if kind == "start":
            log.started = True
        elif kind == "end":
            log.ended = True
        elif kind == "tamper":
            log.tampering.append(f"{name}: {fields[0]}")
        elif kind == "raw":
            nodeid, when, outcome = fields
            raw[(nodeid, when)] = outcome
            if when == "subtests":  # what the test's sub-tests did, as unittest ran them: part of its outcome
                phases.setdefault(nodeid, {})[when] = _phase_outcome("call", outcome, False)
        elif kind == "report":
            nodeid, when, outcome, wasxfail = fields
            if outcome == "passed" and raw.get((nodeid, when)) not in ("passed", None):
                log.tampering.append(
                    f"{name}: {nodeid} ({when}) failed when it ran but its report says passed: report rewritten in-process"
                )
                outcome = "failed"
            elif outcome == "passed" and (nodeid, when) not in raw and when == "call":
                log.tampering.append(f"{name}: {nodeid} reported passed but never ran under the runner")
                outcome = "failed"
            # A phase reported twice (pytest >= 9 reports each subTest of a test's call on its own,
            # then the test) keeps its worst outcome: a failed subtest fails its test.
            by_phase = phases.setdefault(nodeid, {})
            now = _phase_outcome(when, outcome, wasxfail)
            by_phase[when] = _worst((by_phase[when], now)) if when in by_phase else now
        elif kind == "case":  # unittest: each outcome its TestResult recorded, the worst counts
            try:
                # A class fixture's error, "setUpClass (m.C)", as the output names it: "m.C.setUpClass".
                test_id = str(fields[0])
                cases.setdefault(unittest_dotted(test_id) or test_id, set()).add(Outcome(fields[1]))
            except (ValueError, IndexError):
                log.tampering.append(f"{name}: line {n} is signed but unreadable")
        elif kind == "plan" and fields and isinstance(fields[0], tuple):  # unittest: the tests a run is given
            planned.update(dict.fromkeys(str(i) for i in fields[0]))
    for nodeid, by_phase in phases.items():
        worst = _worst(by_phase.values())
        if "call" not in by_phase and worst is Outcome.PASSED:
            worst = Outcome.ERROR  # set up, never called: not a pass
        log.tests[nodeid] = worst
    for test_id, outcomes in cases.items():
        log.tests[test_id] = _worst(outcomes)
    for test_id in planned:
        if test_id not in log.tests:
            # Not run because its class's or module's fixture failed or skipped: that record's
            # outcome (unittest reports the fixture, not its tests). Else it never ran.
            fixture = _fixture_outcome(log.tests, test_id)
            log.tests[test_id] = fixture or Outcome.ERROR
            if fixture is None:
                log.never_ran.append(test_id)
    return log


def _worst(outcomes: Iterable[Outcome]) -> Outcome:
    """A test's outcome from all it recorded: the worst, where a skip outranks a pass."""
    seen = set(outcomes)
    worst = max(seen, key=lambda o: o.rank)
    return Outcome.SKIPPED if worst is Outcome.PASSED and Outcome.SKIPPED in seen else worst


def _fixture_outcome(tests: Mapping[str, Outcome], test_id: str) -> Outcome | None:
    module_class = test_id.rpartition(".")[0]
    module = module_class.rpartition(".")[0]
    for fixture in (f"{module_class}.setUpClass", f"{module}.setUpModule"):
        if fixture in tests and tests[fixture] is not Outcome.PASSED:
            return tests[fixture]
    return None


def read_node_guard_log(stderr: bytes, key: bytes) -> GuardLog:
    """Verify and interpret the node guard's records (node_guard.js, the runner's): per test, the
    worst outcome its own function was witnessed to have, in any test file's process. Never raises
    on bad input."""
    log = GuardLog()
    for n, kind, fields in _verified(stderr, key, "node guard", log.tampering):
        if kind == "start":
            log.started = True
        elif kind == "end":
            log.ended = True
        elif kind == "tamper":
            log.tampering.append(f"node guard: {fields[0]}")
        elif kind == "exposed":
            log.notes.append(f"node guard: {fields[0]}")
        elif kind == "witness" and len(fields) == 3:
            _file, test_id, outcome = fields
            try:
                now = Outcome(outcome)
            except ValueError:
                log.tampering.append(f"node guard: line {n} is signed but unreadable")
                continue
            log.tests[test_id] = _worst((log.tests[test_id], now)) if test_id in log.tests else now
    return log


def witnessed(report: TestReport, log: GuardLog) -> tuple[TestReport, list[str], list[str]]:
    """The runner's report with a pass only where the node guard witnessed the test's function
    pass; the problems and the tampering that says. A pass the guard saw fail was rewritten; one it
    never saw (a line the code under test printed, a test it registered itself) is not a pass."""
    tests: dict[str, TestCase] = {}
    unseen: list[str] = []
    tampering: list[str] = []
    for test_id, case in report.tests.items():
        seen = log.tests.get(test_id)
        if case.outcome is Outcome.PASSED and seen is not Outcome.PASSED:
            if seen is Outcome.FAILED:
                tampering.append(
                    f"node guard: {test_id} failed when its function ran but the runner's report says passed: report forged"
                )
            else:
                unseen.append(test_id)
            case = TestCase(test_id, Outcome.FAILED, "the node guard never saw this test's function pass", case.duration)
        tests[test_id] = case
    problems = []
    if unseen:
        problems.append(
            f"{len(unseen)} test(s) passed in the runner's report but the node guard never saw their function pass "
            f"(first: {unseen[0]}): they count as failed (a line the tests printed, or a test registered outside a "
            "test file or through a runner other than node:test)"
        )
    return TestReport(report.format, tests, report.complete and log.ended, report.problems), problems, tampering
