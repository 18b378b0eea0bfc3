"""Mining and auditing benchmark: tasks per hour from a real project's history, and the share of
the mined tasks whose tests accept a wrong patch.

    bash scripts/test_fixtures.sh   # marshmallow's sdists and the wheels its tests need
    pip download --no-deps --no-binary :all: -d .venv/test-fixtures/sdists marshmallow==3.0.2  # more releases
    python -m rlsandbox.loadtest.mining_bench [--sdists .venv/test-fixtures/sdists] [--runs 2] [--json out.json]

A git history is built from the source archives in ``--sdists`` (one commit per release, in
version order: real code, real tests, real changes), an environment image from the wheels of
``.venv/test-fixtures/wheels`` (tasks build-env, offline), and a real daemon process mines it
(``rlsandbox tasks mine`` logic: each commit's tests run ``--runs`` times before and after, in
clean rooms), then audits the tasks it found (``rlsandbox tasks audit`` logic).
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from rlsandbox.client import AsyncClient
from rlsandbox.daemon.grading.audit import audit
from rlsandbox.daemon.grading.mine import history_from_archives, mine
from rlsandbox.daemon.images.environments import build_environment
from rlsandbox.daemon.runtime.docker import DockerRuntime
from rlsandbox.loadtest.node import daemon_process, wait_serving
from rlsandbox.loadtest.stats import bench_cli, machine

REPO = Path(__file__).resolve().parents[4]
FIXTURES = REPO / ".venv" / "test-fixtures"
REQUIREMENTS = ["pytz", "simplejson", "python-dateutil", "setuptools<70"]

CONFIG = """
node_id = "{node}"
listen_tcp = "127.0.0.1:{{port}}"
max_sessions = 200
[image_pools]
idle_evict = 600.0
[[image_pools.templates]]
name = "envs"
image = "rlsandbox-env/*"
min_ready = 0
max_total = 16
"""


def _version(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path.name.rsplit("-", 1)[-1]))


async def bench(sdists: Path, runs: int, concurrency: int) -> dict[str, Any]:
    archives = sorted(sdists.glob("*.tar.gz"), key=_version)  # noqa: ASYNC240 - before anything runs
    if len(archives) < 2:
        raise SystemExit(f"{sdists}: two or more source archives of one project are needed (bash scripts/test_fixtures.sh)")
    results: dict[str, Any] = {"releases": [a.name for a in archives], "runs": runs}
    with tempfile.TemporaryDirectory(prefix="rlsandbox-mining-") as tmp:
        repo = Path(tmp) / "history"
        history_from_archives(archives, repo)
        async with DockerRuntime(owner="rlsandbox-bench", instance="mining") as runtime:
            env = await build_environment(runtime, "mining-bench", REQUIREMENTS, wheelhouse=FIXTURES / "wheels", offline=True)
            try:
                config = CONFIG.format(node=f"minebench-{os.getpid()}")
                async with daemon_process(config) as daemon, AsyncClient(daemon.address, timeout=300) as client:
                    await wait_serving(client)
                    t0 = time.perf_counter()
                    mined = await mine(client, repo, image=env.tag, runs=runs, concurrency=concurrency, env={"PYTHONPATH": "src"})
                    mining_s = time.perf_counter() - t0
                    tasks = [m.task for m in mined if m.task is not None]
                    t0 = time.perf_counter()
                    audited = await audit(client, tasks, concurrency=concurrency)
                    audit_s = time.perf_counter() - t0
            finally:
                await runtime.images.remove(env.tag)
    results["commits"] = len(mined)
    results["tasks"] = len(tasks)
    results["not_tasks"] = {m.commit[:12]: m.reason for m in mined if m.task is None}
    results["mining_seconds"] = mining_s
    results["tasks_per_hour"] = len(tasks) / mining_s * 3600 if mining_s else 0.0
    results["commits_per_hour"] = len(mined) / mining_s * 3600 if mining_s else 0.0
    results["fail_to_pass"] = {t.id: len(t.spec.evaluation.fail_to_pass) for t in tasks}
    results["audit_seconds"] = audit_s
    results["audit"] = audited.to_json()
    counts = audited.counts()
    results["weak_share"] = (counts["weak"] + counts["no_signal"]) / len(tasks) if tasks else 0.0
    results["machine"] = machine()
    return results


def render(r: dict[str, Any]) -> str:
    a = r["audit"]
    lines = [
        f"- history: {len(r['releases'])} releases ({r['releases'][0]} .. {r['releases'][-1]}), {r['commits']} commit(s) "
        f"that change code and tests",
        f"- mined: {r['tasks']} task(s) in {r['mining_seconds']:.1f} s ({r['runs']} runs each side): "
        f"**{r['tasks_per_hour']:.0f} tasks/hour**, {r['commits_per_hour']:.0f} commits/hour; FAIL_TO_PASS per task: "
        f"{r['fail_to_pass']}",
        f"- not tasks: {r['not_tasks'] or 'none'}",
        f"- audited in {r['audit_seconds']:.1f} s ({a['wrong_patches_graded']} wrong patches graded): "
        f"{', '.join(f'{k} {n}' for k, n in a['counts'].items() if n)}; weak or silent share {r['weak_share']:.0%}",
    ]
    for t in a["tasks"]:
        lines.append(f"  - {t['task_id']}: {t['verdict']}; accepted: {'; '.join(t['accepted']) or 'none'}")
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sdists", type=Path, default=FIXTURES / "sdists")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.sdists, args.runs, args.concurrency), render)


if __name__ == "__main__":
    main()
