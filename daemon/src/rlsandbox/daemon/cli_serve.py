"""Subcommands that run services: `daemon`, `up` (daemon + demo episode) and `status`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rlsandbox.daemon.config import DaemonConfig, load_config
from rlsandbox.daemon.errors import FailedPrecondition, SandboxError, Unavailable

log = logging.getLogger("rlsandbox")

DEMO_PROJECT = {
    "calc/__init__.py": "",
    "calc/ops.py": "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n",
    "tests/test_ops.py": (
        "from calc.ops import add, mul\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_mul():\n    assert mul(4, 5) == 20\n"
    ),
}


def _config(args: argparse.Namespace) -> DaemonConfig:
    overrides: dict[str, Any] = {
        "listen_tcp": args.listen,
        "listen_unix": args.unix_socket,
        "node_id": args.node_id,
        "docker_socket": args.docker_socket if args.docker_socket != "/var/run/docker.sock" else None,
    }
    return load_config(args.config, overrides)


async def _daemon(args: argparse.Namespace) -> int:
    from rlsandbox.daemon.process import run_until_signalled
    from rlsandbox.daemon.server import NodeDaemon

    daemon = NodeDaemon(_config(args))
    await run_until_signalled(daemon)
    if daemon.crashed:
        print(f"rlsandbox daemon stopped on its own: {daemon.crashed}", file=sys.stderr)
        return 1
    return 0


async def ensure_docker(socket_path: str, timeout: float = 60.0) -> None:
    """Start dockerd in the background when it is not running and we may (root, installed)."""
    from rlsandbox.daemon.runtime.docker import DockerRuntime

    async with DockerRuntime(owner="up", socket_path=socket_path) as runtime:
        try:
            await runtime.ping(timeout=5)
            return
        except SandboxError:
            pass
        if os.geteuid() != 0 or shutil.which("dockerd") is None:
            raise Unavailable("the Docker engine is not running: run scripts/bootstrap.sh (as root)")
        print("starting dockerd (log: /var/log/rlsandbox-dockerd.log)", flush=True)
        with open("/var/log/rlsandbox-dockerd.log", "ab") as logf:  # noqa: ASYNC230 - once, at start-up
            subprocess.Popen(["dockerd"], stdout=logf, stderr=logf, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            try:
                await runtime.ping(timeout=2)
                return
            except SandboxError:
                continue
    raise Unavailable(f"dockerd did not come up within {timeout:.0f} s; see /var/log/rlsandbox-dockerd.log")


async def ensure_images(config: DaemonConfig, socket_path: str) -> None:
    from rlsandbox.daemon.images import ImageBuilder, default_images_dir
    from rlsandbox.daemon.runtime.docker import DockerRuntime

    async with DockerRuntime(owner="up", socket_path=socket_path) as runtime:
        builder = ImageBuilder(runtime, default_images_dir(), progress=lambda line: print(line, flush=True))
        by_tag = {spec.tag: name for name, spec in builder.specs.items()}
        wanted = sorted({by_tag[p.image] for p in config.pools if p.image in by_tag})
        missing = [p.image for p in config.pools if p.image not in by_tag and await runtime.images.labels(p.image) is None]
        if missing:
            raise FailedPrecondition(f"pool images not found and not in sandbox_images/images.toml: {missing}")
        if wanted:
            await builder.build(wanted)


async def demo_episode(target: str, pool: str) -> bool:
    """A short episode through the real client: write a project, run its tests, print the story."""
    from rlsandbox.client import AsyncClient

    print(f"\n== demo episode on {target} (pool {pool}) ==", flush=True)
    async with AsyncClient(target) as client:
        started = time.perf_counter()
        async with client.session(pool=pool, labels={"run": "demo", "task": "calc"}) as s:
            print(
                f"session {s.id}: {s.info.image} via {s.info.mode}, handed out in {(time.perf_counter() - started) * 1000:.1f} ms"
            )
            await s.write_files(DEMO_PROJECT)
            print(f"wrote {len(DEMO_PROJECT)} files into {s.info.workdir}")
            r = await s.exec("python3 -m pytest -q 2>&1 | tail -3")
            print(f"$ python3 -m pytest -q   -> exit {r.exit_code} in {r.duration * 1000:.0f} ms\n{r.stdout_text.rstrip()}")
            await s.write_files({"calc/ops.py": "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"})
            broken = await s.exec(["python3", "-m", "pytest", "-q", "-x"])
            print(
                f"after breaking add(): pytest exit {broken.exit_code} "
                f"({broken.stdout_text.strip().splitlines()[-1] if broken.stdout else 'no output'})"
            )
            steps = [await s.exec("cd calc && pwd", shell_session="main"), await s.exec("pwd", shell_session="main")]
            print(f"persistent shell keeps its cwd: {steps[1].stdout_text.strip()}")
            timings = []
            for _ in range(50):
                t = time.perf_counter()
                await s.exec(["true"])
                timings.append(time.perf_counter() - t)
            timings.sort()
            print(f"50 x `true`: p50 {timings[25] * 1000:.2f} ms, max {timings[-1] * 1000:.2f} ms")
        print("session closed; its sandbox was destroyed (never reused)")
        graded_ok = await _demo_graded(client, pool)
        ok = r.exit_code == 0 and broken.exit_code not in (0, None) and graded_ok
        print("demo:", "OK" if ok else "FAILED", flush=True)
        return ok


def demo_task(pool: str) -> Any:
    """The demo project as a task: mul() is broken, a hidden test checks it."""
    from rlsandbox.daemon.grading.task import EvaluationSpec, Task, TaskSpec, WorkspaceSpec, tar_files

    files = {**DEMO_PROJECT, "calc/ops.py": "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a + b\n"}
    files["tests/test_ops.py"] = files["tests/test_ops.py"].split("\n\n\ndef test_mul")[0] + "\n"
    spec = TaskSpec(
        id="demo-calc-mul",
        pool=pool,
        problem_statement="calc.ops.mul(a, b) returns the wrong result.",
        workspace=WorkspaceSpec(),
        evaluation=EvaluationSpec(
            test_command="python3 -m pytest -rA -p no:cacheprovider tests",
            hidden_tests={"tests/test_mul.py": "from calc.ops import mul\n\n\ndef test_mul():\n    assert mul(4, 5) == 20\n"},
            test_files=["tests/**"],
            fail_to_pass=["tests/test_mul.py::test_mul"],
            pass_to_pass=["tests/test_ops.py::test_add"],
        ),
    )
    return Task(spec, tar_files(files))


async def _demo_graded(client: Any, pool: str) -> bool:
    """An episode from a task, graded in a clean room: a hack, then a real fix."""
    print("\n-- an episode from a task, graded in a clean room --", flush=True)
    async with client.session(task=demo_task(pool), labels={"run": "demo"}) as s:
        hacked = "def test_add():\n    pass\n\n\ndef test_mul():\n    pass\n"
        await s.write_files({"tests/test_mul.py": hacked, "conftest.py": "import pytest\n"})
        cheat = await s.grade()
        print(f"agent wrote its own tests and a conftest.py: reward {cheat.reward} ({len(cheat.tampering)} changes discarded)")
        await s.write_files({"calc/ops.py": "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n"})
        fixed = await s.grade()
        print(f"agent fixed mul(): reward {fixed.reward}, status {fixed.status}, graded in {fixed.duration * 1000:.0f} ms")
    return cheat.reward == 0.0 and fixed.reward == 1.0


def up_config(args: argparse.Namespace) -> DaemonConfig:
    """``rlsandbox up``'s configuration: the daemon's, with what lives on disk under ``--state-dir``
    (the session journal, unless the configuration names one) and ``--metrics``."""
    config = _config(args)
    state = Path(args.state_dir)
    updates: dict[str, Any] = {}
    if config.session_journal == DaemonConfig.model_fields["session_journal"].default:
        updates["session_journal"] = str(state / "sessions.sqlite3")
    if args.metrics:
        updates["metrics_listen"] = args.metrics
    return DaemonConfig.model_validate({**config.model_dump(), **updates}) if updates else config


async def _up(args: argparse.Namespace) -> int:
    config = up_config(args)
    await ensure_docker(config.docker_socket)
    await ensure_images(config, config.docker_socket)
    async with contextlib.AsyncExitStack() as stack:
        aggregator = None
        if not config.nats_url and not args.no_events:
            embedded = _embedded_events(config, Path(args.state_dir), args.aggregator_http)
            config, aggregator = await stack.enter_async_context(embedded)
        return await _serve_with_demo(config, args, aggregator)
    raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def _embedded_events(
    config: DaemonConfig, state: Path, http: str = "127.0.0.1:7421"
) -> AsyncIterator[tuple[DaemonConfig, Any]]:
    """No NATS configured: a local nats-server with JetStream and an aggregator, for this run, with
    a user per role (events/nats_auth.py: no anonymous publisher, a node posts only its own)."""
    from rlsandbox.daemon.events.aggregator import Aggregator
    from rlsandbox.daemon.events.connection import NatsAuth
    from rlsandbox.daemon.events.nats_auth import write_keys
    from rlsandbox.daemon.events.nats_server import NatsServer, free_port

    port = 4222
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            port = free_port()  # something listens on the default port already: use another one
    keys = write_keys(state / "nats-keys", [config.node_id])
    server = NatsServer(state / "jetstream", port=port, config=keys.server_config)
    await server.start()
    login = NatsAuth(user="aggregator", password_file=str(keys.password_file("aggregator")))
    aggregator = Aggregator(server.url, state / "aggregator.sqlite3", http=http or None, auth=login)
    agg_task = asyncio.create_task(aggregator.run())
    print(
        f"events: embedded nats-server {server.url} (store {state / 'jetstream'}; a user per role, secrets in "
        f"{keys.folder}), aggregator {state / 'aggregator.sqlite3'}"
    )
    try:
        bus = {"nats_url": server.url, "events_outbox": str(state / "events-outbox.sqlite3")}
        bus |= keys.daemon_options(config.node_id)
        updated = config.model_copy(update=bus)
        yield updated, aggregator
    finally:
        aggregator.stop()
        await asyncio.wait_for(agg_task, 30)
        await server.stop()


async def _serve_with_demo(config: DaemonConfig, args: argparse.Namespace, aggregator: Any = None) -> int:
    from rlsandbox.daemon.process import run_until_signalled
    from rlsandbox.daemon.server import NodeDaemon

    daemon = NodeDaemon(config)
    outcome: dict[str, bool] = {}

    async def after_start(d: NodeDaemon) -> None:
        if getattr(args, "no_demo", False):
            print(f"rlsandbox daemon serving on {d.address}; Ctrl-C to stop", flush=True)
            return
        pool = d.pools.get(args.demo_pool)
        deadline = time.monotonic() + 60
        while pool is not None and pool.stats().ready == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # let the warm pool fill, so the demo shows a warm hand-out
        outcome["ok"] = await demo_episode(d.address, args.demo_pool)
        if aggregator is not None:
            await _show_demo_events(aggregator)
        if args.demo_only:
            await d.stop()
        else:
            print(f"\nrlsandbox daemon serving on {d.address}; Ctrl-C to stop", flush=True)

    await run_until_signalled(daemon, on_ready=after_start)
    return 0 if outcome.get("ok", not args.demo_only) else 1


async def _show_demo_events(aggregator: Any, timeout: float = 15.0) -> None:
    """What the aggregator received of the demo run (its sessions closed, rewards counted)."""
    deadline = time.monotonic() + timeout
    row: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        row = next((r for r in await asyncio.to_thread(aggregator.store.runs) if r["name"] == "demo"), None)
        if row is not None and row["open"] == 0 and row.get("gradings"):
            break
        await asyncio.sleep(0.2)
    if row is None:
        print("events: the aggregator has not received the demo's events yet")
        return
    integrity = await asyncio.to_thread(aggregator.store.integrity)
    print(
        f"\nevents: aggregator got run 'demo': {row['sessions_seen']} sessions, {row['steps']} steps, "
        f"{row.get('gradings', 0)} gradings, mean reward {row.get('mean_reward') or 0:.2f}; "
        f"{integrity['events']} events, {integrity['missing_events']} missing, {integrity['duplicates']} duplicates "
        "(rlsandbox stats --db <state-dir>/aggregator.sqlite3)"
    )
    if aggregator.http_port:
        print(f"dashboard: http://127.0.0.1:{aggregator.http_port}/#run=demo (live; metrics at /metrics)")


async def _drain(args: argparse.Namespace) -> int:
    """Stop a node taking new sessions (``--undo``: take them again); with ``--wait``, until its
    open sessions have ended."""
    from rlsandbox.client import AsyncClient

    async with AsyncClient(args.target, timeout=10) as client:
        draining, open_sessions = await client.drain(undo=args.undo)
        print(f"{args.target}: {'draining' if draining else 'taking sessions'}, {open_sessions} session(s) open", flush=True)
        while args.wait and draining and open_sessions:
            await asyncio.sleep(1.0)
            open_sessions = (await client.node_status()).sessions
        if args.wait and draining:
            print(f"{args.target}: drained", flush=True)
    return 0


async def _status(args: argparse.Namespace) -> int:
    from rlsandbox.client import AsyncClient, SandboxRPCError

    async with AsyncClient(args.target, timeout=10) as client:
        previous = None
        shown = 0
        while True:
            try:
                st = await client.node_status()
            except SandboxRPCError as e:
                if not args.watch:
                    raise
                # A live view rides through a restart of the daemon: it says so, and asks again.
                print(f"{args.target}: not answering ({type(e).__name__}: {str(e)[:200]}); asking again", flush=True)
                previous = None
                await asyncio.sleep(args.watch)
                continue
            now = time.monotonic()
            frame = render_status(st, previous)
            if args.watch and sys.stdout.isatty():
                sys.stdout.write("\x1b[H\x1b[J")  # a live view: redraw in place
            print(frame, flush=True)
            shown += 1
            if not args.watch or (args.count and shown >= args.count):
                return 0
            previous = (st, now)
            await asyncio.sleep(args.watch)
            if not sys.stdout.isatty():
                print()


async def _sessions(args: argparse.Namespace) -> int:
    """The node's live sessions, one a line (``--label k=v`` filters, ``--json`` for scripts)."""
    import json

    from rlsandbox.client import AsyncClient

    labels = {}
    for item in args.label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"rlsandbox: --label {item!r}: use KEY=VALUE", file=sys.stderr)
            return 2
        labels[key] = value
    async with AsyncClient(args.target, timeout=10) as client:
        found = await client.list_sessions(labels, pool=args.pool or "")
    if args.json:
        for info in found:
            print(json.dumps({k: getattr(info, k) for k in info.__dataclass_fields__}))
        return 0
    print(f"{'session':40} {'pool':20} {'state':8} {'steps':>5}  task / labels")
    for info in found:
        tags = " ".join(f"{k}={v}" for k, v in sorted(info.labels.items()))
        print(f"{info.session_id[:40]:40} {info.pool[:20]:20} {info.state:8} {info.steps:>5}  {info.task_id or '-'} {tags}")
    print(f"{len(found)} session(s) on {args.target}", file=sys.stderr)
    return 0


