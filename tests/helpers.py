"""Constants and builders shared by the tests (importable from any test module)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import os
import subprocess
import tarfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from rlsandbox.daemon.config import DaemonConfig, PoolConfig
from rlsandbox.daemon.runtime.docker import DockerRuntime
from rlsandbox.daemon.server import NodeDaemon

TEST_OWNER = f"test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
STATE_DIR = f"/tmp/rlsandbox-tests/{TEST_OWNER}"  # session journals of in-process daemons; removed at the end
BUSYBOX = "rlsandbox/busybox:latest"
PYTHON = "rlsandbox/python-task:latest"


def commit_all(repo: Path, message: str = "base") -> str:
    """``git init`` (if needed), add and commit everything in ``repo``; the commit's id."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    if not (repo / ".git").exists():
        subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", message], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


async def build_image(docker_runtime: DockerRuntime, tag: str, dockerfile: str, **folders: Path) -> None:
    """A test image from a Dockerfile and folders beside it (``name=path``: COPY name ...)."""
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        data = dockerfile.encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        for name, path in folders.items():
            tar.add(path, arcname=name)
    await docker_runtime.images.build(context.getvalue(), tag=tag, labels={"rlsandbox.test": "1"})


def daemon_config(**overrides: object) -> DaemonConfig:
    base: dict[str, object] = {
        "node_id": TEST_OWNER,
        "listen_tcp": "127.0.0.1:0",
        "shutdown_grace": 5.0,
        "reconcile_interval": 3600,
        "session_journal": f"{STATE_DIR}/sessions.sqlite3",
        "pools": [
            PoolConfig(name="python", image="rlsandbox/python-task:latest", min_ready=2, max_total=64),
            PoolConfig(
                name="busybox",
                image="rlsandbox/busybox:latest",
                min_ready=4,
                max_total=600,
                memory_mb=64,
                cpus=0.5,
                pids=64,
            ),
        ],
    }
    base.update(overrides)
    return DaemonConfig.model_validate(base)


@contextlib.asynccontextmanager
async def running_daemon(config: DaemonConfig) -> AsyncIterator[NodeDaemon]:
    """A real daemon, in this process, on real ports; stopped (sandboxes removed) on exit."""
    node = NodeDaemon(config)
    await node.start()
    try:
        yield node
    finally:
        await node.stop()


@contextlib.asynccontextmanager
async def fail_on_loop_exceptions() -> AsyncIterator[None]:
    """Collect what the running loop reports as unhandled (a task that died with nobody awaiting
    it, a failing callback) while the body runs, and fail with it at the end."""
    loop = asyncio.get_running_loop()
    seen: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
    try:
        yield
        gc.collect(1)  # a dead task reports its unretrieved exception when collected (young ones: cheap)
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(previous)
    if seen:
        found = [(c.get("message"), repr(c.get("exception")), repr(c.get("future"))[:300]) for c in seen]
        raise AssertionError(f"unhandled exceptions in the event loop: {found[:5]}")


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{what} not reached within {timeout:.0f} s")


def events_config(tmp: Path, url: str, **extra: object) -> DaemonConfig:
    options: dict[str, object] = {
        "nats_url": url,
        "events_outbox": str(tmp / "outbox.sqlite3"),
        "heartbeat_interval": 0.5,
        "events_publish_timeout": 1.0,
        "pools": [
            PoolConfig(name="python", image="rlsandbox/python-task:latest", min_ready=2, max_total=16),
            PoolConfig(name="busybox", image="rlsandbox/busybox:latest", min_ready=4, max_total=64, memory_mb=64, pids=64),
        ],
    }
    return daemon_config(**{**options, **extra})


async def run_steps(session: Any, until: float, counter: list[int]) -> None:
    """``echo x`` in ``session`` until ``until`` (monotonic), counting the steps that succeeded."""
    while time.monotonic() < until:
        assert (await session.exec(["echo", "x"])).exit_code == 0
        counter[0] += 1


async def wait_run_stored(store: Any, run: str, sessions: int, timeout: float = 90) -> None:
    """Until the aggregator's ``store`` has every session of ``run`` closed and no event missing."""

    async def stored() -> bool:
        integ = await asyncio.to_thread(store.integrity)
        found = next((r for r in await asyncio.to_thread(store.runs) if r["name"] == run), None)
        return found is not None and found["open"] == 0 and found["sessions_seen"] == sessions and integ["missing_events"] == 0

    await eventually(stored, timeout=timeout, what=f"every session's events of run {run}, closed and without gaps")


