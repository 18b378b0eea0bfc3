"""Reward policies: from a parsed test report to a reward and a graded result.

An infrastructure failure is never a reward of 0: it is a result with status ``infra_error`` and
no reward, so that a trainer can mask it. A test the task lists but the report does not contain
counts as failed (an agent that kills the test runner early gains nothing by it).
"""

from __future__ import annotations

import enum
import json
import math
from dataclasses import dataclass, field

from rlsandbox.daemon.grading.reports import Outcome, TestReport, combined_outcome, match_listed
from rlsandbox.daemon.grading.task import EvaluationSpec, RewardSpec

LOG_CAP = 64 << 10


class GradeStatus(enum.StrEnum):
    OK = "ok"
    INFRA_ERROR = "infra_error"
    TIMEOUT = "timeout"
    INVALID_TASK = "invalid_task"


class TestGroup(enum.StrEnum):
    __test__ = False  # a domain name, not a pytest test class
    FAIL_TO_PASS = "fail_to_pass"
    PASS_TO_PASS = "pass_to_pass"
    OTHER = "other"


MISSING = "missing"


@dataclass(frozen=True, slots=True)
class GradedTest:
    id: str
    outcome: str  # an Outcome value, or "missing" when the report does not have the test
    group: TestGroup
    # The report's ids this listed id stood for, when not itself (EvaluationSpec.id_match, or
    # another spelling of the same test: a JUnit id for a pytest node id).
    matched: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.outcome == Outcome.PASSED


@dataclass(slots=True)
class GradeResult:
    status: GradeStatus
    reward: float | None
    message: str = ""
    tests: list[GradedTest] = field(default_factory=list)
    exit_code: int | None = None
    timed_out: bool = False
    report_complete: bool = False
    tampering: list[str] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)
    log: bytes = b""
    duration: float = 0.0
    mode: str = "clean_room"

    @property
    def resolved(self) -> bool:
        graded = [t for t in self.tests if t.group is not TestGroup.OTHER]
        return self.status is GradeStatus.OK and bool(graded) and all(t.passed for t in graded)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {o.value: 0 for o in Outcome}
        out[MISSING] = 0
        for t in self.tests:
            out[t.outcome] = out.get(t.outcome, 0) + 1
        return out


def episodes_mess(why: str) -> GradeResult:
    """The grade of an episode that broke a limit (a workspace too large to grade, a sandbox its
    own processes killed): reward 0 with status ok and the limit named, never infra_error, so a
    policy cannot hide a failure by making a mess."""
    return GradeResult(GradeStatus.OK, 0.0, f"reward 0: {why}", limits=[why])


def grade_tests(evaluation: EvaluationSpec, report: TestReport) -> list[GradedTest]:
    """Every listed test with its outcome (missing ones included), then the report's other tests."""
    f2p = set(evaluation.fail_to_pass)
    listed = evaluation.graded_ids
    found = match_listed(report, listed, evaluation.id_match)
    graded: list[GradedTest] = []
    seen: set[str] = set()
    for test_id in listed:
        cases = found[test_id]
        outcome = combined_outcome(cases)
        group = TestGroup.FAIL_TO_PASS if test_id in f2p else TestGroup.PASS_TO_PASS
        matched = tuple(c.id for c in cases) if [c.id for c in cases] != [test_id] else ()  # the report's own ids
        graded.append(GradedTest(test_id, outcome.value if outcome else MISSING, group, matched))
        seen.update(c.id for c in cases)
    graded.extend(GradedTest(c.id, c.outcome.value, TestGroup.OTHER) for c in report.tests.values() if c.id not in seen)
    return graded


def id_match_note(tests: list[GradedTest], how: str) -> str:
    """What a grade says when listed ids stood for other ids of the report by ``how`` (a dataset's
    cut ids: ``first-word``); nothing for the runner's own ids (``exact``, spellings included)."""
    cut = [t for t in tests if t.matched] if how != "exact" else []
    if not cut:
        return ""
    first = cut[0]
    return (
        f"{len(cut)} listed test id(s) matched as the dataset's own harness matches them (cut at the first space), "
        f"every test behind one must pass: {first.id!r} stood for {len(first.matched)} test(s) ({first.matched[0]!r}"
        f"{', ...' if len(first.matched) > 1 else ''})"
    )


def compute_reward(policy: RewardSpec, tests: list[GradedTest]) -> float:
    """The reward of graded tests under ``policy`` (not for the 'command' policy, which the grader runs).

    With no FAIL_TO_PASS / PASS_TO_PASS listed, every test of the report counts (and an empty report
    is 0: no evidence is not success).
    """
    selected = [t for t in tests if t.group is not TestGroup.OTHER] or [t for t in tests if t.outcome != Outcome.SKIPPED]
    if not selected:
        return 0.0
    if policy.policy == "resolved":
        return 1.0 if all(t.passed for t in selected) else 0.0
    if policy.policy == "fraction":
        return sum(t.passed for t in selected) / len(selected)
    if policy.policy == "weighted":
        weights = [policy.weights.get(t.id, policy.default_weight) for t in selected]
        total = sum(weights)
        return sum(w for w, t in zip(weights, selected, strict=True) if t.passed) / total if total else 0.0
    raise ValueError(f"reward policy {policy.policy!r} is computed by the grader")


def parse_command_reward(stdout: bytes) -> float:
    """The reward printed by a custom reward command: the last non-empty line, a finite number."""
    lines = [ln.strip() for ln in stdout.decode("utf-8", errors="replace").splitlines() if ln.strip()]
    if not lines:
        raise ValueError("the reward command printed nothing")
    value = float(lines[-1])
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"the reward command printed {lines[-1]!r}, not a finite number")
    return value


REWARD_FILE_CAP = 64 << 10


def parse_reward_file(data: bytes, as_json: bool) -> tuple[float, str]:
    """The reward a test command wrote into a reward file, and why it is 0.0 when it is not what
    was written. Never raises: what the code under test made of the file (garbage, a huge file,
    a NaN) scores 0.0, never an error that would turn the episode into a masked invalid task."""
    if len(data) > REWARD_FILE_CAP:
        return 0.0, f"larger than {REWARD_FILE_CAP} bytes"
    text = data.decode("utf-8", "replace")
    try:
        if as_json:
            found = json.loads(text)
            value = float(found["reward"]) if isinstance(found, dict) else float("nan")
        else:
            value = float(text.strip())
    except (ValueError, KeyError, TypeError, OverflowError):
        return 0.0, "not a number" if not as_json else "no number under 'reward'"
    if not math.isfinite(value):
        return 0.0, f"{value} is not a finite number"
    return value, ""


def cap_log(stdout: bytes, stderr: bytes, cap: int = LOG_CAP) -> bytes:
    """Test output for the result: the head and tail of each stream within ``cap`` bytes in total."""
    out = b""
    for name, data in ((b"stdout", stdout), (b"stderr", stderr)):
        if not data:
            continue
        half = cap // 4
        body = (
            data if len(data) <= 2 * half else data[:half] + b"\n[... %d bytes cut ...]\n" % (len(data) - 2 * half) + data[-half:]
        )
        out += b"--- " + name + b" ---\n" + body + (b"" if body.endswith(b"\n") else b"\n")
    return out
