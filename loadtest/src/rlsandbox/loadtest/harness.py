"""The load-testing harness: scenarios that drive a real daemon through the real client.

    rlsandbox loadtest run [--scenarios sweep,episodes,burst,soak,baseline] [--quick] [--out DIR]

By default it starts its own daemon process (so that its CPU and memory can be read) with the
pools the scenarios need; ``--target`` drives an existing daemon instead (no CPU/RSS, no cold
burst). Scenarios:

- ``sweep``: `true` at increasing concurrency (one python session per in-flight command), closed loop;
- ``episodes``: realistic episodes from the sample task py-calc: create from the task, write and
  read files, mixed shell steps, a test run, a clean-room grade, close;
- ``burst``: a burst of CreateSession on a warm pool, then on a cold one (min_ready 0);
- ``soak``: commands at a constant arrival rate (open loop: latency is measured from the moment
  a command was due, so slowness shows as queueing, not as fewer requests);
- ``baseline``: the same command by Engine API exec, and cold create+start, in the same run;
- ``live`` (not in "all"): hold ``--live-sessions`` sessions of ``--live-pool`` at once, each
  answering a command, and what they cost the host's memory.

Every operation's latency is recorded with its start time; errors are counted by status code; a
sampler reads the node's status (pools, sessions, events) and the daemon's CPU and RSS each
second and prints a progress line. The report is JSON, Markdown and PNG plots.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from rlsandbox.client import AsyncClient, AsyncSession, BatchCommand, SandboxRPCError
from rlsandbox.daemon.grading.task import Task, load_tasks
from rlsandbox.loadtest.node import daemon_process, wait_quiet, wait_ready
from rlsandbox.loadtest.stats import machine, percentile, process_cpu, summary_ms

T = TypeVar("T")
REPO = Path(__file__).resolve().parents[4]
TASKS = REPO / "tests" / "fixtures" / "tasks"

DAEMON = """
node_id = "{node}"
listen_tcp = "127.0.0.1:{{port}}"
max_sessions = 3000
max_waiters_per_pool = 4096
create_concurrency = 4
nats_url = "{nats}"
events_outbox = "{outbox}"
session_journal = "{journal}"
heartbeat_interval = 2.0
[[pools]]
name = "busybox"
image = "rlsandbox/busybox:latest"
min_ready = {busybox_ready}
max_total = 2000
memory_mb = 32
cpus = 0.1
pids = 32
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = {python_ready}
max_total = 1500
[[pools]]
name = "cold"
image = "rlsandbox/python-task:latest"
min_ready = 0
max_total = 64
"""


@dataclass
class Recorder:
    """Latency samples (start offset, seconds) per operation, and errors per (operation, code)."""

    t0: float = field(default_factory=time.perf_counter)
    samples: dict[str, list[tuple[float, float]]] = field(default_factory=lambda: collections.defaultdict(list))
    errors: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)

    async def timed(self, op: str, call: Callable[[], Awaitable[T]], *, due: float | None = None) -> T | None:
        start = time.perf_counter() if due is None else due
        try:
            result = await call()
        except SandboxRPCError as e:
            self.errors[(op, e.code.name)] += 1
            return None
        except Exception as e:  # a client-side failure is an error of the run, not a crash of the harness
            self.errors[(op, type(e).__name__)] += 1
            return None
        self.samples[op].append((start - self.t0, time.perf_counter() - start))
        return result

    def summary(self, op: str) -> dict[str, float]:
        return summary_ms([lat for _, lat in self.samples[op]]) if self.samples[op] else {"n": 0}


@dataclass
class Sampler:
    """Once a second: node status and the daemon's CPU and RSS; prints a progress line."""

    client: AsyncClient
    pid: int | None
    scenario: str = ""
    timeline: list[dict[str, Any]] = field(default_factory=list)
    quiet: bool = False

    def _proc(self) -> tuple[float, int] | None:
        if self.pid is None:
            return None
        cpu = process_cpu(self.pid)
        try:
            with open(f"/proc/{self.pid}/status") as f:
                rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            return None
        return None if cpu is None else (cpu[0], rss)

    async def run(self, rec: Recorder) -> None:
        last_cpu: tuple[float, float] | None = None
        counts_before = 0
        while True:
            now = time.perf_counter()
            point: dict[str, Any] = {"t": now - rec.t0, "scenario": self.scenario}
            with contextlib.suppress(Exception):
                st = await self.client.node_status()
                point["sessions"] = st.sessions
                point["containers"] = sum(p.ready + p.in_use + p.creating for p in st.pools)
                point["pools"] = {p.name: {"ready": p.ready, "in_use": p.in_use} for p in st.pools}
                if st.events is not None:
                    point["events_published"] = st.events.published_total
                    point["events_lag"] = st.events.queued + st.events.outbox_events
            proc = await asyncio.to_thread(self._proc)
            if proc is not None:
                cpu, rss = proc
                point["rss_mb"] = rss / 2**20
                if last_cpu is not None:
                    point["cpu_percent"] = (cpu - last_cpu[1]) / (now - last_cpu[0]) * 100
                last_cpu = (now, cpu)
            self.timeline.append(point)
            done = sum(len(v) for v in rec.samples.values())
            if not self.quiet:
                sys.stderr.write(
                    f"\r[{point['t']:6.1f} s] {self.scenario:<9} ops {done:>7} (+{done - counts_before}/s) "
                    f"errors {sum(rec.errors.values())} sessions {point.get('sessions', '?')} "
                    f"containers {point.get('containers', '?')} cpu {point.get('cpu_percent', 0):5.1f}% "
                    f"rss {point.get('rss_mb', 0):5.0f} MB   "
                )
                sys.stderr.flush()
            counts_before = done
            # The load generator's own garbage collections (tens of ms once it holds many
            # samples) would show up as node latency: what survived this second is frozen out of
            # the collector's way. A benchmark process: the memory this keeps is its samples.
            gc.freeze()
            await asyncio.sleep(max(0.0, 1.0 - (time.perf_counter() - now)))


