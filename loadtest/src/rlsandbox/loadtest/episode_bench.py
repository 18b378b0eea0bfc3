"""Episode throughput: how many episodes a node serves per second, beside the engine's own churn.

    python -m rlsandbox.loadtest.episode_bench [--seconds 20] [--workers 16] [--json out.json]

In one run, on the python image, each phase on a settled node (the previous phase's refills done):

- engine: raw Engine API cycles, create -> start -> exec `true` -> remove, ``workers`` at once
  (the ceiling of "a fresh container per episode" on this engine);
- short: CreateSession -> Exec `true` -> CloseSession, ``workers`` at once, on a pool of fresh
  sandboxes (every episode a new container);
- short-recycled: the same on a pool with verified recycling (a reset sandbox serves the next
  episode; docs/RELIABILITY.md);
- graded: a session from the small pytest task py-calc -> 3 steps -> clean-room grade -> close,
  ``workers // 2`` at once (graded-recycled: the same in a recycling pool, whose clean rooms fork
  pytest from a warm interpreter; graded-recycled-cold: with the task's ``warm_runner`` off, every
  grade starting its own; graded-recycled-distinct: warm, but every episode a task of its own, so
  every session runs the git reset that the task's next sessions take from the node's cache;
  graded-prefetched: warm, and with the task prefetched, so the session and its clean room are
  hand-outs);
- memory: the idle sandboxes of the fresh and the recycled pool after their phases (cgroup figures);
- burst (not by default): 1,000 CreateSession calls at once from a pool holding 1,000 ready sandboxes;
- handout: CreateSession from a task with a real repository's workspace (pip, setuptools, mypy and
  pytest's sources: ~2,000 files, tens of MB), one at a time: copied in at hand-out, for a task the
  node has not seen (its git reset runs) and for one it has (its reset workspace is extracted),
  against a sandbox prefetched for the task (Prefetch).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import itertools
import os
import tarfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rlsandbox.client import AsyncClient
from rlsandbox.daemon.grading.task import Task, load_tasks, tar_directory, tar_files
from rlsandbox.daemon.model import ContainerSpec, Limits, MiB
from rlsandbox.daemon.runtime.container import container_config
from rlsandbox.daemon.runtime.docker import LABEL_MANAGED, LABEL_OWNER, LABEL_POOL, DockerRuntime
from rlsandbox.loadtest.node import daemon_process, wait_quiet, wait_ready
from rlsandbox.loadtest.stats import bench_cli, latency_table, machine, summary_ms

REPO = Path(__file__).resolve().parents[4]
IMAGE = "rlsandbox/python-task:latest"
CONFIG = """
node_id = "{node}"
listen_tcp = "127.0.0.1:{{port}}"
max_sessions = 1500
shutdown_cleanup = 900.0
[[pools]]
name = "fresh"
image = "{image}"
min_ready = {ready}
max_total = 96
memory_mb = 256
{recycled}
{burst}
[[pools]]
name = "python"
image = "{image}"
min_ready = 8
max_total = 96
"""


Episode = Callable[[dict[str, list[float]]], Awaitable[None]]
GRADED = (
    ("graded", "python"),
    ("graded-recycled-cold", "recycled"),
    ("graded-recycled-distinct", "recycled"),
    ("graded-recycled", "recycled"),
    ("graded-prefetched", "recycled"),
)
GRADED_PHASES = tuple(phase for phase, _ in GRADED)

RECYCLED = """
[[pools]]
name = "recycled"
image = "{image}"
min_ready = {ready}
max_total = 96
memory_mb = 256
read_only_root = true
recycle = true
"""

BURST = """
[[pools]]
name = "burst"
image = "rlsandbox/busybox:latest"
min_ready = {n}
max_total = {total}
memory_mb = 32
cpus = 0.1
pids = 32
"""


async def for_seconds(seconds: float, workers: int, episode: Episode) -> dict[str, Any]:
    """Run ``episode`` back to back in ``workers`` loops for ``seconds``; episodes per second and
    each phase's latency (the episode records its phases)."""
    phases: dict[str, list[float]] = {}
    errors: dict[str, int] = {}
    done = 0
    deadline = time.monotonic() + seconds

    async def loop() -> None:
        nonlocal done
        while time.monotonic() < deadline:
            try:
                await episode(phases)
                done += 1
            except Exception as e:  # counted, not fatal: a benchmark reports what failed
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1

    started = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(workers)))
    elapsed = time.monotonic() - started
    return {
        "episodes": done,
        "seconds": elapsed,
        "episodes_per_s": done / elapsed,
        "errors": errors,
        "phases": {name: summary_ms(v) for name, v in phases.items() if v},
    }


def _timed(phases: dict[str, list[float]], name: str, t0: float) -> float:
    now = time.perf_counter()
    phases.setdefault(name, []).append(now - t0)
    return now