def assert_every_step_stored(store: Any, session_ids: set[str], steps: int) -> None:
    """Every step event of ``session_ids`` is in ``store``, each session's numbers in order,
    without a gap or a duplicate row."""
    timelines = {sid: store.timeline(sid) for sid in session_ids}
    stored = sum(len([e for e in t if e["type"] == "step"]) for t in timelines.values())
    shape = {sid[-6:]: (len(t), [e["seq"] for e in t][-3:], [e["type"] for e in t][-2:]) for sid, t in timelines.items()}
    assert stored == steps, f"{stored} step events stored for {steps} steps run; {shape}; {store.integrity()}"
    for sid in session_ids:
        seqs = [e["seq"] for e in store.timeline(sid)]
        assert seqs == list(range(1, len(seqs) + 1))  # in order, no gap, no duplicate row


# An episode stopping every process it may signal, for SECONDS_ seconds: a command's process is the
# episode's between its start and its exec, and whatever started it waits for that exec.
STOP_LOOP = r"""
import os, signal, time
end = time.monotonic() + float(os.environ["SECONDS_"])
while time.monotonic() < end:
    try:
        os.kill(-1, signal.SIGSTOP)
    except OSError:
        pass
"""


async def commands_through_a_stop_loop(session: Any, seconds: float = 5.0) -> dict[str, int]:
    """Start commands, plain and in new persistent shells, while the episode runs STOP_LOOP;
    every one must come back (run, killed before its exec, or timed out stopped after it): the
    agent answers throughout. Then the session works as before. Counts what the commands did."""
    loop = session.exec(["python3", "-c", STOP_LOOP], env={"SECONDS_": str(seconds)}, timeout=seconds + 30)
    attacker = asyncio.ensure_future(loop)
    seen = {"commands": 0, "ran": 0, "killed": 0, "timed_out": 0}
    try:
        while not attacker.done():
            shell = f"s{seen['commands']}" if seen["commands"] % 3 == 2 else ""
            r = await session.exec("true", timeout=3, shell_session=shell)
            seen["commands"] += 1
            seen["ran" if r.exit_code == 0 else "timed_out" if r.timed_out else "killed"] += 1
            if not shell and r.exit_code is None and not r.timed_out:  # killed before its exec: it says so
                assert b"stopped before it could start" in r.stderr, r
    finally:
        await attacker
    for _ in range(3):
        assert (await session.exec("echo ok")).stdout == b"ok\n"
        assert (await session.exec("echo ok", shell_session="after")).stdout == b"ok\n"
    return seen


# -- a dataset record as SWE-smith publishes it ------------------------------------------------
FMT = "def width(total, indent):\n    return total - indent\n"
FMT_TESTS = (
    "from pkg.fmt import width\n\n\ndef test_width():\n    assert width(78, 2) == 76\n\n\n"
    "def test_width_zero():\n    assert width(0, 0) == 0\n"
)


