"""The sandbox channel for images without python3: every operation is an Engine API call.

Slower (one ``docker exec`` or archive call per operation) but gives the same results as the
agent: caps, truncation, timeouts that kill the command's whole process group, binary files.
"""

from __future__ import annotations

import posixpath
import secrets
import time
from collections.abc import Sequence
from typing import Any

from rlsandbox.daemon.agent.channel import ChunkCallback
from rlsandbox.daemon.agent.sandbox_agent import _Capture  # the agent's own capture, one implementation
from rlsandbox.daemon.errors import ContainerNotFound, FailedPrecondition, SandboxDied
from rlsandbox.daemon.model import ExecRequest, ExecResult, FileRead, FileStat, FileWrite, FileWriteResult, OutputChunk
from rlsandbox.daemon.runtime.docker import DockerRuntime, path_kind

# The wrapper shell records its pid, which is the command's process group (Engine API execs start
# as session leaders), so that a timeout can kill the whole group from a second exec.
_PIDFILE_WRAPPER = 'echo $$ > "$0"; "$@"; ec=$?; rm -f "$0"; exit $ec'


class ExecChannel:
    """Implements the agent channel's operations with Engine API execs and archive calls."""

    def __init__(self, runtime: DockerRuntime, container_id: str) -> None:
        self._runtime = runtime
        self._cid = container_id
        self._closed_reason: str | None = None
        self.info: dict[str, Any] = {"mode": "exec"}

    @property
    def alive(self) -> bool:
        return self._closed_reason is None

    @property
    def closed_reason(self) -> str | None:
        return self._closed_reason

    async def start(self, timeout: float) -> dict[str, Any]:
        result = await self.exec(ExecRequest(argv=("true",), timeout=timeout))
        if result.exit_code != 0:
            raise SandboxDied(f"sandbox {self._cid[:12]} cannot run commands: {result.stderr[:200]!r}")
        return self.info

    async def exec(self, req: ExecRequest, on_chunk: ChunkCallback | None = None) -> ExecResult:
        if req.shell_session:
            raise FailedPrecondition(
                "persistent shell sessions need the in-sandbox agent, and this image has no python3: "
                "run the command without a shell session, or use an image with python3 >= 3.8"
            )
        argv = list(req.argv) if req.argv is not None else ["/bin/sh", "-c", req.shell or ""]
        pidfile = f"/tmp/.rls-exec-{secrets.token_hex(8)}.pid"
        captures = {1: _Capture(req.stdout_cap), 2: _Capture(req.stderr_cap)}
        out, err = captures[1], captures[2]
        timed_out = False

        def on_output(stream: int, data: bytes) -> None:
            kept = captures[stream].add(data)
            if kept and on_chunk is not None:
                on_chunk(OutputChunk(stream, kept))

        async def kill_group() -> None:
            nonlocal timed_out
            timed_out = True
            await self._runtime.exec_stream(
                self._cid,
                ["/bin/sh", "-c", f'kill -KILL -"$(cat {pidfile})"'],
                cwd=None,
                env={},
                stdin=b"",
                on_output=lambda s, d: None,
                timeout=10,
                queue=False,  # a kill must not wait behind the commands it is there to end
            )

        started = time.monotonic()
        try:
            code = await self._runtime.exec_stream(
                self._cid,
                ["/bin/sh", "-c", _PIDFILE_WRAPPER, pidfile, *argv],
                cwd=req.cwd,
                env=req.env,
                stdin=req.stdin,
                on_output=on_output,
                timeout=req.timeout,
                on_timeout=kill_group,
            )
        except ContainerNotFound as e:
            self._closed_reason = "container is gone"
            raise SandboxDied(f"sandbox {self._cid[:12]} is gone: {e.message}", container_id=self._cid) from None
        exit_code: int | None = code
        sig = None
        if timed_out and code >= 128:
            exit_code, sig = None, code - 128
        return ExecResult(
            exit_code=exit_code,
            signal=sig,
            timed_out=timed_out,
            stdout=bytes(out.data),
            stderr=bytes(err.data),
            stdout_total=out.total,
            stderr_total=err.total,
            stdout_truncated=out.truncated,
            stderr_truncated=err.truncated,
            duration=time.monotonic() - started,
        )

    async def write_files(self, files: Sequence[FileWrite], timeout: float) -> list[FileWriteResult]:
        await self._runtime.put_files(self._cid, [(f.path, f.data, f.mode) for f in files], timeout=timeout)
        return [FileWriteResult(path=f.path) for f in files]

    async def read_files(self, paths: Sequence[str], max_bytes: int, timeout: float) -> list[FileRead]:
        out = []
        for path in paths:
            try:
                data, size = await self._runtime.get_file(self._cid, path, max_bytes, timeout=timeout)
            except ContainerNotFound:
                out.append(FileRead(path=path, data=b"", size=0, truncated=False, error="No such file or directory"))
            except IsADirectoryError:
                out.append(FileRead(path=path, data=b"", size=0, truncated=False, error="Is a directory"))
            else:
                out.append(FileRead(path=path, data=data, size=size, truncated=size > len(data)))
        return out

    async def stat(self, paths: Sequence[str], timeout: float) -> list[FileStat]:
        return [await self._stat_one(p, p, timeout) for p in paths]

    async def _stat_one(self, path: str, shown: str, timeout: float) -> FileStat:
        info = await self._runtime.stat_path(self._cid, path, timeout=timeout)
        if info is None:
            return FileStat(path=shown, exists=False, error="No such file or directory")
        mode = int(info.get("mode", 0))
        return FileStat(path=shown, exists=True, type=path_kind(mode), size=int(info.get("size", 0)), mode=mode & 0o7777)

    async def list_dir(self, path: str, *, recursive: bool, max_entries: int, timeout: float) -> tuple[list[FileStat], bool]:
        argv = ["find", path, "-mindepth", "1"] + ([] if recursive else ["-maxdepth", "1"])
        result = await self.exec(ExecRequest(argv=tuple(argv), timeout=timeout, stdout_cap=8 << 20))
        if result.exit_code != 0:
            raise FailedPrecondition(f"cannot list {path}: {result.stderr.decode('utf-8', 'replace').strip()}")
        names = sorted(n for n in result.stdout.decode("utf-8", "surrogateescape").split("\n") if n)
        truncated = len(names) > max_entries
        entries = [await self._stat_one(n, posixpath.relpath(n, path), timeout) for n in names[:max_entries]]
        return entries, truncated

    async def close_shell(self, name: str, timeout: float) -> bool:
        return False

    async def reset(self, timeout: float) -> dict[str, Any]:
        """No agent, no reset: such a sandbox is never recycled."""
        return {"ok": False, "why": "an Engine-exec sandbox has no agent to reset it", "checks": []}

    async def ping(self, timeout: float) -> dict[str, Any]:
        try:
            info = await self._runtime.inspect(self._cid, timeout=timeout)
        except ContainerNotFound as e:
            self._closed_reason = "container is gone"
            raise SandboxDied(f"sandbox {self._cid[:12]} is gone: {e.message}", container_id=self._cid) from None
        if not (info.get("State") or {}).get("Running"):
            self._closed_reason = "container stopped"
            raise SandboxDied(f"sandbox {self._cid[:12]} is not running", container_id=self._cid)
        return self.info

    async def close(self, reason: str = "closed") -> None:
        if self._closed_reason is None:
            self._closed_reason = reason