async def engine_cycles(seconds: float, workers: int) -> dict[str, Any]:
    owner = f"episodebench-engine-{os.getpid()}"
    spec = ContainerSpec(image=IMAGE, limits=Limits(memory_bytes=256 * MiB))
    async with DockerRuntime(owner=owner) as runtime:
        n = 0

        async def cycle(phases: dict[str, list[float]]) -> None:
            nonlocal n
            n += 1
            labels = {LABEL_MANAGED: "1", LABEL_OWNER: owner}
            config = container_config(spec, labels=labels, use_agent=False, agent_path=None)
            t0 = time.perf_counter()
            cid = await runtime.create_and_start(config, name=f"rls-episodebench-{os.getpid()}-{n}")
            try:
                t0 = _timed(phases, "create_start", t0)
                code = await runtime.exec_stream(
                    cid, ["true"], cwd=None, env={}, stdin=b"", on_output=lambda _s, _d: None, timeout=30
                )
                assert code == 0, code
                t0 = _timed(phases, "exec", t0)
            finally:
                await runtime.remove(cid)
                _timed(phases, "remove", t0)

        try:
            return await for_seconds(seconds, workers, cycle)
        finally:
            for c in await runtime.list_containers({LABEL_OWNER: owner}):
                await runtime.remove(c.id)


async def short_episodes(client: AsyncClient, pool: str, seconds: float, workers: int) -> dict[str, Any]:
    async def episode(phases: dict[str, list[float]]) -> None:
        t0 = time.perf_counter()
        s = await client.create_session(pool, acquire_timeout=30)
        t0 = _timed(phases, "create", t0)
        try:
            r = await s.exec(["true"])
            assert r.exit_code == 0, r
            t0 = _timed(phases, "exec", t0)
        finally:
            await s.close()
            _timed(phases, "close", t0)

    return await for_seconds(seconds, workers, episode)


async def graded_episodes(
    client: AsyncClient,
    pool: str,
    seconds: float,
    workers: int,
    *,
    prefetch: bool = False,
    warm: bool = True,
    distinct: bool = False,
) -> dict[str, Any]:
    calc = next(t for t in load_tasks(REPO / "tests" / "fixtures" / "tasks") if t.id == "py-calc")
    ev = calc.spec.evaluation.model_copy(update={"warm_runner": warm})
    task: Any = Task(calc.spec.model_copy(update={"pool": pool, "evaluation": ev}), calc.workspace_tar)
    if prefetch:  # a session and a clean room per episode, prepared ahead
        task = await client.prefetch(task, 2 * workers, ttl=120)
        while (task := await client.prefetch(task, 2 * workers, ttl=120)).ready < 2 * workers:
            await asyncio.sleep(0.1)

    episodes = itertools.count()

    async def episode(phases: dict[str, list[float]]) -> None:
        # distinct: every episode a task of its own (a new workspace: its git reset is not kept yet)
        this = Task(task.spec, tar_files({".episode": str(next(episodes))}, task.workspace_tar)) if distinct else task
        t0 = time.perf_counter()
        async with client.session(task=this, acquire_timeout=60) as s:
            t0 = _timed(phases, "create_from_task", t0)
            await s.exec("ls")
            await s.exec("cat calc.py")
            await s.write_files({"calc.py": "def add(a, b):\n    return a + b\n"})
            t0 = _timed(phases, "steps", t0)
            r = await s.grade()
            assert r.status == "ok", r
            t0 = _timed(phases, "grade", t0)
        _timed(phases, "close", t0)

    return await for_seconds(seconds, workers, episode)


def big_repository(pool: str = "fresh") -> Task:
    """A task whose workspace is a real code base: the sources of pip, setuptools, mypy and _pytest as
    installed here (no network), tarred like any task bundle."""
    import json
    import shutil
    import tempfile

    import pip

    site = Path(pip.__file__).parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("pip", "setuptools", "_pytest", "mypy"):
            shutil.copytree(site / name, Path(tmp) / name, ignore=shutil.ignore_patterns("__pycache__"))
        tar = tar_directory(Path(tmp))
    spec = {
        "id": "big-repository",
        "pool": pool,
        "workspace": {"source": "bundle", "path": "/workspace", "git": "reset"},
        "evaluation": {"test_command": "true", "report_format": "exit-code"},
    }
    return Task.from_wire(json.dumps(spec), tar)


