"""A GRPO-style rollout loop on rlsandbox, with a scripted policy standing in for the model.

    python examples/grpo_rollouts.py --target 127.0.0.1:7420 [--group 4] [--rounds 2] \
        [--aggregator http://127.0.0.1:7421] [--run my-run]

For each round, on the task (tests/fixtures/tasks/py-calc, a pytest project with a bug):

1. one session starts from the task; the policy reads the code (the shared prefix of the group);
2. ``fork`` makes the group: ``group`` sessions whose files equal that session's, each its own
   sandbox, the task carried over;
3. each member applies its own candidate fix (the "sampled completions") and is graded in a clean
   room, concurrently;
4. rewards become group-relative advantages (reward - group mean) / group std, as GRPO does;
   infra errors (``reward is None``) are masked out of the group, never counted as 0.

The same loop then runs through the Gymnasium adapter (``rlsandbox.integrations.gymnasium``) when
gymnasium is installed. At the end, the aggregator's per-run reward statistics (its HTTP API), when
``--aggregator`` is given. Everything is closed on the way out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import urllib.request
from pathlib import Path
from typing import Any

from rlsandbox.client import AsyncClient, AsyncSession, GradeResult

ROOT = Path(__file__).resolve().parent.parent
TASK_DIR = ROOT / "tests" / "fixtures" / "tasks"
BUG = "def multiply(a, b):\n    return a + b\n"
# The "completions" a policy might sample for the fix: two right, the others wrong.
CANDIDATES = ["a * b", "b * a", "a + b", "abs(a * b)", "a ** b", "a * b * 1", "(a or 0) * b", "a - b"]


def load_task() -> Any:
    from rlsandbox.daemon.grading.task import load_tasks  # resolves the task folder into a spec + tarball

    return {t.id: t for t in load_tasks(TASK_DIR)}["py-calc"]


def advantages(rewards: list[float | None]) -> list[float | None]:
    """GRPO's group-relative advantages; masked members (None) stay None and do not count."""
    kept = [r for r in rewards if r is not None]
    if not kept:
        return [None] * len(rewards)
    mean = statistics.fmean(kept)
    std = statistics.pstdev(kept) or 1.0
    return [None if r is None else (r - mean) / std for r in rewards]


async def member(s: AsyncSession, candidate: str) -> GradeResult:
    src = (await s.read_files(["calc/__init__.py"]))["calc/__init__.py"].data.decode()
    await s.write_files({"calc/__init__.py": src.replace(BUG, f"def multiply(a, b):\n    return {candidate}\n")})
    return await s.grade()


async def client_round(client: AsyncClient, task: Any, group: int, run: str, round_: int) -> list[float | None]:
    async with client.session(task=task, labels={"run": run, "round": str(round_)}) as prefix:
        code = (await prefix.exec("cat calc/__init__.py")).stdout_text  # the policy reads the code
        assert "def multiply" in code
        forks = await prefix.fork(group, labels={"group": f"{run}-{round_}"})
    try:
        candidates = [CANDIDATES[(round_ * group + i) % len(CANDIDATES)] for i in range(group)]
        grades = await asyncio.gather(*(member(s, c) for s, c in zip(forks, candidates, strict=True)))
    finally:
        for s in forks:
            await s.close()
    rewards = [g.reward for g in grades]  # None: infra error, masked
    for c, g, a in zip(candidates, grades, advantages(rewards), strict=True):
        adv = "masked" if a is None else f"{a:+.2f}"
        print(f"  round {round_} {c:<14} -> {g.status:<11} reward {g.reward}  advantage {adv}")
    return rewards


def gymnasium_round(target: str, task: Any, group: int, run: str) -> list[float | None]:
    """The same group through the Gymnasium adapter: one env episode per member."""
    from rlsandbox.integrations.gymnasium import SandboxEnv

    rewards: list[float | None] = []
    for i in range(group):
        env = SandboxEnv(target, tasks=[task], labels={"run": run, "adapter": "gymnasium"})
        try:
            env.reset(seed=i)
            fix = {
                "tool": "edit",
                "path": "calc/__init__.py",
                "old": BUG,
                "new": f"def multiply(a, b):\n    return {CANDIDATES[i]}\n",
            }
            env.step(json.dumps(fix))
            _, reward, terminated, _, info = env.step('{"tool": "submit"}')
            rewards.append(None if "infra_error" in info else float(reward))
            print(f"  gymnasium {CANDIDATES[i]:<14} -> reward {reward}  terminated {terminated}")
        finally:
            env.close()
    return rewards


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="127.0.0.1:7420")
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--run", default="grpo-example")
    parser.add_argument("--aggregator", help="the aggregator's HTTP address, for the run's statistics at the end")
    args = parser.parse_args()
    task = load_task()
    rewards: list[float | None] = []
    async with AsyncClient(args.target, timeout=120) as client:
        print(f"client loop: {args.rounds} round(s) of a group of {args.group} via fork")
        for r in range(args.rounds):
            rewards += await client_round(client, task, args.group, args.run, r)
    try:
        import gymnasium  # noqa: F401
    except ImportError:
        print("gymnasium is not installed: the adapter loop is skipped")
    else:
        print("gymnasium loop: the same group through rlsandbox.integrations.gymnasium")
        rewards += await asyncio.to_thread(gymnasium_round, args.target, task, args.group, args.run)
    kept = [r for r in rewards if r is not None]
    print(f"episodes {len(rewards)}, masked {len(rewards) - len(kept)}, mean reward {statistics.fmean(kept):.3f}")
    if args.aggregator:
        expected = len(rewards) + args.rounds  # each round's prefix session is graded by nobody: not counted
        for _ in range(100):
            runs = await asyncio.to_thread(_get_json, f"{args.aggregator}/v1/runs")
            run = next((x for x in runs if x["name"] == args.run), None)
            if run and (run.get("gradings") or 0) >= len(rewards) and run["open"] == 0:
                break
            await asyncio.sleep(0.2)
        else:
            print(f"aggregator: run {args.run} incomplete: {run}", file=sys.stderr)
            return 1
        print(
            f"aggregator: run {args.run}: {run['sessions_seen']} sessions ({expected} expected), {run['gradings']} gradings, "
            f"mean reward {run['mean_reward']:.3f}, pass rate {run['pass_rate']:.3f}, infra errors {run['infra_errors']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
