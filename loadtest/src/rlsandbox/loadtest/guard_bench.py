"""The pytest guard's cost: a real pytest run without the guard, with the guard of a baseline
revision, and with the guard as it is now, alternated in one run.

    python -m rlsandbox.loadtest.guard_bench [--rounds 5] [--modules 20] [--tests 50] [--baseline REV] [--json out.json]

The suite is ``modules`` test files of ``tests`` trivial tests each (1,000 by default) that also
import a few dozen stdlib modules, so the guard watches ~500 modules as it does in a real project;
the "agent's" file is one module of the workspace, whose class with an ``__eq__`` of its own every
test compares (the guard probes the agent's classes). Each round runs the three configurations one
after the other (this machine is shared: compare the ratios within a round, not times across
runs). Without Docker: the guard is a file pytest loads, as in the clean room
(``PYTEST_ADDOPTS=-p``, ``PYTHONDONTWRITEBYTECODE=1``).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rlsandbox.daemon.grading.guard import GUARD_SOURCE, guard_setup, read_guard_log
from rlsandbox.loadtest.stats import bench_cli, machine

# The agent's package: a function, and a class with a comparison of its own, which the guard
# probes (its objects that compare equal are probed once a test through the class's __eq__).
PACKAGE = """def double(x):
    return 2 * x


class Money:
    def __init__(self, amount, currency):
        self.amount, self.currency = amount, currency

    def __eq__(self, other):
        if not isinstance(other, Money):
            return NotImplemented
        return (self.amount, self.currency) == (other.amount, other.currency)

    __hash__ = None
"""
GUARD_PATH = "daemon/src/rlsandbox/daemon/grading/pytest_guard.py"
IMPORTS = "import json, decimal, email.message, http.client, asyncio, csv, difflib, argparse, logging, dataclasses\n"


def make_suite(root: Path, modules: int, tests: int) -> Path:
    ws = root / "ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "pkg.py").write_text(PACKAGE)
    body = (
        IMPORTS
        + "import pkg\n"
        + "".join(
            f"\n\ndef test_{i}():\n    assert pkg.double({i}) == {2 * i}\n"
            f"    assert pkg.Money({i}, 'EUR') == pkg.Money({i}, 'EUR')\n"
            for i in range(tests)
        )
    )
    for m in range(modules):
        (ws / "tests" / f"test_m{m}.py").write_text(body)
    return ws


def run_once(root: Path, ws: Path, source: bytes | None, expected: int) -> float:
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ws)}
    setup = None
    if source is not None:
        setup = guard_setup(str(root))
        (root / f"{setup.module}.py").write_bytes(source)
        (root / "guard.json").write_bytes(setup.config(str(ws), [str(ws / "pkg.py")]))
        env.update(setup.env({}))
        env["PYTHONPATH"] = f"{root}:{ws}"
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=ws, env=env, capture_output=True
    )
    took = time.perf_counter() - start
    if f"{expected} passed".encode() not in proc.stdout:
        raise RuntimeError(f"the suite did not pass: {proc.stdout[-500:]!r}")
    if setup is not None:
        log = read_guard_log(proc.stderr, setup.key)
        if not log.ended or log.tampering or len(log.tests) != expected:
            raise RuntimeError(f"the guard's log is not clean: ended={log.ended} tampering={log.tampering[:3]}")
        (root / f"{setup.module}.py").unlink()
    return took


def baseline_source(rev: str) -> bytes:
    repo = Path(__file__).resolve().parents[4]
    return subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{GUARD_PATH}"], check=True, capture_output=True).stdout


async def run(args: Any) -> dict[str, Any]:
    configs: dict[str, bytes | None] = {
        "no guard": None,
        f"guard at {args.baseline}": baseline_source(args.baseline),
        "guard now": GUARD_SOURCE,
    }
    expected = args.modules * args.tests
    times: dict[str, list[float]] = {k: [] for k in configs}
    with tempfile.TemporaryDirectory(prefix="guard-bench-") as tmp:
        root = Path(tmp)
        ws = make_suite(root, args.modules, args.tests)
        run_once(root, ws, None, expected)  # warm the page cache
        for _ in range(args.rounds):
            for name, source in configs.items():
                times[name].append(run_once(root, ws, source, expected))
    return {
        "machine": machine(),
        "tests": expected,
        "rounds": args.rounds,
        "baseline": args.baseline,
        "pid": os.getpid(),
        "seconds": times,
    }


def render(results: dict[str, Any]) -> str:
    times: dict[str, list[float]] = results["seconds"]
    base = times["no guard"]
    lines = [
        f"{results['tests']} tests, {results['rounds']} rounds, machine {results['machine']}",
        "",
        "| configuration | median s | per test ms over no guard | median ratio to no guard (per round) |",
        "|---|---|---|---|",
    ]
    for name, samples in times.items():
        ratio = statistics.median(s / b for s, b in zip(samples, base, strict=True))
        extra = (statistics.median(samples) - statistics.median(base)) / results["tests"] * 1e3
        lines.append(f"| {name} | {statistics.median(samples):.2f} | {extra:.2f} | {ratio:.2f}x |")
    return "\n".join(lines)


def _arguments(parser: Any) -> None:
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modules", type=int, default=20)
    parser.add_argument("--tests", type=int, default=50)
    parser.add_argument("--baseline", default="e50f326", help="the git revision whose guard is the baseline")


if __name__ == "__main__":
    bench_cli(__doc__, _arguments, run, render)
