"""The agent's unix socket as a ``ByteTransport``: the daemon listens, the agent dials in.

Used for runc sandboxes: it bypasses dockerd and the containerd shim, which copy every byte of
the attach stream (measured: about 0.6 ms of CPU per command between them), and it outlives a
daemon or dockerd restart. gVisor keeps sockets made inside the sandbox to itself, so runsc
sandboxes use the attach stream instead.

The host side of the boundary (docs/RELIABILITY.md): each sandbox has a host folder that only the
daemon writes, bind-mounted **read-only** into the container. The daemon's listening socket is
the only thing in it, besides the files the daemon links there for one command to read (a
tarball to extract: ``Drop``), which spares copying them through the agent. A program in the
sandbox can connect to that socket (and is then just
another client the daemon refuses unless it completes the handshake, and, when the sandbox's own
programs may be running, unless it is the container's init process), but it cannot create,
replace, redirect or fill anything on the host, so the daemon never opens, follows or removes a
path a sandbox wrote. The agent dials the socket at start and again whenever its daemon goes
away, so a restarted daemon re-creates the socket and its sandboxes come back to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import struct
from collections.abc import AsyncIterator
from pathlib import Path

from rlsandbox.daemon.agent.channel import AgentChannel
from rlsandbox.daemon.errors import SandboxDied
from rlsandbox.daemon.runtime.container import SOCKET_MOUNT

READ_SIZE = 1 << 18
DROP_PREFIX = "drop-"  # files the daemon links into a sandbox's host folder for one command
STAGE_PREFIX = "stage-"  # a Drop's file, next to the sandboxes' folders
DROP_BUDGET = 512 << 20  # bytes all Drops may stage at once (host /run is often a small tmpfs)


class UnixSocketTransport:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def send(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as e:  # the agent's end is gone mid-frame (killed, OOM)
            raise SandboxDied(f"lost the connection to the sandbox's agent while sending: {e}") from e

    async def receive(self) -> tuple[int, bytes] | None:
        try:
            data = await self._reader.read(READ_SIZE)
        except ConnectionError:
            return None
        return (1, data) if data else None

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    def peer_pid(self) -> int | None:
        """The process that connected, as the kernel saw it at connect (host PID namespace)."""
        sock = self._writer.get_extra_info("socket")
        if sock is None:
            return None
        pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        return int(pid)


def prepare_folder(folder: Path) -> None:
    """The sandbox's host folder, made by the daemon (0700). An existing one (a restart) must be
    a real folder, not a symlink: it is only ever written by the daemon."""
    try:
        folder.mkdir(parents=True, mode=0o700)
    except FileExistsError:
        if folder.is_symlink() or not folder.is_dir():
            raise SandboxDied(f"its agent folder {folder} is not a plain folder") from None


def remove_folder(folder: Path, name: str) -> None:
    """Remove a sandbox's host folder: the socket, any file a crash left dropped there, and the
    folder, nothing followed (blocking; call from a thread). The sandbox saw the folder read-only,
    so nothing else can be in it."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        os.unlink(folder / name)
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(folder) as entries:
        for entry in entries:
            if entry.name.startswith(DROP_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
    with contextlib.suppress(FileNotFoundError, NotADirectoryError, OSError):
        os.rmdir(folder)


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)


class Drop:
    """A tarball for sandboxes' commands to read as a file instead of their stdin, which spares
    moving it through each agent's connection (~100 ms per 10 MB, docs/BENCHMARKS.md "Fork").

    It is written once, on the host next to the sandboxes' folders (in none of them: no sandbox
    sees it), the first time a sandbox takes it, and linked into each sandbox's own folder for one
    command (read-only and 0700 there: only root in that sandbox reads it). However many forks
    take one Drop, its bytes are on the host once; and all Drops together stay within
    ``DROP_BUDGET``: past it, or if the host cannot take the file, the tarball goes as stdin.
    Leave the ``async with`` to remove it (``sweep_stages`` removes what a crash left)."""

    budget_left = DROP_BUDGET  # node-wide bytes that may be staged at once

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._staged: Path | None = None
        self._failed = False
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> Drop:
        return self

    async def __aexit__(self, *exc: object) -> None:
        staged, self._staged = self._staged, None
        if staged is not None:
            _STAGED.discard(staged)
            Drop.budget_left += len(self.data)
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(os.unlink, staged)

    async def _stage(self, root: Path) -> Path | None:
        async with self._lock:
            if self._staged is None and not self._failed:
                if len(self.data) > Drop.budget_left:
                    return None  # this one tries again later: others may have left by then
                path = root / (STAGE_PREFIX + secrets.token_hex(8))
                Drop.budget_left -= len(self.data)
                _STAGED.add(path)  # before it exists: a sweep meanwhile must not take it
                try:
                    await asyncio.to_thread(_write_new, path, self.data)
                except BaseException as e:  # a full or read-only host folder (stdin it is), or cancelled
                    Drop.budget_left += len(self.data)
                    _STAGED.discard(path)  # a write cancelled mid-way is the next sweep's
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    if not isinstance(e, OSError):
                        raise
                    self._failed = True
                    return None
                self._staged = path
            return self._staged

    @contextlib.asynccontextmanager
    async def placed(self, folder: Path | None) -> AsyncIterator[str | None]:
        """The tarball's path inside the sandbox whose host folder is ``folder``, for one command;
        None (pass ``data`` as stdin) without a folder, past the budget, or when the host refused."""
        staged = await self._stage(folder.parent) if folder is not None else None
        if folder is None or staged is None:
            yield None
            return
        name = DROP_PREFIX + secrets.token_hex(8)
        try:
            await asyncio.to_thread(os.link, staged, folder / name)
        except OSError:
            yield None
            return
        try:
            yield f"{SOCKET_MOUNT}/{name}"
        finally:
            with contextlib.suppress(FileNotFoundError):
                await asyncio.to_thread(os.unlink, folder / name)


