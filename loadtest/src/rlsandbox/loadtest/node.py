"""A real daemon as its own process, for the benchmarks: start, wait until it settles, stop."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

from rlsandbox.client import AsyncClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_ready(client: AsyncClient, pool: str, ready: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = await client.node_status()
            if next(p for p in status.pools if p.name == pool).ready >= ready:
                return
        except Exception:
            pass
        await asyncio.sleep(0.2)
    raise TimeoutError(f"pool {pool} did not reach {ready} ready sandboxes in {timeout:.0f} s")


async def wait_serving(client: AsyncClient, timeout: float = 120) -> None:
    """Wait until the node answers (a node whose pools are all made on demand has none to wait for)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await client.node_status()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.2)


async def wait_quiet(client: AsyncClient, timeout: float = 300) -> None:
    """Wait until no pool is creating and every pool is at min_ready: refills compete with the
    measured traffic for the two cores, so each phase starts on a quiet node."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = await client.node_status()
        # Full when the pool cannot hold min_ready more next to what is in use.
        if all(p.creating == 0 and p.ready >= min(p.min_ready, p.max_total - p.in_use) for p in status.pools):
            await asyncio.sleep(1.0)
            return
        await asyncio.sleep(0.5)
    raise TimeoutError("the node did not settle")


async def daemon_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:  # noqa: ASYNC230 - tiny procfs read in a benchmark
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def stop_with_parent() -> list[str]:
    """A prefix for a child's argv: SIGTERM to it when the benchmark process dies, so no daemon
    (and none of its sandboxes) outlives a killed benchmark. util-linux's ``setpriv`` sets
    PR_SET_PDEATHSIG and execs the command, which keeps it. Not a ``preexec_fn``: Python code
    between fork and exec deadlocks at times in a process whose other threads hold a lock (grpc's
    do), and the daemon then never starts (a CI run waited 180 s for its pool)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--"] if setpriv else []


class DaemonProcess:
    """``rlsandbox daemon --config`` in a child process; ``exit_code`` is set after it stopped."""

    def __init__(self, process: asyncio.subprocess.Process, address: str) -> None:
        self.process = process
        self.address = address
        self.exit_code: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid


@contextlib.asynccontextmanager
async def daemon_process(config_toml: str) -> AsyncIterator[DaemonProcess]:
    """Run a daemon with ``config_toml`` (``{port}`` is replaced by a free port); SIGTERM at exit."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "daemon.toml"
        config.write_text(config_toml.replace("{port}", str(port)))
        process = await asyncio.create_subprocess_exec(
            *stop_with_parent(), sys.executable, "-m", "rlsandbox.daemon.cli", "--log-level", "WARNING", "daemon",
            "--config", str(config), stdout=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        node = DaemonProcess(process, f"127.0.0.1:{port}")
        try:
            yield node
        finally:
            if process.returncode is None:
                process.terminate()
            await asyncio.wait_for(process.wait(), 300)
            node.exit_code = process.returncode
