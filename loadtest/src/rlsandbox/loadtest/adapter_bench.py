"""What each framework adapter adds to a step, against the raw client, in one run.

    python -m rlsandbox.loadtest.adapter_bench [--steps 200] [--rounds 6] [--json out.json]

One daemon, one python-task pool; each adapter keeps one session and runs ``echo x`` as a step, the
way its framework calls it: the raw blocking client (``session.exec``), the shared tool layer
(``integrations.tools.run``), Gymnasium (``SandboxEnv.step``), SkyRL-gym
(``RlsandboxTextEnv.step`` with a ``<bash>`` action), rLLM's ``Sandbox.exec``, and, on the
asynchronous side, the raw ``AsyncClient`` against verl's ``SandboxTool.execute`` and slime's
``Sandbox.exec``. rLLM's and slime's run ``bash -c`` as their own backends do: their raw
counterpart is that command. Rounds interleave the adapters (the machine
is shared and noisy: only the ratios within a round and across rounds are compared); the overhead
is each adapter's p50 and mean over its raw client's. mini-swe-agent's adapter is measured when
``minisweagent`` is importable (its own venv in the tests); it runs commands through
``bash -lc`` as mini-swe-agent's docker environment does, so its raw counterpart is that command.
verifiers 0.4's ``RlsandboxRuntime.run`` (an argv, as its harnesses call it) is measured when
``verifiers.v1`` is importable (its own venv too), against the raw ``AsyncClient`` with that argv.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

from rlsandbox.client import AsyncClient, Client
from rlsandbox.loadtest.node import daemon_process, wait_ready
from rlsandbox.loadtest.stats import bench_cli, machine, summary_ms

CONFIG = """
node_id = "adapterbench"
listen_tcp = "127.0.0.1:{port}"
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = 8
max_total = 24
"""
COMMAND = "echo x"

Step = Callable[[], Any]


def _sync_steps(address: str) -> tuple[dict[str, Step], Callable[[], None]]:
    """The blocking adapters, each with its own session, and how to end them all."""
    from rlsandbox.integrations import tools
    from rlsandbox.integrations.gymnasium import SandboxEnv
    from rlsandbox.integrations.rllm import RlsandboxSandbox

    client = Client(address)
    raw = client.create_session("python")
    core = client.create_session("python")
    env = SandboxEnv(address, pool="python", max_steps=10**9)
    env.reset(seed=0)
    rllm = RlsandboxSandbox("bench", target=address, pool="python")
    steps: dict[str, Step] = {
        "raw client": lambda: raw.exec(COMMAND),
        "tools.run": lambda: tools.run(core, COMMAND),
        "gymnasium": lambda: env.step(COMMAND),
        "raw client, bash -c": lambda: raw.exec(["bash", "-c", COMMAND]),
        "rLLM Sandbox": lambda: rllm.exec(COMMAND),
    }
    closers: list[Callable[[], object]] = [raw.close, core.close, env.close, rllm.close]
    try:
        from rlsandbox.integrations.skyrl import RlsandboxTextEnv

        sky = RlsandboxTextEnv({"target": address}, {"pool": "python", "max_turns": 10**9})
        sky.init([])
        steps["skyrl-gym"] = lambda: sky.step(f"<bash>{COMMAND}</bash>")
        closers.append(sky.close)
    except ImportError:  # pragma: no cover - skyrl-gym is in requirements-dev.txt
        pass
    try:
        from rlsandbox.integrations.minisweagent import RlsandboxEnvironment

        mini = RlsandboxEnvironment(target=address, pool="python")
        login = client.create_session("python")
        steps["raw client, bash -lc"] = lambda: login.exec(["bash", "-lc", COMMAND])
        steps["mini-swe-agent"] = lambda: mini.execute({"command": COMMAND})
        closers += [login.close, mini.cleanup]
    except ImportError:
        pass

    def close() -> None:
        for c in closers:
            c()
        client.close()

    return steps, close


def _time(step: Step, n: int) -> list[float]:
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        took.append(time.perf_counter() - t0)
    return took


async def _time_async(step: Callable[[], Any], n: int) -> list[float]:
    took = []
    for _ in range(n):
        t0 = time.perf_counter()
        await step()
        took.append(time.perf_counter() - t0)
    return took


async def bench(steps: int, rounds: int) -> dict[str, Any]:
    from rlsandbox.integrations.slime import RlsandboxSandbox
    from rlsandbox.integrations.verl import SandboxTool

    samples: dict[str, list[float]] = {}
    async with daemon_process(CONFIG) as daemon, AsyncClient(daemon.address, timeout=120) as client:
        await wait_ready(client, "python", 8, 300)
        sync, close = await asyncio.to_thread(_sync_steps, daemon.address)
        raw_async = await client.create_session("python")
        tool = SandboxTool({"target": daemon.address})
        trajectory, _ = await tool.create(pool="python")
        slime = await RlsandboxSandbox(pool="python", target=daemon.address).__aenter__()
        async_steps: dict[str, Callable[[], Any]] = {
            "async raw client": lambda: raw_async.exec(COMMAND),
            "verl SandboxTool": lambda: tool.execute(trajectory, {"action": "bash", "command": COMMAND}),
            "async raw client, bash -c": lambda: raw_async.exec(["bash", "-c", COMMAND]),
            "slime Sandbox": lambda: slime.exec(COMMAND),
        }
        runtime = await _verifiers_runtime(client)
        if runtime is not None:
            raw_argv = await client.create_session("python")
            async_steps["async raw client, argv"] = lambda: raw_argv.exec(COMMAND.split())
            async_steps["verifiers.v1 Runtime.run"] = lambda: runtime.run(COMMAND.split(), {})
        try:
            for step in sync.values():  # warm every path once
                await asyncio.to_thread(_time, step, 5)
            for astep in async_steps.values():
                await _time_async(astep, 5)
            for r in range(rounds):
                names = list(sync)
                names = names[r % len(names) :] + names[: r % len(names)]  # a different order each round
                for name in names:
                    samples.setdefault(name, []).extend(await asyncio.to_thread(_time, sync[name], steps))
                anames = list(async_steps)[:: 1 if r % 2 == 0 else -1]
                for name in anames:
                    samples.setdefault(name, []).extend(await _time_async(async_steps[name], steps))
        finally:
            await tool.release(trajectory)
            await tool.aclose()
            await slime.__aexit__(None, None, None)
            await raw_async.close()
            if runtime is not None:
                await runtime.session.close()
                await raw_argv.close()
            await asyncio.to_thread(close)
    results: dict[str, Any] = {"steps_per_round": steps, "rounds": rounds, "adapters": {}}
    baselines = {
        "tools.run": "raw client",
        "gymnasium": "raw client",
        "skyrl-gym": "raw client",
        "mini-swe-agent": "raw client, bash -lc",
        "verl SandboxTool": "async raw client",
        "rLLM Sandbox": "raw client, bash -c",
        "slime Sandbox": "async raw client, bash -c",
        "verifiers.v1 Runtime.run": "async raw client, argv",
    }
    for name, took in samples.items():
        entry: dict[str, Any] = {"latency": summary_ms(took), "mean_ms": statistics.fmean(took) * 1e3}
        base = baselines.get(name)
        if base in samples:
            b = samples[base]
            entry["baseline"] = base
            entry["overhead_p50"] = summary_ms(took)["p50"] / summary_ms(b)["p50"] - 1
            entry["overhead_mean"] = statistics.fmean(took) / statistics.fmean(b) - 1
        results["adapters"][name] = entry
    results["machine"] = machine()
    return results


async def _verifiers_runtime(client: AsyncClient) -> Any:
    """verifiers 0.4's runtime over a session of the pool, when verifiers.v1 is importable."""
    try:
        from rlsandbox.integrations.verifiers_v1 import RlsandboxRuntime
    except ImportError:
        return None
    return RlsandboxRuntime(await client.create_session("python"), owned=True)


def render(r: dict[str, Any]) -> str:
    lines = [
        f"{r['rounds']} rounds x {r['steps_per_round']} steps of `{COMMAND}` per adapter, interleaved",
        "",
        "| adapter | p50 ms | p90 ms | mean ms | against | overhead p50 | overhead mean |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, e in r["adapters"].items():
        lat = e["latency"]
        against = e.get("baseline", "")
        p50 = f"{100 * e['overhead_p50']:+.1f}%" if "overhead_p50" in e else ""
        mean = f"{100 * e['overhead_mean']:+.1f}%" if "overhead_mean" in e else ""
        lines.append(f"| {name} | {lat['p50']:.2f} | {lat['p90']:.2f} | {e['mean_ms']:.2f} | {against} | {p50} | {mean} |")
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=200, help="steps per adapter per round")
    parser.add_argument("--rounds", type=int, default=6)


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.steps, args.rounds), render)


if __name__ == "__main__":
    main()