# -- scenarios ------------------------------------------------------------------------------------
async def _sessions(client: AsyncClient, rec: Recorder, pool: str, n: int, op: str = "create") -> list[AsyncSession]:
    async def create() -> AsyncSession:
        return await client.create_session(pool, acquire_timeout=300)

    made = await asyncio.gather(*(rec.timed(op, create) for _ in range(n)))
    return [s for s in made if s is not None]


async def _loop(rec: Recorder, op: str, s: AsyncSession, stop: float) -> None:
    async def true() -> Any:
        return await s.exec(["true"])

    while time.perf_counter() < stop:
        await rec.timed(op, true)


async def sweep(client: AsyncClient, rec: Recorder, levels: list[int], seconds: float, pool: str) -> list[dict[str, Any]]:
    out = []
    for level in levels:
        sessions = await _sessions(client, rec, pool, level)
        await wait_quiet(client)
        op = f"exec_c{level}"
        stop = time.perf_counter() + seconds
        t = time.perf_counter()
        await asyncio.gather(*(_loop(rec, op, s, stop) for s in sessions))
        elapsed = time.perf_counter() - t
        lat = [x for _, x in rec.samples[op]]
        out.append({"concurrency": level, "throughput": len(lat) / elapsed, **rec.summary(op)})
        await asyncio.gather(*(rec.timed("close", s.close) for s in sessions))
    return out


async def batch(client: AsyncClient, rec: Recorder, sessions_n: int, in_flight: int, seconds: float, pool: str) -> dict[str, Any]:
    """ExecBatch, as a trainer stepping many environments at once: every session runs `true` in
    each call, ``in_flight`` calls at a time. Throughput is commands (not calls) per second."""
    sessions = await _sessions(client, rec, pool, sessions_n)
    await wait_quiet(client)
    requests = [BatchCommand(s.id, ["true"]) for s in sessions]
    commands = failed = 0
    stop = time.perf_counter() + seconds

    async def step_all() -> list[Any]:
        return await client.exec_batch(requests)

    async def caller() -> None:
        nonlocal commands, failed
        while time.perf_counter() < stop:
            results = await rec.timed("exec_batch", step_all)
            if results is not None:
                commands += sum(1 for r in results if not isinstance(r, SandboxRPCError))
                failed += sum(1 for r in results if isinstance(r, SandboxRPCError))

    t = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(in_flight)))
    elapsed = time.perf_counter() - t
    await asyncio.gather(*(rec.timed("close", s.close) for s in sessions))
    return {
        "sessions": len(sessions),
        "in_flight": in_flight,
        "commands_per_second": commands / elapsed,
        "failed_commands": failed,
        **rec.summary("exec_batch"),
    }


