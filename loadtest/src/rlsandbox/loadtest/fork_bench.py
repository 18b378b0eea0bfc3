"""Fork: a GRPO group of 8 from one session, by the daemon's way and by the engine's own.

    python -m rlsandbox.loadtest.fork_bench [--samples 10] [--files 1000] [--file-kb 10] [--json out.json]

A real daemon process (a python pool of 32 warm sandboxes). The source session writes ``files``
files of ``file-kb`` KiB each (10 MB in 1,000 files by default) into its workspace, then:

- ``Fork(8)``: the daemon reads the source's changes through the engine (diff + archive) once and
  extracts them into 8 warm sandboxes (session/fork.py);
- the same with the workspace on a tmpfs volume (a pool with ``workspace_mb``), where writing files
  costs far less than in a container's overlay layer;
- the engine's own way, measured in the same run: ``docker commit`` of the source, then create
  and start 8 containers from the image (a lower bound of that way: a bare ``sleep``, no agent to
  connect, no pool bookkeeping), then remove them and the image;
- the baseline: one warm CreateSession (a hand-out);
- a group of 8 from a fresh task session (``py-calc``): CreateSession from the task, then
  ``Fork(8)``, against one warm hand-out (the target: <= 3x). Nothing has run in the fresh
  session, so its forks are new sessions of the task as far as it has prefetched sandboxes ready:
  with the task prefetched (``Prefetch(task, 9)``, refilled between samples) all nine are
  hand-outs; not prefetched, the forks are copies of the source's workspace; and the same group
  after one ``true`` in the source (copies, as for any session that has run something).

Each sample starts on a quiet node (the pool refilled to 32 ready).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from pathlib import Path
from typing import Any

from rlsandbox.client import AsyncClient, AsyncSession
from rlsandbox.loadtest.node import daemon_process, wait_quiet, wait_ready
from rlsandbox.loadtest.stats import bench_cli, latency_table, machine, summary_ms

POOL_READY = 32
CONFIG = """
node_id = "forkbench-{pid}"
listen_tcp = "127.0.0.1:{{port}}"
session_journal = ""
max_fork_bytes = 268435456
[[pools]]
name = "python"
image = "rlsandbox/python-task:latest"
min_ready = {ready}
max_total = 80
[[pools]]
name = "python-tmpfs"
image = "rlsandbox/python-task:latest"
min_ready = {ready_tmpfs}
max_total = 40
workspace_mb = 256
"""
TASKS = Path(__file__).resolve().parents[4] / "tests" / "fixtures" / "tasks"


async def _write_changes(s: AsyncSession, files: int, kb: int) -> None:
    script = (
        "import os\n"
        f"for i in range({files}):\n"
        "    d = f'/workspace/data/d{i % 20}'\n"
        "    os.makedirs(d, exist_ok=True)\n"
        f"    open(f'{{d}}/f{{i}}.bin', 'wb').write(os.urandom({kb} * 1024))\n"
    )
    r = await s.exec(["python3", "-c", script], timeout=120)
    assert r.exit_code == 0, r.stderr_text


async def _container_of(client: AsyncClient, session_id: str) -> str:
    from rlsandbox.v1 import sandbox_pb2 as pb

    info = await client._stub.GetSession(pb.GetSessionRequest(session_id=session_id), timeout=30)
    return str(info.container_name)


async def _commit_and_create(container: str, count: int) -> float:
    """docker commit + create/start ``count`` containers from the image; seconds until all run."""
    import aiodocker

    async with aiodocker.Docker() as docker:
        t = time.perf_counter()
        image = f"rlsandbox-forkbench:{os.getpid()}-{int(t * 1000)}"
        repo, tag = image.split(":")
        await docker.containers.container(container).commit(repository=repo, tag=tag, pause=False)
        config: dict[str, Any] = {
            "Image": image,
            "Cmd": ["sleep", "3600"],
            "Entrypoint": [],
            "NetworkDisabled": True,
            "Labels": {"rlsandbox.forkbench": "1"},
            "HostConfig": {"NetworkMode": "none", "AutoRemove": False},
        }
        made = await asyncio.gather(*(docker.containers.run(config) for _ in range(count)))
        elapsed = time.perf_counter() - t
        await asyncio.gather(*(c.delete(force=True) for c in made))
        await docker.images.delete(image, force=True)
        return elapsed


async def bench(samples: int, files: int, kb: int) -> dict[str, Any]:
    from rlsandbox.daemon.grading.task import load_tasks

    task = {t.id: t for t in load_tasks(TASKS)}["py-calc"]
    times: dict[str, list[float]] = {
        "fork8": [], "fork8_tmpfs": [], "commit8": [], "handout": [], "task_group8": [], "task_handout": [],
        "task_group8_prefetched": [], "task_group8_copied": [],
    }  # fmt: skip
    copied: dict[str, int] = {}
    async with (
        daemon_process(CONFIG.format(pid=os.getpid(), ready=POOL_READY, ready_tmpfs=12)) as d,
        AsyncClient(d.address, timeout=300) as client,
    ):
        await wait_ready(client, "python", POOL_READY, 600)
        src = await client.create_session("python")
        await _write_changes(src, files, kb)
        container = await _container_of(client, src.id)
        src_tmpfs = await client.create_session("python-tmpfs")
        await _write_changes(src_tmpfs, files, kb)

        async def quiet(prefetched: int = 0) -> None:
            await wait_ready(client, "python", POOL_READY, 600)
            await wait_ready(client, "python-tmpfs", 12, 600)
            if prefetched:
                info = await client.prefetch(task, prefetched, ttl=600)
                while info.ready < prefetched:
                    await asyncio.sleep(0.2)
                    info = await client.prefetch(info, prefetched, ttl=600)
            await wait_quiet(client)

        async def group(name: str, touch: bool = False) -> None:
            t = time.perf_counter()
            base = await client.create_session(task=task)
            if name == "task_group8":
                times["task_handout"].append(time.perf_counter() - t)
            if touch:
                await base.exec("true")
            members = await base.fork(8)
            times[name].append(time.perf_counter() - t)
            for s in (base, *members):
                await s.close()

        for _ in range(samples):
            await quiet()
            t = time.perf_counter()
            forks = await src.fork(8)
            times["fork8"].append(time.perf_counter() - t)
            for f in forks:
                await f.close()
            await quiet()
            t = time.perf_counter()
            forks = await src_tmpfs.fork(8)
            times["fork8_tmpfs"].append(time.perf_counter() - t)
            for f in forks:
                await f.close()
            await quiet()
            times["commit8"].append(await _commit_and_create(container, 8))
            await quiet()
            t = time.perf_counter()
            one = await client.create_session("python")
            times["handout"].append(time.perf_counter() - t)
            await one.close()
            await quiet()
            await group("task_group8")
            await quiet()
            await group("task_group8_copied", touch=True)
            await quiet(prefetched=9)
            await group("task_group8_prefetched")
            await client.prefetch(task, 0)
        check = await client.fork(src.id, 1)
        r = await check[0].exec("find /workspace/data -type f | wc -l; du -sk /workspace/data | cut -f1")
        copied = dict(zip(("files", "kib"), map(int, r.stdout_text.split()), strict=True))
        await check[0].close()
        await src.close()
        await src_tmpfs.close()
    summary = {k: summary_ms(v) for k, v in times.items()}
    return {
        "files": files,
        "file_kb": kb,
        "fork_copy_verified": copied,
        **summary,
        "fork8_vs_commit8": summary["fork8"]["p50"] / summary["commit8"]["p50"],
        "fork8_tmpfs_vs_commit8": summary["fork8_tmpfs"]["p50"] / summary["commit8"]["p50"],
        "fork8_vs_handout": summary["fork8"]["p50"] / summary["handout"]["p50"],
        "task_group8_vs_handout": summary["task_group8"]["p50"] / summary["handout"]["p50"],
        "task_group8_prefetched_vs_handout": summary["task_group8_prefetched"]["p50"] / summary["handout"]["p50"],
        "task_group8_copied_vs_handout": summary["task_group8_copied"]["p50"] / summary["handout"]["p50"],
        "machine": machine(),
        "at": time.time(),
    }


def render(r: dict[str, Any]) -> str:
    mb = r["files"] * r["file_kb"] / 1024
    rows = [
        (f"Fork(8) of a session with {mb:.0f} MB in {r['files']} files (workspace in the container layer)", r["fork8"]),
        ("Fork(8), the same files in a tmpfs workspace (workspace_mb = 256)", r["fork8_tmpfs"]),
        ("docker commit + create/start 8 (engine baseline, no agent)", r["commit8"]),
        ("one warm CreateSession (hand-out)", r["handout"]),
        ("CreateSession from a task (py-calc, not prefetched)", r["task_handout"]),
        ("a group of 8 from a fresh task session (create + Fork(8)), prefetched", r["task_group8_prefetched"]),
        ("a group of 8 from a fresh task session (create + Fork(8)), not prefetched", r["task_group8"]),
        ("the same after one `true` in the source (its workspace copied)", r["task_group8_copied"]),
    ]
    v = r["fork_copy_verified"]
    return "\n".join(
        [
            *latency_table(rows),
            "",
            f"- Fork(8) p50 is x{r['fork8_vs_commit8']:.2f} of commit + create (x{r['fork8_tmpfs_vs_commit8']:.2f} with a tmpfs "
            f"workspace), x{r['fork8_vs_handout']:.1f} of one hand-out",
            f"- a group of 8 from a fresh task session, in units of one warm hand-out: prefetched "
            f"x{r['task_group8_prefetched_vs_handout']:.1f}, not prefetched x{r['task_group8_vs_handout']:.1f}, "
            f"copied x{r['task_group8_copied_vs_handout']:.1f}",
            f"- a fork checked after the run: {v.get('files')} files, {v.get('kib')} KiB in /workspace/data",
        ]
    )


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--file-kb", type=int, default=10)


def main() -> None:
    bench_cli(__doc__, _arguments, lambda args: bench(args.samples, args.files, args.file_kb), render)


if __name__ == "__main__":
    main()
