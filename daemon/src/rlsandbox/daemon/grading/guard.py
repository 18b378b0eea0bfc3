"""The grader's side of the pytest guard (``pytest_guard.py``): its set-up and its verified log.

Pure functions over bytes: ``guard_setup`` makes the files and the environment that load the
guard into one clean-room run; ``read_guard_log`` checks every line's HMAC and the sequence and
turns the records into per-test outcomes and tampering findings. A line with a bad signature, a
gap, or a pass the runner never produced is tampering.
"""

from __future__ import annotations

import ast
import hmac
import json
import secrets
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path

from rlsandbox.daemon.grading.reports import Outcome, TestCase, TestReport

GUARD_SOURCE = (Path(__file__).with_name("pytest_guard.py")).read_bytes()
CFG_ENV = "RLSANDBOX_GUARD_CFG"
# Formats whose test command runs pytest: the guard is loaded into them.
PYTEST_FORMATS = frozenset({"pytest", "junit", "pytest-junit"})


@dataclass(frozen=True, slots=True)
class GuardSetup:
    module: str  # random: no workspace file can be named like it in advance
    key: bytes
    config_path: str
    log_path: str

    def config(self, workspace: str, changed: list[str]) -> bytes:
        doc = {"key": self.key.hex(), "workspace": workspace, "changed": sorted(changed), "out": self.log_path}
        return json.dumps(doc).encode()

    def env(self, task_env: dict[str, str]) -> dict[str, str]:
        addopts = task_env.get("PYTEST_ADDOPTS", "")
        return {"PYTEST_ADDOPTS": f"-p {self.module} {addopts}".strip(), CFG_ENV: self.config_path}


def guard_setup(report_dir: str) -> GuardSetup:
    return GuardSetup(
        module=f"rlsandbox_guard_{secrets.token_hex(6)}",
        key=secrets.token_bytes(32),
        config_path=f"{report_dir}/guard.json",
        log_path=f"{report_dir}/guard.log",
    )


@dataclass(slots=True)
class GuardLog:
    started: bool = False
    ended: bool = False
    tests: dict[str, Outcome] = field(default_factory=dict)
    tampering: list[str] = field(default_factory=list)

    def report(self) -> TestReport:
        """The guard's outcomes as a report (what pytest's own summary would have said)."""
        return TestReport("pytest-guard", {i: TestCase(i, o) for i, o in self.tests.items()}, complete=self.ended)


def _phase_outcome(when: str, outcome: str, wasxfail: bool) -> Outcome:
    if outcome == "passed":
        return Outcome.PASSED
    if outcome == "skipped":
        return Outcome.SKIPPED
    return Outcome.FAILED if when == "call" else Outcome.ERROR


def read_guard_log(data: bytes, key: bytes) -> GuardLog:
    """Verify and interpret the guard's log. Never raises on bad input: it is tampering."""
    log = GuardLog()
    expected = 0
    raw: dict[tuple[str, str], str] = {}
    phases: dict[str, dict[str, Outcome]] = {}
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line:
            continue
        body, _, mac = line.rpartition(b"\t")
        good = hmac.new(key, body, sha256).hexdigest().encode()
        if not body or not hmac.compare_digest(mac, good):
            log.tampering.append(
                f"pytest guard: line {n} of its log is not its own (bad signature): written by the code under test"
            )
            continue
        try:
            record = ast.literal_eval(body.decode("utf-8"))
            seq, kind, *fields = record
        except (ValueError, SyntaxError, TypeError, UnicodeDecodeError, MemoryError, RecursionError):
            log.tampering.append(f"pytest guard: line {n} is signed but unreadable")
            continue
        if seq != expected:
            log.tampering.append(f"pytest guard: record {expected} is missing from its log (found {seq}): log rewritten")
        expected = seq + 1
        if kind == "start":
            log.started = True
        elif kind == "end":
            log.ended = True
        elif kind == "tamper":
            log.tampering.append(f"pytest guard: {fields[0]}")
        elif kind == "raw":
            nodeid, when, outcome = fields
            raw[(nodeid, when)] = outcome
        elif kind == "report":
            nodeid, when, outcome, wasxfail = fields
            if outcome == "passed" and raw.get((nodeid, when)) not in ("passed", None):
                log.tampering.append(
                    f"pytest guard: {nodeid} ({when}) failed when it ran but its report says passed: report rewritten in-process"
                )
                outcome = "failed"
            elif outcome == "passed" and (nodeid, when) not in raw and when == "call":
                log.tampering.append(f"pytest guard: {nodeid} reported passed but never ran under the runner")
                outcome = "failed"
            phases.setdefault(nodeid, {})[when] = _phase_outcome(when, outcome, wasxfail)
    for nodeid, by_phase in phases.items():
        worst = max(by_phase.values(), key=lambda o: o.rank)
        if Outcome.SKIPPED in by_phase.values() and worst is Outcome.PASSED:
            worst = Outcome.SKIPPED
        if "call" not in by_phase and worst is Outcome.PASSED:
            worst = Outcome.ERROR  # set up, never called: not a pass
        log.tests[nodeid] = worst
    return log