async def episodes(client: AsyncClient, rec: Recorder, workers: int, per_worker: int, task: Task, steps: int) -> dict[str, Any]:
    durations: list[float] = []
    rewards: list[float | None] = []

    async def one() -> None:
        t = time.perf_counter()
        s = await rec.timed(
            "episode_create", lambda: client.create_session(task=task, acquire_timeout=300, labels={"run": "loadtest"})
        )
        if s is None:
            return
        try:
            for i in range(steps):
                kind = i % 4
                if kind == 0:
                    await rec.timed("step_shell", lambda: s.exec("ls -la && cat calc/__init__.py | wc -l"))
                elif kind == 1:
                    await rec.timed("step_write", functools.partial(s.write_files, {f"notes/{i}.txt": "x" * 512}))
                elif kind == 2:
                    await rec.timed("step_read", lambda: s.read_files(["calc/__init__.py", "tests/test_basic.py"]))
                else:
                    await rec.timed("step_python", lambda: s.exec(["python3", "-c", "import calc; print(calc.add(2, 3))"]))
            await rec.timed("step_tests", lambda: s.exec("python3 -m pytest -q -p no:cacheprovider tests", timeout=120))
            result = await rec.timed("grade", lambda: s.grade())
            rewards.append(result.reward if result else None)
        finally:
            await rec.timed("episode_close", s.close)
        durations.append(time.perf_counter() - t)

    async def worker() -> None:
        for _ in range(per_worker):
            await one()

    t = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    elapsed = time.perf_counter() - t
    return {
        "workers": workers,
        "episodes": len(durations),
        "steps_per_episode": steps,
        "episodes_per_minute": len(durations) / elapsed * 60,
        "episode_seconds": summary_ms(durations) if durations else {"n": 0},
        "rewards": {"graded": len(rewards), "infra_or_invalid": sum(r is None for r in rewards)},
    }


