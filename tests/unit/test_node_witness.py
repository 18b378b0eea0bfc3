"""The grader's reading of the node guard's records (guard.read_node_guard_log, guard.witnessed):
a pass counts only where the guard witnessed the test's function pass. The guard itself runs in
the Docker tier (tests/integration/test_node_guard.py)."""

from __future__ import annotations

from helpers import signed
from hypothesis import given
from hypothesis import strategies as st
from rlsandbox.daemon.grading.guard import keeps_guard_out, read_node_guard_log, witnessed
from rlsandbox.daemon.grading.reports import Outcome, parse_tap

KEY = b"n" * 32
F = "/workspace/test/a.test.js"
TAP = b"TAP version 13\nok 1 - reverse\nok 2 - shout\nnot ok 3 - upper\n1..3\n"


def log_of(*witnesses: tuple[str, str], end: bool = True) -> bytes:
    recs: list[tuple[object, ...]] = [("start", "v18", "runner"), ("file", F, 0)]
    recs += [("witness", F, test_id, outcome) for test_id, outcome in witnesses]
    return signed(KEY, *recs, *([("end",)] if end else []))


def test_a_witnessed_pass_counts_and_the_worst_witness_wins() -> None:
    log = read_node_guard_log(log_of(("reverse", "passed"), ("shout", "passed"), ("shout", "failed")), KEY)
    assert log.started and log.ended and not log.tampering
    report, problems, tampering = witnessed(parse_tap(TAP, 1), log)
    assert {i: c.outcome for i, c in report.tests.items()} == {
        "reverse": Outcome.PASSED,
        "shout": Outcome.FAILED,  # failed once when it ran: the report's pass is not taken
        "upper": Outcome.FAILED,
    }
    assert any("report forged" in t for t in tampering) and not problems


def test_a_pass_nobody_witnessed_is_not_a_pass() -> None:
    """Forged `ok` lines (or a test registered where the guard cannot see it) are in the report
    only: they count as failed, and the result says why."""
    report, problems, tampering = witnessed(parse_tap(TAP, 0), read_node_guard_log(log_of(("shout", "passed")), KEY))
    assert report.tests["reverse"].outcome is Outcome.FAILED and report.tests["shout"].outcome is Outcome.PASSED
    assert "never saw their function pass" in problems[0] and not tampering


def test_forged_removed_and_foreign_records_are_caught() -> None:
    good = log_of(("reverse", "failed"))
    forged = good + b"(9, 'witness', '" + F.encode() + b"', 'reverse', 'passed')\t" + b"ab" * 32 + b"\n"
    assert any("bad signature" in t for t in read_node_guard_log(forged, KEY).tampering)
    assert read_node_guard_log(forged, KEY).tests["reverse"] is Outcome.FAILED
    lines = good.split(b"\n")
    assert any("missing" in t for t in read_node_guard_log(b"\n".join(lines[:1] + lines[2:]), KEY).tampering)
    assert not read_node_guard_log(signed(b"x" * 32, ("start", "v18", "runner")), KEY).started


def test_a_run_cut_short_is_not_complete() -> None:
    report, _, _ = witnessed(parse_tap(TAP, 0), read_node_guard_log(log_of(("reverse", "passed"), end=False), KEY))
    assert not report.complete


@given(st.binary(max_size=400))
def test_the_node_log_reader_never_raises(data: bytes) -> None:
    read_node_guard_log(data, KEY)


def test_commands_that_keep_the_node_guard_out() -> None:
    for command in (
        "NODE_OPTIONS= node --test",
        "env -i node --test test/",
        "unset NODE_OPTIONS; node --test",
        "env -u NODE_OPTIONS npm test",
        "X=1 RLSANDBOX_NODE_GUARD_CFG=/x node --test",
    ):
        assert keeps_guard_out(command, "node"), command
    for command in ("node --test --test-reporter=tap test/", "npm test", "NODE_ENV=test node --test"):
        assert not keeps_guard_out(command, "node"), command
