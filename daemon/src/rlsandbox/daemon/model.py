"""Domain values shared by the runtime, the sandboxes, the pools and the API layer.

Frozen dataclasses only: protobuf stays at the wire, pydantic stays in configuration.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

MiB = 1 << 20


# An image reference as the engine parses it (distribution/reference): [domain[:port]/]path[:tag][@digest].
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"(?:[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9-]*[A-Za-z0-9])"
_DOMAIN = rf"{_LABEL}(?:\.{_LABEL})*(?::[0-9]+)?"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE = re.compile(rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$")


def check_image_reference(image: str) -> str:
    """``image`` if it is a valid image reference (e.g. ``swebench/sweb.eval.x86_64.django_1776:latest``),
    else ValueError saying so: a name the engine cannot parse never reaches it."""
    first, slash, _ = image.partition("/")
    # As the engine reads it, a first part is a registry only with a '.' or ':' in it, or localhost.
    registry = bool(slash) and ("." in first or ":" in first or first == "localhost")
    if len(image) > 512 or not IMAGE_REFERENCE.match(image) or (slash and not registry and first != first.lower()):
        raise ValueError(
            f"{image[:80]!r} is not an image reference: [registry[:port]/]name[:tag][@digest], lowercase name components"
        )
    if len(repository := _repository(image, registry)) > REPOSITORY_MAX:
        raise ValueError(
            f"{image[:80]!r} is not an image reference: its name, read in full as {repository[:30]!r}..., has "
            f"{len(repository)} characters and may have at most {REPOSITORY_MAX} (the tag and digest do not count)"
        )
    return image


REPOSITORY_MAX = 255  # the engine's limit on the full name (distribution/reference NameTotalLengthMax)


def _repository(image: str, registry: bool) -> str:
    """``image``'s name in full, as the engine normalises it before its length limit applies:
    without tag and digest, with the default registry (and "library/" for a one-part name)."""
    named = image.partition("@")[0]
    head, slash, last = named.rpartition("/")
    name = f"{head}{slash}{last.partition(':')[0]}"
    if registry:
        return name
    return f"docker.io/{name}" if slash else f"docker.io/library/{name}"


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
    disk_bytes: int = 0  # its writable layer's budget, enforced by the node's disk guard (0: none)


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
    # The daemon's own commands, never an episode's (the API has no such field):
    as_root: bool = False  # as the agent's user, where the episode's commands run as another
    cap_kills: bool = False  # killed once its stdout passes stdout_cap (a bounded read)
    # The room's last command (the clean room's tests): as it exits, the agent ends every process
    # it left (all but the agent and its warm interpreters), before the result is sent.
    end_leftovers: bool = False
    # The same command as `python -m module args`, which a recycling sandbox may fork from its warm
    # interpreter (the clean room's pytest; agent/sandbox_agent.py, "warm Python"); else ``shell``.
    warm: WarmRun | None = None


@dataclass(frozen=True, slots=True)
class WarmRun:
    python: str
    module: str
    args: tuple[str, ...]


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
    ended: int = 0  # end_leftovers: how many processes the command left were ended
    ended_names: tuple[str, ...] = ()  # the first of their command lines

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
