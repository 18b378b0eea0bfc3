"""The daemon's side of the agent protocol: request encoding and result decoding, no I/O.

Framing itself lives in ``sandbox_agent.py`` (stdlib only, runs inside sandboxes) and is imported
from there, so both ends share one implementation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from rlsandbox.daemon.agent.sandbox_agent import (
    EXIT_TAMPERED,
    HEADER,
    K_CANCEL,
    K_ERROR,
    K_EXEC,
    K_KEY,
    K_LIST,
    K_PING,
    K_READ_FILES,
    K_RESET,
    K_RESULT,
    K_SHELL_CLOSE,
    K_SHUTDOWN,
    K_STAT,
    K_STDERR,
    K_STDOUT,
    K_WRITE_FILES,
    MAX_BODY,
    MAX_META,
    PROTOCOL_VERSION,
    TAG_SIZE,
    TO_AGENT,
    TO_DAEMON,
    FrameDecoder,
    FrameSealer,
    ProtocolError,
    Tampered,
    UnsupportedVersion,
    encode_frame,
)
from rlsandbox.daemon.model import ExecRequest, ExecResult, FileRead, FileStat, FileWrite, FileWriteResult

__all__ = [
    "EXIT_TAMPERED",
    "HEADER",
    "K_CANCEL",
    "K_RESET",
    "K_ERROR",
    "K_EXEC",
    "K_KEY",
    "K_LIST",
    "K_PING",
    "K_READ_FILES",
    "K_RESULT",
    "K_SHELL_CLOSE",
    "K_SHUTDOWN",
    "K_STAT",
    "K_STDERR",
    "K_STDOUT",
    "K_WRITE_FILES",
    "MAX_BODY",
    "MAX_META",
    "PROTOCOL_VERSION",
    "TAG_SIZE",
    "TO_AGENT",
    "TO_DAEMON",
    "FrameDecoder",
    "FrameSealer",
    "ProtocolError",
    "Tampered",
    "UnsupportedVersion",
    "encode_frame",
    "exec_request",
    "exec_result",
    "write_files_request",
    "write_files_result",
    "read_files_result",
    "stat_result",
]


def exec_request(req: ExecRequest, *, stream: bool) -> tuple[dict[str, Any], bytes]:
    meta: dict[str, Any] = {
        "timeout": req.timeout,
        "stdout_cap": req.stdout_cap,
        "stderr_cap": req.stderr_cap,
        "stream": stream,
    }
    if req.argv is not None:
        meta["argv"] = list(req.argv)
    if req.shell is not None:
        meta["shell"] = req.shell
    if req.shell_session:
        meta["session"] = req.shell_session
    if req.cwd:
        meta["cwd"] = req.cwd
    if req.env:
        meta["env"] = dict(req.env)
    if req.as_root:
        meta["root"] = True
    if req.cap_kills:
        meta["cap_kills"] = True
    if req.end_leftovers:
        meta["end_leftovers"] = True
    if req.warm is not None:
        meta["warm"] = {"python": req.warm.python, "module": req.warm.module, "args": list(req.warm.args)}
    return meta, req.stdin


def exec_result(meta: dict[str, Any], body: bytes, streamed: tuple[bytes, bytes] | None = None) -> ExecResult:
    """Build an :class:`ExecResult` from a RESULT frame (and the chunks, if it was streamed)."""
    if streamed is not None:
        stdout, stderr = streamed
    else:
        split = int(meta.get("stdout_len", 0))
        stdout, stderr = body[:split], body[split:]
    return ExecResult(
        exit_code=meta.get("exit_code"),
        signal=meta.get("signal"),
        timed_out=bool(meta.get("timed_out")),
        cancelled=bool(meta.get("cancelled")),
        shell_exited=bool(meta.get("shell_exited")),
        stdout=stdout,
        stderr=stderr,
        stdout_total=int(meta.get("stdout_total", len(stdout))),
        stderr_total=int(meta.get("stderr_total", len(stderr))),
        stdout_truncated=bool(meta.get("stdout_truncated")),
        stderr_truncated=bool(meta.get("stderr_truncated")),
        duration=float(meta.get("duration", 0.0)),
        ended=int(meta.get("ended") or 0),
        ended_names=tuple(str(n) for n in meta.get("ended_names") or ()),
    )


def write_files_request(files: Sequence[FileWrite]) -> tuple[dict[str, Any], bytes]:
    specs = [{"path": f.path, "mode": f.mode, "size": len(f.data)} for f in files]
    return {"files": specs}, b"".join(f.data for f in files)


def write_files_result(meta: dict[str, Any]) -> list[FileWriteResult]:
    return [FileWriteResult(path=r["path"], error=None if r.get("ok") else r.get("error", "failed")) for r in meta["files"]]


def read_files_result(meta: dict[str, Any], body: bytes) -> list[FileRead]:
    out = []
    offset = 0
    for r in meta["files"]:
        length = int(r.get("length", 0))
        data = body[offset : offset + length]
        offset += length
        out.append(
            FileRead(
                path=r["path"],
                data=data,
                size=int(r.get("size", length)),
                truncated=bool(r.get("truncated")),
                error=None if r.get("ok") else r.get("error", "failed"),
            )
        )
    return out


def stat_result(info: dict[str, Any]) -> FileStat:
    return FileStat(
        path=info.get("name", info["path"]),
        exists=bool(info.get("exists")),
        type=info.get("type", ""),
        size=int(info.get("size", 0)),
        mode=int(info.get("mode", 0)),
        mtime=float(info.get("mtime", 0.0)),
        error=info.get("error"),
    )


def dumps(meta: dict[str, Any]) -> bytes:
    return orjson.dumps(meta)


def loads(meta: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(meta) if meta else {}
    except orjson.JSONDecodeError as e:  # found by the fuzz test: garbage is a protocol error, typed
        raise ProtocolError(f"frame meta is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ProtocolError("frame meta is not a JSON object")
    return value