async def _exec(args: argparse.Namespace) -> int:
    """Run a command in a live session, its output streamed as it comes; the command's exit code."""
    from rlsandbox.client import AsyncClient, ExecResult

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("rlsandbox: give the command after the session: rlsandbox exec SESSION -- CMD ...", file=sys.stderr)
        return 2
    shell = command[0] if len(command) == 1 else None  # one word: a shell string, as `sh -c` takes it
    async with AsyncClient(args.target, timeout=args.timeout + 30) as client:
        result: ExecResult | None = None
        async for kind, data in client.exec_stream(args.session, shell or command, timeout=args.timeout):
            if isinstance(data, ExecResult):
                result = data
            else:
                stream = sys.stdout.buffer if kind == "stdout" else sys.stderr.buffer
                stream.write(data)
                stream.flush()
    if result is None:
        return 1
    if result.timed_out:
        print(f"rlsandbox: the command timed out after {args.timeout} s", file=sys.stderr)
        return 124
    return result.exit_code if result.exit_code is not None else 128 + (result.signal or 0)


def render_status(st: Any, previous: tuple[Any, float] | None) -> str:
    """A node's status as text; with the previous status and when it was taken, rates too."""
    elapsed = time.monotonic() - previous[1] if previous else 0.0
    before = {p.name: p for p in previous[0].pools} if previous else {}

    def rate(now: float, then: float | None) -> str:
        return f"{(now - then) / elapsed:8.1f}" if then is not None and elapsed > 0 else f"{'-':>8}"

    execs = rate(st.execs_total, previous[0].execs_total if previous else None).strip()
    lines = [
        f"node {st.node_id} v{st.version}: {st.sessions}/{st.max_sessions} sessions, docker "
        f"{'ok' if st.docker_reachable else 'UNREACHABLE'}, load {st.load1:.2f}, {st.execs_total} execs"
        + (f" ({execs}/s)" if previous else ""),
        f"{'pool':<28} {'ready':>5} {'in use':>6} {'creating':>8} {'waiting':>7} {'max':>5} {'failures':>8} "
        f"{'recycled':>8} {'hand-outs/s':>11}  image",
    ]
    for p in st.pools:
        then = before.get(p.name)
        lines.append(
            f"{p.name[:28]:<28} {p.ready:>5} {p.in_use:>6} {p.creating:>8} {p.waiting:>7} {p.max_total:>5} "
            f"{p.failed_total:>8} {p.recycled_total:>8} {rate(p.acquired_total, then.acquired_total if then else None):>11}"
            f"  {p.image}" + (f"  last error: {p.last_error}" if p.last_error else "")
        )
    if st.events is not None:
        e = st.events
        lines.append(
            f"events: {'connected' if e.connected else 'NOT CONNECTED'}, {e.published_total} published, "
            f"{e.queued} queued, {e.outbox_events} in the outbox, {e.dropped_total} dropped"
            + (f"; last error: {e.last_error}" if e.last_error else "")
        )
    return "\n".join(lines)


