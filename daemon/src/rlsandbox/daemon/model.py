"""Domain values shared by the runtime, the sandboxes, the pools and the API layer.

Frozen dataclasses only: protobuf stays at the wire, pydantic stays in configuration.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

MiB = 1 << 20


def image_pool_name(image: str) -> str:
    """The name of the pool a node makes on demand for ``image`` (image_pools): readable, valid
    as a pool name, and unique per image."""
    import hashlib

    readable = re.sub(r"[^a-z0-9_.-]+", "-", image.lower()).strip("-.")[:40] or "image"
    return f"img-{readable}-{hashlib.sha256(image.encode()).hexdigest()[:8]}"


class AgentMode(enum.Enum):
    """How the daemon drives commands inside a sandbox."""

    AUTO = "auto"  # the in-sandbox agent when the image has python3, else Engine API exec
    AGENT = "agent"
    EXEC = "exec"


@dataclass(frozen=True, slots=True)
class Limits:
    memory_bytes: int = 1024 * MiB
    cpus: float = 1.0
    pids: int = 512
    nofile: int = 4096


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """Everything needed to create one sandbox container."""

    image: str
    limits: Limits = Limits()
    runtime: str = "runc"
    network: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "/workspace"
    agent: AgentMode = AgentMode.AUTO
    read_only_root: bool = False
    workspace_mb: int = 0  # >0: the workdir is a tmpfs volume of this size (a disk quota that works on any filesystem)
    run_as: str = ""  # "uid:gid": the episode's commands run as this user, the agent stays root (recycling)


@dataclass(frozen=True, slots=True)
class ExecRequest:
    """One command. Exactly one of ``argv`` and ``shell`` is set."""

    argv: tuple[str, ...] | None = None
    shell: str | None = None
    shell_session: str | None = None
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    stdin: bytes = b""
    timeout: float = 60.0
    stdout_cap: int = 1 * MiB
    stderr_cap: int = 1 * MiB


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int | None
    signal: int | None
    timed_out: bool
    stdout: bytes
    stderr: bytes
    stdout_total: int
    stderr_total: int
    stdout_truncated: bool
    stderr_truncated: bool
    duration: float
    cancelled: bool = False
    shell_exited: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """A slice of a running command's output (``stream`` is 1 for stdout, 2 for stderr)."""

    stream: int
    data: bytes


@dataclass(frozen=True, slots=True)
class FileWrite:
    path: str
    data: bytes
    mode: int = 0o644


@dataclass(frozen=True, slots=True)
class FileRead:
    path: str
    data: bytes
    size: int
    truncated: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class FileWriteResult:
    path: str
    error: str | None = None


@dataclass(frozen=True, slots=True)
class FileStat:
    path: str
    exists: bool
    type: str = ""
    size: int = 0
    mode: int = 0
    mtime: float = 0.0
    error: str | None = None
