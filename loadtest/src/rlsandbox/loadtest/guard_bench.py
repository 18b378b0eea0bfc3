"""The pytest guard's cost: a real pytest run without the guard, with the guard of a baseline
revision, and with the guard as it is now, alternated in one run.

    python -m rlsandbox.loadtest.guard_bench [--rounds 5] [--modules 20] [--tests 50] [--baseline REV] [--json out.json]
    python -m rlsandbox.loadtest.guard_bench --runner unittest [...]

With ``--runner unittest`` the same suite is unittest's (a TestCase class per module, run by
``python -m unittest discover`` under the interpreter this venv was made from), the guard loaded
by its .pth file from a user site-packages as in a recycling clean room; there is no baseline (no
earlier guard ran under unittest).

The suite is ``modules`` test files of ``tests`` trivial tests each (1,000 by default) that also
import a few dozen stdlib modules, so the guard watches ~500 modules as it does in a real project;
the "agent's" file is one module of the workspace, whose class with an ``__eq__`` of its own every
test compares (the guard probes the agent's classes). Each round runs the three configurations one
after the other (this machine is shared: compare the ratios within a round, not times across
runs). Without Docker: the guard is a file pytest loads, as in the clean room
(``PYTEST_ADDOPTS=-p``, ``PYTHONDONTWRITEBYTECODE=1``).
"""

from __future__ import annotations

import functools
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


# A venv's interpreter reads no user site-packages, where the unittest guard's .pth file goes.
BASE_PYTHON = getattr(sys, "_base_executable", sys.executable)


@functools.cache
def user_site() -> str:
    """BASE_PYTHON's user site-packages, relative to its PYTHONUSERBASE (asked once)."""
    probe = "import site, os; print(os.path.relpath(site.getusersitepackages(), site.getuserbase()))"
    return subprocess.run([BASE_PYTHON, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()


def make_suite(root: Path, modules: int, tests: int, runner: str = "pytest") -> Path:
    ws = root / "ws"
    (ws / "tests").mkdir(parents=True)
    (ws / "pkg.py").write_text(PACKAGE)
    if runner == "unittest":
        (ws / "tests" / "__init__.py").write_text("")
        body = (
            IMPORTS
            + "import unittest\nimport pkg\n\n\nclass T(unittest.TestCase):\n"
            + "".join(
                f"    def test_{i}(self):\n        self.assertEqual(pkg.double({i}), {2 * i})\n"
                f"        self.assertEqual(pkg.Money({i}, 'EUR'), pkg.Money({i}, 'EUR'))\n\n"
                for i in range(tests)
            )
        )
    else:
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


def run_once(root: Path, ws: Path, source: bytes | None, expected: int, runner: str = "pytest") -> float:
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ws)}
    setup = None
    written: list[Path] = []
    if source is not None:
        setup = guard_setup(str(root), runner)
        (root / "guard.json").write_bytes(setup.config(str(ws), [str(ws / "pkg.py")]))
        if setup.pth is not None:  # in a user site-packages of root, as in a recycling clean room
            site_dir = root / user_site()
            site_dir.mkdir(parents=True, exist_ok=True)
            written = [site_dir / f"{setup.module}.py", site_dir / setup.pth[0]]
            written[1].write_bytes(setup.pth[1])
            env.update(setup.env({}, str(root)))
        else:
            written = [root / f"{setup.module}.py"]
            env.update(setup.env({}))
            env["PYTHONPATH"] = f"{root}:{ws}"
        written[0].write_bytes(source)
    if runner == "unittest":
        command = [BASE_PYTHON, "-m", "unittest", "discover", "-s", "tests", "-t", "."]
    else:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=ws, env=env, capture_output=True)
    took = time.perf_counter() - start
    passed = f"Ran {expected} tests" if runner == "unittest" else f"{expected} passed"
    if passed.encode() not in proc.stdout + proc.stderr or proc.returncode != 0:
        raise RuntimeError(f"the suite did not pass: {(proc.stdout + proc.stderr)[-500:]!r}")
    if setup is not None:
        log = read_guard_log(proc.stderr, setup.key)
        if not log.ended or log.tampering or len(log.tests) != expected:
            raise RuntimeError(f"the guard's log is not clean: ended={log.ended} tampering={log.tampering[:3]}")
        for path in written:
            path.unlink()
    return took


def baseline_source(rev: str) -> bytes:
    repo = Path(__file__).resolve().parents[4]
    return subprocess.run(["git", "-C", str(repo), "show", f"{rev}:{GUARD_PATH}"], check=True, capture_output=True).stdout


async def run(args: Any) -> dict[str, Any]:
    configs: dict[str, bytes | None] = {"no guard": None}
    if args.runner == "pytest":
        configs[f"guard at {args.baseline}"] = baseline_source(args.baseline)
    configs["guard now"] = GUARD_SOURCE
    expected = args.modules * args.tests
    times: dict[str, list[float]] = {k: [] for k in configs}
    with tempfile.TemporaryDirectory(prefix="guard-bench-") as tmp:
        root = Path(tmp)
        ws = make_suite(root, args.modules, args.tests, args.runner)
        run_once(root, ws, None, expected, args.runner)  # warm the page cache
        for _ in range(args.rounds):
            for name, source in configs.items():
                times[name].append(run_once(root, ws, source, expected, args.runner))
    return {
        "machine": machine(),
        "runner": args.runner,
        "tests": expected,
        "rounds": args.rounds,
        "baseline": args.baseline if args.runner == "pytest" else None,
        "pid": os.getpid(),
        "seconds": times,
    }


def render(results: dict[str, Any]) -> str:
    times: dict[str, list[float]] = results["seconds"]
    base = times["no guard"]
    lines = [
        f"{results.get('runner', 'pytest')}: {results['tests']} tests, {results['rounds']} rounds, machine {results['machine']}",
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
    parser.add_argument("--runner", choices=("pytest", "unittest"), default="pytest")


if __name__ == "__main__":
    bench_cli(__doc__, _arguments, run, render)
