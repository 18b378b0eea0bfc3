"""The node guard's cost: each JavaScript runner of the fixtures (node --test, mocha, jest) run
without the guard and with it, alternated in one container of the node image, in one run.

    python -m rlsandbox.loadtest.node_guard_bench [--rounds 6] [--json out.json]

Each task's workspace with its hidden tests is copied into the container (tests/fixtures/tasks:
node-calc, node-mocha, node-jest); a round runs every command once plain and once under the guard
(the file the grader loads, its configuration written fresh each time, as root: the guard changes
its ids to be undumpable). Wall time of the whole test command, median of the rounds; this
machine is shared: compare the ratios, not times across runs.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from rlsandbox.daemon.grading.guard import NODE_GUARD_SOURCE
from rlsandbox.loadtest.stats import bench_cli, machine

TASKS = Path(__file__).resolve().parents[4] / "tests" / "fixtures" / "tasks"
IMAGE = "rlsandbox/node:latest"
RUNNERS = {  # name: (fixture folder, command)
    "node --test": ("node-calc", "node --test --test-reporter=tap test/"),
    "mocha": ("node-mocha", "mocha --reporter tap test/"),
    "jest (in band)": ("node-jest", "jest --ci --json --outputFile /tmp/report.json"),
}
SCRIPT = r"""
set -u
now() { date +%s%N; }
for round in $(seq 1 "$ROUNDS"); do
  for name in $NAMES; do
    dir=$(cat "/bench/$name/dir"); cmd=$(cat "/bench/$name/cmd")
    cd "/bench/$dir"
    s=$(now); sh -c "$cmd" > /dev/null 2>&1; plain=$(( ($(now) - s) / 1000000 ))
    cp /bench/guard.json /tmp/guard.json
    export RLSANDBOX_NODE_GUARD_CFG=/tmp/guard.json
    s=$(now); NODE_OPTIONS="--require /bench/guard.js" sh -c "$cmd" > /dev/null 2>/tmp/err  # a file, as a task may
    guarded=$(( ($(now) - s) / 1000000 ))
    records=$(grep -c "'witness'" /tmp/err || true)
    echo "$round $name $plain $guarded $records"
  done
done
"""


async def run(args: Any) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for i, (folder, command) in enumerate(RUNNERS.values()):
            work = root / folder
            if not work.exists():
                shutil.copytree(TASKS / folder / "workspace", work)
                hidden = TASKS / folder / "hidden"
                if hidden.exists():
                    shutil.copytree(hidden, work, dirs_exist_ok=True)
            (root / f"r{i}").mkdir()
            (root / f"r{i}" / "dir").write_text(folder)
            (root / f"r{i}" / "cmd").write_text(command)
        (root / "guard.js").write_bytes(NODE_GUARD_SOURCE)
        (root / "guard.json").write_text(json.dumps({"key": "11" * 32, "workspace": "/bench", "changed": []}))
        env = {"ROUNDS": str(args.rounds), "NAMES": " ".join(f"r{i}" for i in range(len(RUNNERS)))}
        docker = ["docker", "run", "--rm", "--network", "none", "--label", "rlsandbox.loadtest=1", "-v", f"{root}:/bench"]
        docker += [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        argv = [*docker, IMAGE, "sh", "-c", SCRIPT]
        done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"benchmark container failed ({done.returncode}): {done.stderr[-2000:]}")
    names = list(RUNNERS)
    rows: dict[str, dict[str, list[int]]] = {n: {"plain": [], "guarded": [], "witnesses": []} for n in names}
    for line in done.stdout.split("\n"):
        parts = line.split()
        if len(parts) == 5 and parts[1].startswith("r"):
            name = names[int(parts[1][1:])]
            rows[name]["plain"].append(int(parts[2]))
            rows[name]["guarded"].append(int(parts[3]))
            rows[name]["witnesses"].append(int(parts[4]))
    results: dict[str, Any] = {"machine": machine(), "rounds": args.rounds, "image": IMAGE, "runners": {}}
    for name, r in rows.items():
        plain, guarded = statistics.median(r["plain"]), statistics.median(r["guarded"])
        results["runners"][name] = {
            "plain_ms": r["plain"],
            "guarded_ms": r["guarded"],
            "plain_p50_ms": plain,
            "guarded_p50_ms": guarded,
            "ratio": round(guarded / plain, 3) if plain else None,
            "witnesses": max(r["witnesses"] or [0]),
        }
    return results


def render(results: dict[str, Any]) -> str:
    lines = [
        f"node guard cost, {results['rounds']} rounds, {results['image']} ({results['machine']})",
        "| runner | plain p50 | guarded p50 | ratio | witnessed tests |",
        "|---|---|---|---|---|",
    ]
    for name, r in results["runners"].items():
        lines.append(f"| {name} | {r['plain_p50_ms']} ms | {r['guarded_p50_ms']} ms | {r['ratio']} | {r['witnesses']} |")
    return "\n".join(lines)


def add_arguments(parser: Any) -> None:
    parser.add_argument("--rounds", type=int, default=6, help="rounds, each runs every runner plain and guarded")


if __name__ == "__main__":
    bench_cli(__doc__, add_arguments, run, render)
