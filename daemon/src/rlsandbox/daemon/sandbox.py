"""One sandbox: a running container and the channel that drives commands inside it."""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rlsandbox.daemon.agent.channel import ChunkCallback
from rlsandbox.daemon.agent.socket_transport import Drop
from rlsandbox.daemon.model import ExecRequest, ExecResult, FileRead, FileStat, FileWrite, FileWriteResult

FILE_OP_TIMEOUT = 60.0


class SandboxChannel(Protocol):
    """What the agent channel and the Engine API exec fallback both provide."""

    @property
    def alive(self) -> bool: ...

    @property
    def closed_reason(self) -> str | None: ...

    info: dict[str, Any]

    async def start(self, timeout: float) -> dict[str, Any]: ...

    async def exec(self, req: ExecRequest, on_chunk: ChunkCallback | None = None) -> ExecResult: ...

    async def write_files(self, files: Sequence[FileWrite], timeout: float) -> list[FileWriteResult]: ...

    async def read_files(self, paths: Sequence[str], max_bytes: int, timeout: float) -> list[FileRead]: ...

    async def stat(self, paths: Sequence[str], timeout: float) -> list[FileStat]: ...

    async def list_dir(self, path: str, *, recursive: bool, max_entries: int, timeout: float) -> tuple[list[FileStat], bool]: ...

    async def close_shell(self, name: str, timeout: float) -> bool: ...

    async def ping(self, timeout: float) -> dict[str, Any]: ...

    async def reset(self, timeout: float) -> dict[str, Any]: ...

    async def close(self, reason: str = "closed") -> None: ...


class Sandbox:
    """A ready container handed out by a pool. Released means destroyed, or, in a recycling pool,
    reset and proven clean by its agent before it serves again (``reuses`` counts that)."""

    __slots__ = (
        "channel", "container_id", "created_at", "host_folder", "image", "mode", "name", "pool", "ready_at", "reuses", "run_as",
        "runtime", "transport", "warm",
    )  # fmt: skip

    def __init__(
        self,
        *,
        container_id: str,
        name: str,
        pool: str,
        channel: SandboxChannel,
        mode: str,
        runtime: str,
        image: str,
        transport: str = "exec",
        host_folder: Path | None = None,
        run_as: str = "",
    ) -> None:
        """``transport``: how the daemon reaches the sandbox: "dial" (the agent dials the daemon's unix socket,
        survives a daemon restart), "attach" (the agent on the container's stdin/stdout) or
        "exec" (Engine API exec, no agent). ``host_folder``: its host folder (read-only inside, at
        the agent socket's mount) where a command run as root can read a file the daemon drops
        (agent/socket_transport.py ``Drop``); ``run_as``: the user the episode's commands run
        as when not root (recycling pools)."""
        self.container_id = container_id
        self.name = name
        self.pool = pool
        self.channel = channel
        self.mode = mode
        self.runtime = runtime
        self.image = image
        self.transport = transport
        self.host_folder = host_folder
        self.run_as = run_as
        self.created_at = time.time()
        self.ready_at = time.monotonic()
        self.reuses = 0
        self.warm = False  # its agent keeps a warm interpreter for clean-room grades (recycling pools)

    @property
    def takes_drops(self) -> bool:
        """Whether a command reads a dropped file as it would its stdin: the sandbox has a host
        folder, and its commands run as root (who alone can read that folder) anyway."""
        return self.host_folder is not None and not self.run_as

    @property
    def alive(self) -> bool:
        return self.channel.alive

    async def untar(
        self, drop: Drop, into: str, *, timeout: float, env: Mapping[str, str] | None = None, cwd: str = ""
    ) -> ExecResult:
        """The sandbox's own ``tar`` extracts ``drop``'s tarball into ``into``, keeping modes: from
        a file linked into its host folder where it takes them (no copy through the agent), from
        its stdin otherwise."""
        argv = ("tar", "-x", "-p", "-C", into, "-f")
        options: dict[str, Any] = {"timeout": timeout, "env": dict(env or {}), "cwd": cwd}
        async with drop.placed(self.host_folder if self.takes_drops else None) as path:
            if path is None:
                return await self.exec(ExecRequest(argv=(*argv, "-"), stdin=drop.data, **options))
            return await self.exec(ExecRequest(argv=(*argv, path), **options))

    async def exec(self, req: ExecRequest, on_chunk: ChunkCallback | None = None) -> ExecResult:
        return await self.channel.exec(req, on_chunk)

    async def write_files(self, files: Sequence[FileWrite], timeout: float = FILE_OP_TIMEOUT) -> list[FileWriteResult]:
        return await self.channel.write_files(files, timeout)

    async def read_files(
        self, paths: Sequence[str], max_bytes: int = 1 << 20, timeout: float = FILE_OP_TIMEOUT
    ) -> list[FileRead]:
        return await self.channel.read_files(paths, max_bytes, timeout)

    async def stat(self, paths: Sequence[str], timeout: float = FILE_OP_TIMEOUT) -> list[FileStat]:
        return await self.channel.stat(paths, timeout)

    async def list_dir(
        self, path: str, *, recursive: bool = False, max_entries: int = 10_000, timeout: float = FILE_OP_TIMEOUT
    ) -> tuple[list[FileStat], bool]:
        return await self.channel.list_dir(path, recursive=recursive, max_entries=max_entries, timeout=timeout)

    async def close_shell(self, name: str, timeout: float = 10.0) -> bool:
        return await self.channel.close_shell(name, timeout)

    def __repr__(self) -> str:
        return f"Sandbox({self.name}, pool={self.pool}, mode={self.mode})"


PREFER_SCAN = 32  # ready sandboxes looked at for a warm (or not warm) one


def prefer_warm(ready: deque[Sandbox], warm: bool) -> None:
    """Bring the first of the next PREFER_SCAN sandboxes of ``ready`` whose ``warm`` is as asked to
    the front of the line (a bounded look: a burst of hand-outs stays O(1) each)."""
    for i, candidate in enumerate(itertools.islice(ready, PREFER_SCAN)):
        if candidate.warm == warm:
            if i:
                del ready[i]
                ready.appendleft(candidate)
            return
