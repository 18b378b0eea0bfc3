"""A multiplexed request channel to one in-sandbox agent over a byte transport.

The transport is the agent's unix socket or the container's attached stdin/stdout in production
and a plain subprocess pipe in unit tests; the channel does not care which.

A keyed channel (the attach stream, which a root process in a gVisor sandbox can open through
/proc/1/fd) tags every frame under a key it sends first, before anything runs in the sandbox
(``sandbox_agent.py`` has the wire format). Anything written into the stream or read out of it
from inside the sandbox then shows: ``tampered`` says how, and the sandbox counts as dead of the
episode's own doing.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rlsandbox.daemon.agent import protocol as p
from rlsandbox.daemon.errors import AgentProtocolError, DeadlineExceeded, FailedPrecondition, InvalidArgument, SandboxDied
from rlsandbox.daemon.model import ExecRequest, ExecResult, FileRead, FileStat, FileWrite, FileWriteResult, OutputChunk

log = logging.getLogger(__name__)

ChunkCallback = Callable[[OutputChunk], None]

# Slack on top of a command's own timeout before the daemon stops waiting for the agent: the agent
# kills the command at its timeout and answers; only a wedged agent needs this.
REPLY_SLACK = 10.0
# A keyed channel whose answer did not come pings its agent before giving up, this long: a frame
# read away from inside the sandbox then shows as the ping's (or the agent's) broken numbering.
PROBE_TIMEOUT = 3.0
STDERR_TAIL = 4096


class ByteTransport(Protocol):
    async def send(self, data: bytes) -> None: ...

    async def receive(self) -> tuple[int, bytes] | None:
        """Next chunk as ``(1 for stdout or 2 for stderr, data)``; ``None`` at end of stream."""
        ...

    async def close(self) -> None: ...


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class _Pending:
    __slots__ = ("future", "on_chunk", "stderr", "stdout")

    def __init__(self, future: asyncio.Future[tuple[dict[str, Any], bytes]], on_chunk: ChunkCallback | None) -> None:
        self.future = future
        self.on_chunk = on_chunk
        self.stdout: list[bytes] = []
        self.stderr: list[bytes] = []


class AgentChannel:
    """Requests to one agent, many in flight, answered by request id."""

    def __init__(self, transport: ByteTransport, *, name: str, keyed: bool = False) -> None:
        self._transport = transport
        self._name = name
        self._keyed = keyed
        self._decoder = p.FrameDecoder()
        self._sealer: p.FrameSealer | None = None
        # Why a keyed stream counts as tampered with from inside the sandbox; None if it does not.
        self.tampered: str | None = None
        self._pending: dict[int, _Pending] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._closed_reason: str | None = None
        self.stderr_tail = b""
        self.info: dict[str, Any] = {}
        self._background: set[asyncio.Task[None]] = set()

    @property
    def alive(self) -> bool:
        return self._closed_reason is None

    @property
    def closed_reason(self) -> str | None:
        return self._closed_reason

    async def start(self, timeout: float) -> dict[str, Any]:
        """Start reading and wait until the agent answers a ping; returns its hello facts."""
        self._reader = asyncio.get_running_loop().create_task(self._read_loop(), name=f"agent-reader-{self._name}")
        if self._keyed:
            key = secrets.token_bytes(32)
            self._decoder.authenticate(key, p.TO_DAEMON)
            await self.request(p.K_KEY, {"key": key.hex()}, timeout=timeout)
        meta, _ = await self.request(p.K_PING, {}, timeout=timeout)
        if meta.get("protocol") != p.PROTOCOL_VERSION:
            raise AgentProtocolError(f"agent in {self._name} speaks protocol {meta.get('protocol')}, not {p.PROTOCOL_VERSION}")
        self.info = meta
        return meta

    async def request(
        self,
        kind: int,
        meta: dict[str, Any],
        body: bytes = b"",
        *,
        timeout: float,
        on_chunk: ChunkCallback | None = None,
    ) -> tuple[dict[str, Any], bytes]:
        if self._closed_reason is not None:
            raise SandboxDied(f"sandbox {self._name} is gone: {self._closed_reason}", container_id=self._name)
        rid = next(self._ids) & 0xFFFFFFFF
        future: asyncio.Future[tuple[dict[str, Any], bytes]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = _Pending(future, on_chunk)
        try:
            try:
                frame = self._encode(kind, rid, meta, body)
            except p.ProtocolError as e:
                raise InvalidArgument(f"request too large for the sandbox agent: {e}") from None
            # Sending counts against the deadline too (an agent that stops reading must not hold
            # the caller); the send itself is shielded, so a frame is never cut in the middle.
            send = asyncio.ensure_future(self._transport.send(frame))
            send.add_done_callback(_retrieve)
            try:
                async with asyncio.timeout(timeout):
                    await asyncio.shield(send)
                    result_meta, result_body = await asyncio.shield(future)
            except TimeoutError:
                if self._sealer is not None and kind != p.K_PING and self.alive:
                    await self._probe()
                if self._closed_reason is not None:
                    raise SandboxDied(f"sandbox {self._name} is gone: {self._closed_reason}", container_id=self._name) from None
                raise DeadlineExceeded(
                    f"sandbox {self._name} did not answer within {timeout:.1f} s", container_id=self._name
                ) from None
            except asyncio.CancelledError:
                if kind == p.K_EXEC and self.alive:
                    self._cancel_remote(rid)
                raise
        finally:
            self._pending.pop(rid, None)
            # A caller cancelled (or timed out) while the channel died: the shielded future's
            # exception has nobody left to read it; read it here, now or when it comes.
            if future.done():
                _retrieve(future)
            else:
                future.add_done_callback(_retrieve)
        return result_meta, result_body

    def _cancel_remote(self, rid: int) -> None:
        """Ask the agent to kill a command whose caller went away. The send is a tracked task
        (awaited in :meth:`close`): the caller is being cancelled and cannot await it."""
        frame = self._encode(p.K_CANCEL, 0, {"target": rid})
        task = asyncio.get_running_loop().create_task(self._transport.send(frame))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _encode(self, kind: int, rid: int, meta: dict[str, Any], body: bytes = b"") -> bytes:
        """One frame, tagged on a keyed stream. Frames are tagged in the order they are sent: each
        send is started (in that order) by the caller of this, at once."""
        frame = p.encode_frame(kind, rid, p.dumps(meta), body, self._sealer)
        if kind == p.K_KEY:  # the key goes bare, once, first; every frame after it is tagged
            self._sealer = p.FrameSealer(bytes.fromhex(meta["key"]), p.TO_AGENT)
        return frame

    async def _probe(self) -> None:
        """An answer did not come on a keyed stream: ping the agent. If a frame was read away from
        inside the sandbox, the ping's number (the agent checks it) or its answer's (this side
        does) is off, and the channel ends as tampered with."""
        try:
            await self.request(p.K_PING, {}, timeout=PROBE_TIMEOUT)
        except Exception as e:
            log.warning("sandbox %s: no answer to a probe after a missing answer: %s", self._name, e)

    async def exec(self, req: ExecRequest, on_chunk: ChunkCallback | None = None) -> ExecResult:
        # The agent always streams: chunks are collected here (and passed on to the caller's
        # callback), so the RESULT frame carries no output of its own.
        out: tuple[list[bytes], list[bytes]] = ([], [])

        def collect(chunk: OutputChunk) -> None:
            out[chunk.stream - 1].append(chunk.data)
            if on_chunk is not None:
                on_chunk(chunk)

        meta, body = p.exec_request(req, stream=True)
        result_meta, result_body = await self.request(p.K_EXEC, meta, body, timeout=req.timeout + REPLY_SLACK, on_chunk=collect)
        if result_meta.get("error"):
            # Queued behind a shell that exited, or cancelled before it started: the sandbox is fine.
            raise FailedPrecondition(f"command did not run in {self._name}: {result_meta['error']}", container_id=self._name)
        return p.exec_result(result_meta, result_body, streamed=(b"".join(out[0]), b"".join(out[1])))

    async def write_files(self, files: Sequence[FileWrite], timeout: float) -> list[FileWriteResult]:
        meta, body = p.write_files_request(files)
        result, _ = await self.request(p.K_WRITE_FILES, meta, body, timeout=timeout)
        return p.write_files_result(result)

    async def read_files(self, paths: Sequence[str], max_bytes: int, timeout: float) -> list[FileRead]:
        result, body = await self.request(p.K_READ_FILES, {"paths": list(paths), "max_bytes": max_bytes}, timeout=timeout)
        return p.read_files_result(result, body)

    async def list_dir(self, path: str, *, recursive: bool, max_entries: int, timeout: float) -> tuple[list[FileStat], bool]:
        result, _ = await self.request(
            p.K_LIST, {"path": path, "recursive": recursive, "max_entries": max_entries}, timeout=timeout
        )
        return [p.stat_result(e) for e in result["entries"]], bool(result.get("truncated"))

    async def stat(self, paths: Sequence[str], timeout: float) -> list[FileStat]:
        result, _ = await self.request(p.K_STAT, {"paths": list(paths)}, timeout=timeout)
        return [p.stat_result(s) for s in result["stats"]]

    async def close_shell(self, name: str, timeout: float) -> bool:
        result, _ = await self.request(p.K_SHELL_CLOSE, {"session": name}, timeout=timeout)
        return bool(result.get("found"))

    async def ping(self, timeout: float) -> dict[str, Any]:
        meta, _ = await self.request(p.K_PING, {}, timeout=timeout)
        return meta

    async def reset(self, timeout: float) -> dict[str, Any]:
        """Ask the agent to make the sandbox as clean as a new one and prove it (recycling):
        {"ok": bool, "why": str, "checks": [...]}."""
        meta, _ = await self.request(p.K_RESET, {}, timeout=timeout)
        return meta

    async def close(self, reason: str = "closed") -> None:
        self._fail_all(reason)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        try:
            await self._transport.close()
        finally:
            if self._reader is not None:
                self._reader.cancel()
                await asyncio.gather(self._reader, return_exceptions=True)

    def _fail_all(self, reason: str) -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
        for pending in self._pending.values():
            if not pending.future.done():
                pending.future.set_exception(SandboxDied(f"sandbox {self._name} went away: {reason}", container_id=self._name))
        self._pending.clear()

    async def _read_loop(self) -> None:
        reason = "agent stream ended"
        try:
            while True:
                chunk = await self._transport.receive()
                if chunk is None:
                    if self.stderr_tail:
                        reason += f" (agent stderr: {self.stderr_tail[-500:].decode('utf-8', 'replace').strip()})"
                    break
                stream, data = chunk
                if stream == 2:
                    self.stderr_tail = (self.stderr_tail + data)[-STDERR_TAIL:]
                    continue
                try:
                    frames = self._decoder.feed(data)
                except p.UnsupportedVersion as e:
                    log.warning("agent %s: %s", self._name, e)
                    frames = e.frames  # type: ignore[attr-defined]
                for kind, rid, meta, body in frames:
                    self._dispatch(kind, rid, meta, body)
        except p.ProtocolError as e:
            if self._decoder.keyed:  # only the agent and the sandbox's own processes write there
                self.tampered = reason = f"its agent's stream was tampered with from inside the sandbox: {e}"
            else:
                reason = f"agent protocol error: {e}"
            log.error("sandbox %s: %s", self._name, reason)
        except asyncio.CancelledError:
            reason = "channel closed"
            raise
        except Exception as e:  # the transport broke: every caller must hear about it
            reason = f"agent stream failed: {type(e).__name__}: {e}"
        finally:
            self._fail_all(reason)

    def _dispatch(self, kind: int, rid: int, meta: bytes, body: bytes) -> None:
        pending = self._pending.get(rid)
        if kind == p.K_ERROR and rid == 0 and self._decoder.keyed:
            error = p.loads(meta)
            if error.get("code") == "tampered":  # the agent's word: the frame's tag held
                raise p.Tampered(str(error.get("message", "")))
        if pending is None:
            if kind == p.K_ERROR:
                log.warning("agent %s error for request %d: %r", self._name, rid, meta[:300])
            return  # a late answer to a caller that gave up
        if kind == p.K_STDOUT or kind == p.K_STDERR:
            stream = 1 if kind == p.K_STDOUT else 2
            if pending.on_chunk is not None:
                pending.on_chunk(OutputChunk(stream, body))
            return
        if pending.future.done():
            return
        decoded = p.loads(meta)
        if kind == p.K_RESULT:
            pending.future.set_result((decoded, body))
        elif kind == p.K_ERROR:
            exc_type = InvalidArgument if decoded.get("code") in ("bad_request", "os_error") else AgentProtocolError
            pending.future.set_exception(exc_type(f"sandbox agent: {decoded.get('message', decoded)}"))
        else:
            pending.future.set_exception(AgentProtocolError(f"unexpected frame kind {kind} from agent {self._name}"))