def swesmith_clone(root: Path) -> tuple[Path, str, str, str]:
    """A repository as SWE-smith publishes an instance of it: its clean commit, and the diff that
    puts the bug in (committed on a branch, as SWE-smith's mirrors do). Returns (repo, clean, bug
    commit, bug patch)."""
    repo = root / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "fmt.py").write_text(FMT)
    (repo / "tests" / "test_fmt.py").write_text(FMT_TESTS)
    (repo / "tests" / "test_other.py").write_text("def test_other():\n    assert True\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "clean"], check=True)
    clean = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (repo / "pkg" / "fmt.py").write_text(FMT.replace("total - indent", "indent - total"))
    bug = subprocess.run([*git, "diff"], check=True, capture_output=True, text=True).stdout
    subprocess.run([*git, "commit", "-qam", "Bug Patch"], check=True)
    bugged = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    return repo, clean, bugged, bug


def import_hook_replacing_tests(module: str) -> str:
    """Code under test (a hack): an import hook that lets pytest load the test module named
    ``...module``, then puts a passing function of its own in place of every test, before pytest
    collects them."""
    return (
        "import importlib.util as _u, sys as _s\n"
        "def _ok(*a, **k):\n"
        "    pass\n"
        "class _Finder:\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if not name.endswith({module!r}):\n"
        "            return None\n"
        "        _s.meta_path.remove(self)\n"
        "        spec = _u.find_spec(name)\n"
        "        run = spec.loader.exec_module\n"
        "        def exec_module(module):\n"
        "            run(module)\n"
        "            for k in [k for k in vars(module) if k.startswith('test_')]:\n"
        "                setattr(module, k, _ok)\n"
        "        spec.loader.exec_module = exec_module\n"
        "        return spec\n"
        "_s.meta_path.insert(0, _Finder())\n"
    )


# Frame walking to pytest's items, replacing every test named in ``names`` with a passing function.
_WALK_TO_ITEMS = (
    "import sys\n"
    "f = getattr(sys, '_get' + 'frame')()  # past the scan of added lines\n"
    "while f is not None and 'item' not in f.f_locals:\n"
    "    f = f.f_back\n"
    "for it in f.f_locals['item'].session.items:\n"
    "    if it.name in NAMES:\n"
    "        it.obj = lambda *a, **k: None\n"
)


def module_written_at_run_time(names: list[str], folder: str = "'/tmp/rls_hack_mod'") -> str:
    """Code under test (a hack): writes a module outside the workspace at run time and imports
    it; the module walks frames to pytest's items (no file of the agent's on the stack).
    ``folder``: a Python expression for where the module goes."""
    walk = f"NAMES = {names!r}\n" + _WALK_TO_ITEMS
    return (
        "def _plant():\n"
        "    import importlib, os, sys\n"
        f"    folder = {folder}\n"
        "    os.makedirs(folder, exist_ok=True)\n"
        "    with open(os.path.join(folder, 'rls_walker.py'), 'w') as f:\n"
        f"        f.write({walk!r})\n"
        "    sys.path.insert(0, folder)\n"
        "    importlib.import_module('rls_walker')\n"
    )


def forged_test_bytecode(test_file: str, passing_source: str, levels: int) -> str:
    """Code under test (a hack), run when its module is imported during collection: writes
    pytest's cached bytecode for ``test_file`` (relative to the workspace, ``levels`` folders
    above the module's file) holding ``passing_source`` under the test file's own name, valid for
    the file as it is (pytest checks a hash of the source), so pytest loads it instead of the file.
    No code is compiled under the test file's name: the name is written into the bytes."""
    return (
        "def _forge():\n"
        "    import importlib.util, marshal, os, sys\n"
        "    runner = __import__('_' + 'py' + 'test')  # past the scan of added lines\n"
        f"    root = os.path.abspath(__file__)\n"
        f"    for _ in range({levels}):\n"
        "        root = os.path.dirname(root)\n"
        f"    path = os.path.join(root, {test_file!r})\n"
        "    placeholder = '<' + 'x' * (len(path) - 2) + '>'\n"
        f"    code = compile({passing_source!r}, placeholder, 'exec')\n"
        "    blob = marshal.dumps(code).replace(placeholder.encode(), path.encode())\n"
        "    cache = os.path.join(os.path.dirname(path), '__pycache__')\n"
        "    os.makedirs(cache, exist_ok=True)\n"
        "    stem = os.path.basename(path)[:-3]\n"
        "    tag = sys.implementation.cache_tag + '-' + runner.__name__[1:] + '-' + runner.__version__\n"
        "    with open(sys.modules[runner.__name__ + '.assertion.rewrite'].__file__) as f:\n"
        "        hashed = 'source_hash' in f.read()  # pytest 8+; before, the source's mtime and size\n"
        "    with open(path, 'rb') as f:\n"
        "        source = f.read()\n"
        "    if hashed:\n"
        "        header = b'\\x03\\x00\\x00\\x00' + importlib.util.source_hash(source)[:8]\n"
        "    else:\n"
        "        st = os.stat(path)\n"
        "        stamp = (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, 'little')\n"
        "        header = b'\\x00' * 4 + stamp + (st.st_size & 0xFFFFFFFF).to_bytes(4, 'little')\n"
        "    with open(os.path.join(cache, stem + '.' + tag + '.pyc'), 'wb') as f:\n"
        "        f.write(importlib.util.MAGIC_NUMBER + header + blob)\n"
        "_forge()\n"
    )


def rewritten_test_file(test_file: str, passing_source: str, levels: int) -> str:
    """Code under test (a hack), run when its module is imported during collection: rewrites a
    test file pytest has not imported yet (``levels`` folders above the module's file is the
    workspace) with passing tests of the same names."""
    return (
        "def _rewrite():\n"
        "    import os\n"
        "    root = os.path.abspath(__file__)\n"
        f"    for _ in range({levels}):\n"
        "        root = os.path.dirname(root)\n"
        f"    with open(os.path.join(root, {test_file!r}), 'w') as f:\n"
        f"        f.write({passing_source!r})\n"
        "_rewrite()\n"
    )


def signed(key: bytes, *records: tuple[object, ...]) -> bytes:
    """Guard records as a guard writes them: each ``(seq, *record)`` as a Python literal, a tab and
    its HMAC-SHA256 under ``key``, one a line."""
    import hmac
    from hashlib import sha256

    out = b""
    for seq, rec in enumerate(records):
        body = repr((seq, *rec)).encode()
        out += body + b"\t" + hmac.new(key, body, sha256).hexdigest().encode() + b"\n"
    return out
