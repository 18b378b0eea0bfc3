"""A task with a 50 MB workspace: CreateSession with the task inline (its tarball in every call)
against CreateSession by reference (pushed once to NATS Object Store, fetched once by the node).

    python -m rlsandbox.loadtest.bundle_bench [--mb 50] [--sessions 16] [--json out.json]

A real daemon process with an embedded nats-server. The workspace is ``mb`` MB of random bytes in
200 files (incompressible, as a repository's objects are). Sessions are created one after the
other (the cost per call), then ``sessions`` at once (what a GRPO group or a batch of rollouts
does); each is closed before the next phase. The first by-reference call pays the one fetch.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from rlsandbox.client import AsyncClient, TaskRef
from rlsandbox.loadtest.node import daemon_process, wait_quiet, wait_ready
from rlsandbox.loadtest.stats import bench_cli, latency_table, machine, summary_ms

INLINE_LIMIT = 32 << 20  # the API's limit of a task's workspace sent in a call

CONFIG = """
node_id = "bundlebench-{pid}"
listen_tcp = "127.0.0.1:{{port}}"
session_journal = ""
nats_url = "{nats}"
events_outbox = "{state}/outbox.sqlite3"
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = 20
max_total = 60
"""


def _task(mb: int) -> Any:
    from rlsandbox.daemon.grading.task import EvaluationSpec, Task, TaskSpec, WorkspaceSpec

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(200):
            data = os.urandom(mb * (1 << 20) // 200)
            info = tarfile.TarInfo(f"data/blob{i}.bin")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    spec = TaskSpec(
        id="big-repo",
        pool="python",
        workspace=WorkspaceSpec(git="keep"),  # the transfer measured, not a git commit of 50 MB
        evaluation=EvaluationSpec(test_command="true", report_format="exit-code"),
    )
    return Task(spec, buf.getvalue())


async def bench(mb: int, sessions: int) -> dict[str, Any]:
    import nats
    from rlsandbox.daemon.events.nats_server import NatsServer
    from rlsandbox.daemon.grading.bundles import push

    task = await asyncio.to_thread(_task, mb)
    inline = (task.spec_json(), task.workspace_tar)
    times: dict[str, list[float]] = {"inline": [], "ref": [], "inline_batch": [], "ref_batch": []}
    with tempfile.TemporaryDirectory() as state:
        server = NatsServer(Path(state) / "js")
        await server.start()
        try:
            nc = await nats.connect(server.url)
            t = time.perf_counter()
            ref, _ = await push(nc.jetstream(timeout=120), task)
            push_seconds = time.perf_counter() - t
            await nc.close()
            config = CONFIG.format(pid=os.getpid(), nats=server.url, state=state)
            async with daemon_process(config) as d, AsyncClient(d.address, timeout=300) as client:
                await wait_ready(client, "python", 20, 600)

                async def one(kind: str) -> float:
                    t = time.perf_counter()
                    s = await client.create_session(task=TaskRef(ref) if kind == "ref" else inline)
                    took = time.perf_counter() - t
                    await s.close()
                    return took

                kinds = ("ref", "inline") if len(task.workspace_tar) <= INLINE_LIMIT else ("ref",)
                for kind in kinds:
                    await wait_quiet(client)
                    for _ in range(8):
                        times[kind].append(await one(kind))
                for kind in kinds:
                    await wait_ready(client, "python", 20, 600)
                    await wait_quiet(client)
                    t = time.perf_counter()
                    made = await asyncio.gather(
                        *(client.create_session(task=TaskRef(ref) if kind == "ref" else inline) for _ in range(sessions))
                    )
                    times[f"{kind}_batch"].append(time.perf_counter() - t)
                    for s in made:
                        await s.close()
        finally:
            await server.stop()
    summary = {k: summary_ms(v) for k, v in times.items() if v}
    has_inline = "inline" in summary
    return {
        "mb": mb,
        "sessions": sessions,
        "push_seconds": push_seconds,
        **summary,
        "ref_vs_inline_p50": summary["ref"]["p50"] / summary["inline"]["p50"] if has_inline else None,
        "ref_vs_inline_batch": summary["ref_batch"]["p50"] / summary["inline_batch"]["p50"] if has_inline else None,
        "machine": machine(),
        "at": time.time(),
    }


def render(r: dict[str, Any]) -> str:
    rows = [
        (f"CreateSession, {r['mb']} MB task inline (one at a time)", r.get("inline")),
        ("CreateSession, the same task by ref (one at a time; the first fetches)", r["ref"]),
        (f"{r['sessions']} CreateSession at once, inline", r.get("inline_batch")),
        (f"{r['sessions']} CreateSession at once, by ref", r["ref_batch"]),
    ]
    lines = latency_table([(name, s) for name, s in rows if s])
    if r["ref_vs_inline_p50"] is not None:
        lines.append(
            f"\n- by ref: x{r['ref_vs_inline_p50']:.2f} of inline per call, "
            f"x{r['ref_vs_inline_batch']:.2f} for {r['sessions']} at once"
        )
    else:
        lines.append(f"\n- inline: refused, the workspace is over the API's {INLINE_LIMIT >> 20} MiB for a task sent in a call")
    lines.append(f"- push of the bundle to NATS Object Store: {r['push_seconds'] * 1000:.0f} ms (once)")
    return "\n".join(lines)


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--sessions", type=int, default=16)


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.mb, args.sessions), render)


if __name__ == "__main__":
    main()