async def handouts(client: AsyncClient, samples: int, pool: str) -> dict[str, Any]:
    task = big_repository(pool)
    with tarfile.open(fileobj=io.BytesIO(task.workspace_tar)) as tar:
        files = len(tar.getmembers())
    copied: list[float] = []
    seen: list[float] = []
    for i in range(samples):
        new = Task(task.spec, tar_files({".sample": str(i)}, task.workspace_tar))
        for this, times in ((new, copied), (task, seen)):
            await wait_quiet(client)
            t0 = time.perf_counter()
            s = await client.create_session(task=this, acquire_timeout=60)
            times.append(time.perf_counter() - t0)
            await s.close()
    info = await client.prefetch(task, 2, ttl=300)
    prefetched: list[float] = []
    for _ in range(samples):
        while (info := await client.prefetch(info, 2, ttl=300)).ready < 1:
            await asyncio.sleep(0.05)
        await wait_quiet(client)
        t0 = time.perf_counter()
        s = await client.create_session(task=info)
        prefetched.append(time.perf_counter() - t0)
        await s.close()
    await client.prefetch(info, 0)
    return {
        "workspace_bytes": len(task.workspace_tar),
        "workspace_files": files,
        "copied_at_handout": summary_ms(copied),
        "copied_seen_task": summary_ms(seen),
        "prefetched": summary_ms(prefetched),
    }


BURST_SESSIONS = 1000