async def burst(client: AsyncClient, rec: Recorder, n: int, warm_pool: str, cold_pool: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, pool in (("warm", warm_pool), ("cold", cold_pool)):
        if pool is None:
            continue
        await wait_quiet(client)
        before = next(p for p in (await client.node_status()).pools if p.name == pool)
        t = time.perf_counter()
        sessions = await _sessions(client, rec, pool, n, f"burst_{kind}")
        elapsed = time.perf_counter() - t
        after = next(p for p in (await client.node_status()).pools if p.name == pool)
        acquired = after.acquired_total - before.acquired_total
        waited = after.acquired_waited_total - before.acquired_waited_total
        out[kind] = {
            "pool": pool,
            "sessions": len(sessions),
            "seconds": elapsed,
            "per_second": n / elapsed,
            "pool_hit_rate": (1 - waited / acquired) if acquired else None,
            **rec.summary(f"burst_{kind}"),
        }
        await asyncio.gather(*(rec.timed("close", s.close) for s in sessions))
    return out


async def soak(client: AsyncClient, rec: Recorder, rate: float, seconds: float, sessions_n: int, pool: str) -> dict[str, Any]:
    sessions = [
        s
        for s in await asyncio.gather(
            *(rec.timed("create", lambda: client.create_session(pool, acquire_timeout=300)) for _ in range(sessions_n))
        )
        if s
    ]
    await wait_quiet(client)
    start = time.perf_counter()
    total = int(rate * seconds)
    tasks: list[asyncio.Task[Any]] = []
    for i in range(total):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(
            asyncio.create_task(rec.timed("soak_exec", functools.partial(sessions[i % len(sessions)].exec, ["true"]), due=due))
        )
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    await asyncio.gather(*(rec.timed("close", s.close) for s in sessions))
    lat = [x for _, x in rec.samples["soak_exec"]]
    return {
        "rate": rate,
        "seconds": seconds,
        "sessions": len(sessions),
        "completed": len(lat),
        "achieved_rate": len(lat) / elapsed,
        "p99_ms": percentile(lat, 99) * 1e3 if lat else None,
        **rec.summary("soak_exec"),
    }


def _host_memory_used() -> int:
    with open("/proc/meminfo") as f:
        info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    return info["MemTotal"] - info["MemAvailable"]


def _containers_memory() -> int | None:
    """Memory charged to all Docker containers (cgroup v1 'docker' group, or v2 docker scopes)."""
    v1 = Path("/sys/fs/cgroup/memory/docker/memory.usage_in_bytes")
    if v1.exists():
        return int(v1.read_text())
    scopes = list(Path("/sys/fs/cgroup/system.slice").glob("docker-*.scope/memory.current"))
    return sum(int(p.read_text()) for p in scopes) if scopes else None


async def live(client: AsyncClient, rec: Recorder, n: int, pool: str) -> dict[str, Any]:
    """Hold ``n`` sessions of ``pool`` at once, each answering a command; what they cost the host."""
    await wait_quiet(client)
    before = await asyncio.to_thread(_host_memory_used)
    limit = asyncio.Semaphore(32)

    async def create() -> AsyncSession:
        async with limit:
            return await client.create_session(pool, acquire_timeout=600)

    t = time.perf_counter()
    made = await asyncio.gather(*(rec.timed(f"live_create_{pool}", create) for _ in range(n)))
    sessions = [s for s in made if s is not None]
    created_s = time.perf_counter() - t
    answers = await asyncio.gather(*(rec.timed(f"live_exec_{pool}", functools.partial(s.exec, ["echo", "ok"])) for s in sessions))
    answered = sum(1 for a in answers if a is not None and a.stdout == b"ok\n")
    after = await asyncio.to_thread(_host_memory_used)
    containers_memory = await asyncio.to_thread(_containers_memory)
    status = await client.node_status()
    containers = sum(p.ready + p.in_use + p.creating for p in status.pools)
    t = time.perf_counter()
    await asyncio.gather(*(rec.timed("close", s.close) for s in sessions))
    return {
        "pool": pool,
        "asked": n,
        "held": len(sessions),
        "answered": answered,
        "created_s": created_s,
        "closed_s": time.perf_counter() - t,
        "host_memory_used_mb": after / 2**20,
        "host_memory_added_mb": (after - before) / 2**20,
        "containers": containers,
        "containers_memory_mb": None if containers_memory is None else containers_memory / 2**20,
        "memory_mb_per_container": None if containers_memory is None else containers_memory / 2**20 / max(1, containers),
    }


async def baseline(image: str, n: int) -> dict[str, Any]:
    """The same `true` by Engine API exec and by cold create+start, in this run (foundation.run)."""
    from rlsandbox.loadtest import foundation

    r = await foundation.run(image, scale=n / 100)
    return {k: r[k] for k in ("agent_exec_true", "engine_exec_true", "cold_create_to_ready", "warm_acquire")}


# -- the run --------------------------------------------------------------------------------------
@dataclass
class Options:
    scenarios: list[str]
    quick: bool = False
    target: str | None = None
    levels: list[int] = field(default_factory=lambda: [1, 8, 64, 256])
    sweep_seconds: float = 10.0
    episode_workers: int = 8
    episodes_per_worker: int = 3
    episode_steps: int = 12
    burst: int = 32
    soak_rate: float = 300.0
    soak_seconds: float = 60.0
    soak_sessions: int = 64
    batch_sessions: int = 64
    batch_in_flight: int = 2
    batch_seconds: float = 10.0
    baseline_n: int = 100
    live_sessions: int = 1000
    live_pool: str = "busybox"
    quiet: bool = False

    def shrink(self) -> None:
        """The smoke run: every scenario, each a few seconds."""
        self.levels = [1, 4]
        self.sweep_seconds = 1.5
        self.episode_workers, self.episodes_per_worker, self.episode_steps = 2, 1, 4
        self.burst = 4
        self.soak_rate, self.soak_seconds, self.soak_sessions = 40.0, 2.0, 4
        self.batch_sessions, self.batch_seconds = 4, 1.5
        self.baseline_n = 5
        self.live_sessions = 8


async def run(opts: Options) -> dict[str, Any]:
    if opts.quick:
        opts.shrink()
    report: dict[str, Any] = {"machine": machine(), "options": {k: v for k, v in vars(opts).items()}, "scenarios": {}}
    task = next(t for t in load_tasks(TASKS) if t.id == "py-calc")
    async with contextlib.AsyncExitStack() as stack:
        pid: int | None = None
        node_id = f"loadtest-{os.getpid()}"
        if opts.target:
            address = opts.target
        else:
            from rlsandbox.daemon.events.aggregator import Aggregator
            from rlsandbox.daemon.events.nats_server import NatsServer

            tmp = Path(stack.enter_context(__import__("tempfile").TemporaryDirectory()))
            nats = NatsServer(tmp / "js")
            await nats.start()
            stack.push_async_callback(nats.stop)
            agg = Aggregator(nats.url, tmp / "agg.sqlite3")
            agg_task = asyncio.create_task(agg.run())

            async def stop_agg() -> None:
                agg.stop()
                await agg_task

            stack.push_async_callback(stop_agg)
            biggest = max([*opts.levels, opts.soak_sessions, opts.burst, opts.batch_sessions])
            config = DAEMON.format(
                node=node_id,
                nats=nats.url,
                outbox=tmp / "outbox.sqlite3",
                journal=tmp / "sessions.sqlite3",
                busybox_ready=4,
                python_ready=max(4, min(biggest, 64)),
            )
            daemon = await stack.enter_async_context(daemon_process(config))
            pid, address = daemon.pid, daemon.address
            report["daemon"] = daemon
        client = await stack.enter_async_context(AsyncClient(address, timeout=300))
        await wait_ready(client, "python", 1, 300)
        rec = Recorder()
        sampler = Sampler(client, pid, quiet=opts.quiet)
        sampling = asyncio.create_task(sampler.run(rec))
        try:
            for name in opts.scenarios:
                sampler.scenario = name
                started = time.perf_counter()
                if name == "sweep":
                    result: Any = await sweep(client, rec, opts.levels, opts.sweep_seconds, "python")
                elif name == "batch":
                    result = await batch(client, rec, opts.batch_sessions, opts.batch_in_flight, opts.batch_seconds, "python")
                elif name == "episodes":
                    result = await episodes(client, rec, opts.episode_workers, opts.episodes_per_worker, task, opts.episode_steps)
                elif name == "burst":
                    result = await burst(client, rec, opts.burst, "python", None if opts.target else "cold")
                elif name == "soak":
                    result = await soak(client, rec, opts.soak_rate, opts.soak_seconds, opts.soak_sessions, "python")
                elif name == "live":
                    result = await live(client, rec, opts.live_sessions, opts.live_pool)
                elif name == "baseline":
                    result = await baseline("rlsandbox/python-task:latest", opts.baseline_n)
                else:
                    raise ValueError(f"unknown scenario {name!r}")
                report["scenarios"][name] = {"seconds": time.perf_counter() - started, "result": result}
        finally:
            sampling.cancel()
            await asyncio.gather(sampling, return_exceptions=True)
            if not opts.quiet:
                sys.stderr.write("\n")
        report["operations"] = {op: rec.summary(op) for op in sorted(rec.samples)}
        report["errors"] = [{"operation": op, "code": code, "count": n} for (op, code), n in sorted(rec.errors.items())]
        report["timeline"] = sampler.timeline
        report["samples"] = {op: rec.samples[op] for op in rec.samples}
    daemon_proc = report.pop("daemon", None)
    if daemon_proc is not None:
        report["daemon_exit_code"] = daemon_proc.exit_code
        report["leaked_containers"] = await _leaked(node_id)
    return report


async def _leaked(node_id: str) -> int:
    from rlsandbox.daemon.runtime.docker import LABEL_MANAGED, LABEL_OWNER, DockerRuntime

    async with DockerRuntime(owner="loadtest-check") as runtime:
        return len(await runtime.list_containers({LABEL_MANAGED: "1", LABEL_OWNER: node_id}))
