"""A second opinion on a reward: the tests that earned it, run again one at a time.

A reward that only one run produced can be forged against that run: code that behaves once the
other tests have run, that counts the tests, reads the order they run in or what an earlier test
left in the process. So when a grade pays, each FAIL_TO_PASS test that passed (``all``: every
listed test that passed, at most ``MAX_CHECKED``) runs again in the same clean room, alone, in a
fresh interpreter (never a warm one), with the same command, under the guard, which deselects
every other test (pytest's or unittest's). A test that passed in the full run and does not pass alone is
a disagreement: tampering, the reward is 0 under the strict policy.

Only where a Python guard runs (the narrowing is the guard's: pytest's collection deselected, or
each unittest run's suite narrowed before it runs). Cost: one interpreter start and one collection
per test checked (measured in docs/BENCHMARKS.md, "Second opinion").
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rlsandbox.daemon.grading.rewards import GradeResult, GradeStatus, TestGroup

MODES = ("off", "fail_to_pass", "all")
MAX_CHECKED = 16  # tests run alone per grade at most (a sample of the passing ones past that)


@dataclass(frozen=True, slots=True)
class Check:
    """A listed test to run alone: its id as the task lists it, and the report's ids it stood for."""

    listed: str
    nodeids: tuple[str, ...]


def checks(result: GradeResult, mode: str, rng: random.Random | None = None) -> list[Check]:
    """The tests of a paying grade to run alone (pure): none unless the grade is ok and pays."""
    if mode == "off" or result.status is not GradeStatus.OK or not result.reward:
        return []
    groups = (TestGroup.FAIL_TO_PASS,) if mode == "fail_to_pass" else (TestGroup.FAIL_TO_PASS, TestGroup.PASS_TO_PASS)
    passed = [t for t in result.tests if t.group in groups and t.passed]
    if len(passed) > MAX_CHECKED:
        f2p = [t for t in passed if t.group is TestGroup.FAIL_TO_PASS][:MAX_CHECKED]
        rest = [t for t in passed if t.group is not TestGroup.FAIL_TO_PASS]
        passed = f2p + (rng or random.Random()).sample(rest, min(len(rest), MAX_CHECKED - len(f2p)))
    return [Check(t.id, t.matched or (t.id,)) for t in passed]


def disagreement(check: Check, alone: GradeResult) -> str:
    """What a test run alone says against the full run's pass; "" when it passed alone too."""
    found = next((t for t in alone.tests if t.id == check.listed), None)
    outcome = found.outcome if found is not None else "missing"
    if alone.status is GradeStatus.OK and outcome == "passed":
        return ""
    if alone.status is not GradeStatus.OK:
        outcome = f"{alone.status.value} ({alone.message[:200]})"
    return (
        f"second opinion: {check.listed} passed in the full run but is {outcome} run alone in a fresh interpreter: "
        "the full run's result depends on more than the code under test"
    )


__all__ = ["MAX_CHECKED", "MODES", "Check", "checks", "disagreement"]