_STAGED: set[Path] = set()  # the staged files of live Drops, in this process


def sweep_stages(root: Path) -> int:
    """Remove the staged files under a node's socket ``root`` that no live Drop holds (a crash
    left them; blocking: call from a thread). Returns how many went."""
    gone = 0
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(root) as entries:
        for entry in entries:
            path = Path(entry.path)
            if entry.name.startswith(STAGE_PREFIX) and path not in _STAGED and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    gone += 1
    return gone


class AgentListener:
    """The daemon's listening socket for one sandbox's agent, until the agent has dialled in."""

    def __init__(self, path: Path, server: asyncio.Server, queue: asyncio.Queue[UnixSocketTransport]) -> None:
        self.path = path
        self._server = server
        self._queue = queue

    @classmethod
    async def open(cls, path: Path) -> AgentListener:
        """Listen at ``path`` (in a folder only the daemon writes), replacing a stale socket."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        queue: asyncio.Queue[UnixSocketTransport] = asyncio.Queue(maxsize=16)

        async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                queue.put_nowait(UnixSocketTransport(reader, writer))
            except asyncio.QueueFull:  # a sandbox flooding its own socket: refused
                writer.close()

        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o077)
        try:
            sock.bind(str(path))
            server = await asyncio.start_unix_server(on_connect, sock=sock, limit=READ_SIZE)
        except BaseException:
            sock.close()  # a folder gone, a path too long: the socket does not leak
            raise
        finally:
            os.umask(old)
        return cls(path, server, queue)

    async def next(self, timeout: float) -> UnixSocketTransport:
        """The next connection (the agent's, or an impostor's the caller's handshake refuses)."""
        try:
            async with asyncio.timeout(timeout):
                return await self._queue.get()
        except TimeoutError:
            raise SandboxDied(f"the sandbox agent did not connect to {self.path} within {timeout:.1f} s") from None

    async def close(self) -> None:
        """Stop listening; connections not taken are closed. The socket file stays (the agent
        finds nobody there until a daemon listens again)."""
        self._server.close()
        while not self._queue.empty():
            await self._queue.get_nowait().close()


HANDSHAKE_TIMEOUT = 2.0  # seconds for one connection to answer the daemon's ping
MAX_HANDSHAKES = 64  # connections tried at once; more are closed at once (a sandbox flooding its socket)


async def accept_agent(listener: AgentListener, name: str, timeout: float, *, agent_pid: int | None = None) -> AgentChannel:
    """The first connection to ``listener`` that completes the handshake, as a started channel.

    A program inside the sandbox may dial the socket too (it is visible there). Connections are
    tried at once, each with its own short deadline: one that resets, sends garbage, speaks
    another protocol or hangs is closed, and cannot hold up the agent, which dials until answered.

    ``agent_pid``: the agent's PID on the host (the container's init); a connection from any other
    process is refused before a byte is read. Needed whenever the sandbox's own programs may be
    running (adoption after a restart): one that speaks the protocol would otherwise pass the
    handshake and answer for the agent. A new sandbox runs nothing of an episode's yet.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = "no connection"
    attempts: set[asyncio.Task[AgentChannel]] = set()

    async def attempt(transport: UnixSocketTransport) -> AgentChannel:
        if agent_pid is not None and (peer := transport.peer_pid()) != agent_pid:
            await transport.close()
            raise SandboxDied(f"a connection from process {peer}, not the sandbox's agent (process {agent_pid})")
        channel = AgentChannel(transport, name=name)
        try:
            await channel.start(timeout=HANDSHAKE_TIMEOUT)
            return channel
        except BaseException:
            with contextlib.suppress(Exception):
                await channel.close("handshake failed")
            raise

    getter: asyncio.Task[UnixSocketTransport] = loop.create_task(listener.next(timeout))
    try:
        while True:
            remaining = deadline - loop.time()
            done, _ = await asyncio.wait({getter, *attempts}, timeout=max(remaining, 0), return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise SandboxDied(f"its agent did not complete the handshake within {timeout:.1f} s (last: {last})")
            for task in done:
                if task is getter:
                    transport = getter.result()  # SandboxDied when nobody connected in time
                    if len(attempts) < MAX_HANDSHAKES:
                        attempts.add(loop.create_task(attempt(transport)))
                    else:
                        await transport.close()
                    getter = loop.create_task(listener.next(max(deadline - loop.time(), 0.01)))
                    continue
                attempts.discard(task)  # type: ignore[arg-type]
                error = task.exception()
                if error is None:
                    return task.result()  # type: ignore[return-value]
                last = f"{type(error).__name__}: {error}"
    finally:
        getter.cancel()
        for task in attempts:
            task.cancel()
        leftovers = await asyncio.gather(getter, *attempts, return_exceptions=True)
        for item in leftovers:  # a handshake that finished while another won: not needed
            if isinstance(item, AgentChannel):
                await item.close("another connection won the handshake")
            elif isinstance(item, UnixSocketTransport):
                await item.close()
