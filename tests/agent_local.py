"""Runs the in-sandbox agent as a host subprocess, for agent tests that need no Docker."""

from __future__ import annotations

import asyncio
import sys

from rlsandbox.daemon.agent import AGENT_PATH


class SubprocessTransport:
    """The agent's stdin/stdout pipes as a ``ByteTransport`` (stderr arrives as stream 2)."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._queue: asyncio.Queue[tuple[int, bytes] | None] = asyncio.Queue()
        self._eofs = 0
        self._tasks = [
            asyncio.get_running_loop().create_task(self._pump(proc.stdout, 1)),
            asyncio.get_running_loop().create_task(self._pump(proc.stderr, 2)),
        ]

    @classmethod
    async def start(cls) -> SubprocessTransport:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-u",
            str(AGENT_PATH),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(proc)

    async def _pump(self, reader: asyncio.StreamReader | None, stream: int) -> None:
        assert reader is not None
        while data := await reader.read(65536):
            await self._queue.put((stream, data))
        self._eofs += 1
        if self._eofs == 2:
            await self._queue.put(None)

    async def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def receive(self) -> tuple[int, bytes] | None:
        return await self._queue.get()

    async def close(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
        await self.proc.wait()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