async def burst_of_health_checks(address: str, n: int) -> dict[str, Any]:
    """The floor under any burst: ``n`` gRPC health checks at once (no work behind them but the
    daemon's gRPC server and its interceptors), on a channel like the client's."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        await stub.Check(health_pb2.HealthCheckRequest())

        async def one() -> float:
            t0 = time.perf_counter()
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=60)
            return time.perf_counter() - t0

        started = time.perf_counter()
        took = await asyncio.gather(*(one() for _ in range(n)))
        return {"calls": n, "wall_s": time.perf_counter() - started, "check": summary_ms(list(took))}


async def burst_of_creates(client: AsyncClient, n: int) -> dict[str, Any]:
    """``n`` CreateSession calls at once from a pool holding ``n`` ready sandboxes."""

    async def one() -> tuple[float, Any]:
        t0 = time.perf_counter()
        s = await client.create_session("burst", acquire_timeout=60)
        return time.perf_counter() - t0, s

    started = time.perf_counter()
    made = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
    wall = time.perf_counter() - started
    ok = [m for m in made if not isinstance(m, BaseException)]
    errors: dict[str, int] = {}
    for m in made:
        if isinstance(m, BaseException):
            errors[type(m).__name__] = errors.get(type(m).__name__, 0) + 1
    await asyncio.gather(*(s.close() for _, s in ok), return_exceptions=True)
    return {"sessions": n, "wall_s": wall, "create": summary_ms([t for t, _ in ok]), "errors": errors}


async def idle_memory(node: str, pool: str) -> dict[str, Any]:
    """Mean memory of the pool's ready (idle) sandboxes, from the engine's cgroup figures
    (usage less inactive page cache: what the kernel could not reclaim)."""
    async with DockerRuntime(owner=node) as runtime:
        containers = await runtime.list_containers({LABEL_OWNER: node, LABEL_POOL: pool})
        used = []
        for c in containers:
            stats = await runtime.docker.containers.container(c.id).stats(stream=False)
            mem = (stats[0] if isinstance(stats, list) else stats).get("memory_stats", {})
            inactive = (mem.get("stats") or {}).get("inactive_file", 0)
            used.append(max(0, int(mem.get("usage", 0)) - int(inactive)))
    with open("/proc/meminfo") as f:  # noqa: ASYNC230 - one tiny procfs read
        total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    mean = sum(used) / len(used) if used else 0.0
    return {
        "sandboxes": len(used),
        "mean_mb": mean / 2**20,
        "max_mb": max(used, default=0) / 2**20,
        "fit_in_ram": int(total / mean) if mean else 0,
    }


async def bench(seconds: float, workers: int, phases: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {"seconds": seconds, "workers": workers}
    if "engine" in phases:
        results["engine"] = await engine_cycles(seconds, workers)
    recycled = (
        RECYCLED.format(image=IMAGE, ready=workers)
        if any(p.endswith(("recycled", "prefetched", "handout")) for p in phases)
        else ""
    )
    burst = BURST.format(n=BURST_SESSIONS, total=BURST_SESSIONS + 50) if "burst" in phases else ""
    node = f"episodebench-{os.getpid()}"
    config = CONFIG.format(node=node, image=IMAGE, ready=workers, recycled=recycled, burst=burst)
    async with daemon_process(config) as daemon, AsyncClient(daemon.address, timeout=120) as client:
        await wait_ready(client, "fresh", workers, 300)
        for phase, pool in (("short", "fresh"), ("short-recycled", "recycled")):
            if phase in phases:
                await wait_quiet(client)
                results[phase] = await short_episodes(client, pool, seconds, workers)
                if "memory" in phases:
                    await wait_quiet(client)
                    results[f"memory-{pool}"] = await idle_memory(node, pool)
        if "burst" in phases:
            await wait_ready(client, "burst", BURST_SESSIONS, 900)
            await wait_quiet(client, timeout=900)
            results["burst_health"] = await burst_of_health_checks(daemon.address, BURST_SESSIONS)
            results["burst"] = await burst_of_creates(client, BURST_SESSIONS)
        for phase, pool in GRADED:
            if phase in phases:
                await wait_quiet(client)
                prefetch = phase == "graded-prefetched"
                warm = phase != "graded-recycled-cold"
                distinct = phase.endswith("-distinct")
                results[phase] = await graded_episodes(
                    client, pool, seconds, max(1, workers // 2), prefetch=prefetch, warm=warm, distinct=distinct
                )
        if "handout" in phases:
            results["handout"] = await handouts(client, 10, "fresh")
            if recycled:  # the workspace on a tmpfs volume, not on the container's overlay root
                results["handout-recycled"] = await handouts(client, 10, "recycled")
    results["daemon_exit_code"] = daemon.exit_code
    base = results.get("engine", {}).get("episodes_per_s")
    if base:
        for phase in ("short", "short-recycled", *GRADED_PHASES):
            if phase in results:
                results[f"ratio_{phase}_over_engine"] = results[phase]["episodes_per_s"] / base
    results["machine"] = machine()
    return results


def render(r: dict[str, Any]) -> str:
    lines = [f"{r['workers']} workers, {r['seconds']:.0f} s per phase", ""]
    lines += ["| phase | episodes | episodes/s | x engine | errors |", "|---|---|---|---|---|"]
    for phase in ("engine", "short", "short-recycled", *GRADED_PHASES):
        if phase in r:
            p = r[phase]
            ratio = r.get(f"ratio_{phase}_over_engine")
            errors = ", ".join(f"{k} {v}" for k, v in p["errors"].items()) or "none"
            times = f"{ratio:.1f}" if ratio else "1.0"
            lines.append(f"| {phase} | {p['episodes']} | {p['episodes_per_s']:.1f} | {times} | {errors} |")
    rows = [
        (f"{phase}: {name}", s)
        for phase in ("engine", "short", "short-recycled", *GRADED_PHASES)
        if phase in r
        for name, s in r[phase]["phases"].items()
    ]
    lines += ["", *latency_table(rows, digits=1)]
    for pool in ("fresh", "recycled"):
        m = r.get(f"memory-{pool}")
        if m:
            lines.append(
                f"- idle {pool} sandboxes ({m['sandboxes']}): {m['mean_mb']:.1f} MB mean, {m['max_mb']:.1f} MB max "
                f"(~{m['fit_in_ram']:,} would fit in this machine's RAM)"
            )
    if "burst" in r:
        b = r["burst"]
        c = b["create"]
        errors = ", ".join(f"{k} {v}" for k, v in b["errors"].items()) or "no errors"
        lines.append(
            f"- {b['sessions']} CreateSession at once from a warm pool: p50 {c['p50']:.0f} ms, p99 {c['p99']:.0f} ms, "
            f"max {c['max']:.0f} ms, all done in {b['wall_s']:.1f} s; {errors}"
        )
        h = r.get("burst_health")
        if h:
            k = h["check"]
            lines.append(
                f"- the floor, {h['calls']} gRPC health checks at once in the same run: p50 {k['p50']:.0f} ms, "
                f"p99 {k['p99']:.0f} ms, all done in {h['wall_s']:.1f} s (CreateSession p99 / health p99: "
                f"{c['p99'] / k['p99']:.2f})"
            )
    for where, h in (("overlay root, pool fresh", r.get("handout")), ("tmpfs volume, pool recycled", r.get("handout-recycled"))):
        if h is None:
            continue
        mb = h["workspace_bytes"] / 2**20
        lines += [
            "",
            f"Hand-out of a task session, workspace {mb:.1f} MB in {h['workspace_files']} files on the {where}:",
            "",
            *latency_table(
                [
                    ("copied in at hand-out, a new task", h["copied_at_handout"]),
                    ("copied in at hand-out, a task seen before", h["copied_seen_task"]),
                    ("prefetched", h["prefetched"]),
                ],
                digits=1,
            ),
            "",
            f"- prefetched / copied p50: {h['prefetched']['p50'] / h['copied_at_handout']['p50']:.3f}",
            f"- seen / new task copied p50: {h['copied_seen_task']['p50'] / h['copied_at_handout']['p50']:.3f}",
        ]
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument(
        "--phases",
        default="engine,short,short-recycled,graded,graded-recycled-cold,graded-recycled-distinct,graded-recycled,graded-prefetched,"
        "handout,memory",
    )  # also: burst (1,000 CreateSession at once from 1,000 warm busybox sandboxes)


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.seconds, args.workers, args.phases.split(",")), render)


if __name__ == "__main__":
    main()