def _add_daemon_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, default=None, help="TOML config (see deploy/rlsandbox.example.toml)")
    p.add_argument("--listen", default=None, help="TCP host:port (default 127.0.0.1:7420)")
    p.add_argument("--unix-socket", default=None, help="also listen on this unix socket")
    p.add_argument("--node-id", default=None, help="node id (default: host name)")


def add_commands(sub: Any) -> None:
    daemon = sub.add_parser("daemon", help="run the node daemon until SIGTERM")
    _add_daemon_options(daemon)
    daemon.set_defaults(handler=_daemon)
    up = sub.add_parser("up", help="start Docker if needed, build images, run the daemon and a demo episode")
    _add_daemon_options(up)
    up.add_argument("--demo-only", action="store_true", help="stop after the demo episode")
    up.add_argument("--demo-pool", default="python", help="pool of the demo episode (default python)")
    up.add_argument(
        "--state-dir", default="/var/lib/rlsandbox", help="the session journal, embedded NATS store and aggregator database"
    )
    up.add_argument("--no-events", action="store_true", help="no embedded nats-server and aggregator")
    up.add_argument("--no-demo", action="store_true", help="serve without running the demo episode (no 'demo' run)")
    up.add_argument("--aggregator-http", default="127.0.0.1:7421", help="the embedded aggregator's HTTP address ('' for none)")
    up.add_argument("--metrics", default=None, metavar="HOST:PORT", help="serve the daemon's Prometheus metrics here")
    up.set_defaults(handler=_up)
    target = os.environ.get("RLSANDBOX_TARGET", "127.0.0.1:7420")
    target_help = f"the daemon's address (default {target}: $RLSANDBOX_TARGET, else 127.0.0.1:7420)"
    status = sub.add_parser("status", help="show a daemon's pools and sessions")
    status.add_argument("--target", default=target, help=target_help)
    status.add_argument(
        "--watch", type=float, nargs="?", const=2.0, default=0.0, metavar="SECONDS",
        help="a live view: refresh every SECONDS (default 2), with rates",
    )  # fmt: skip
    status.add_argument("--count", type=int, default=0, help="with --watch: stop after this many refreshes")
    status.set_defaults(handler=_status)
    sessions = sub.add_parser("sessions", help="list a daemon's live sessions")
    sessions.add_argument("--target", default=target, help=target_help)
    sessions.add_argument("--label", action="append", metavar="KEY=VALUE", help="only sessions with this label; repeat")
    sessions.add_argument("--pool", default=None, help="only sessions of this pool")
    sessions.add_argument("--json", action="store_true", help="one JSON object a line")
    sessions.set_defaults(handler=_sessions)
    ex = sub.add_parser("exec", help="run a command in a live session: rlsandbox exec SESSION -- CMD ...")
    ex.add_argument("--target", default=target, help=target_help)
    ex.add_argument("--timeout", type=float, default=60.0, help="seconds before the command is killed (default 60)")
    ex.add_argument("session", help="the session's id (rlsandbox sessions)")
    ex.add_argument("command", nargs=argparse.REMAINDER, help="the command (one word: a shell string)")
    ex.set_defaults(handler=_exec)
    drain = sub.add_parser("drain", help="stop a daemon taking new sessions while its open ones go on")
    drain.add_argument("--target", default=target, help=target_help)
    drain.add_argument("--undo", action="store_true", help="take new sessions again")
    drain.add_argument("--wait", action="store_true", help="return once no session is open")
    drain.set_defaults(handler=_drain)
