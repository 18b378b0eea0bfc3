"""Result types of the client (plain frozen dataclasses; protobuf stays inside the client)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlsandbox.v1 import sandbox_pb2 as pb


@dataclass(frozen=True)
class ExecResult:
    """What a command did. ``exit_code`` is None when it was killed by ``signal``."""

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
    replayed: bool = False
    shell_exited: bool = False

    @property
    def ok(self) -> bool:
        """Exited with 0 and did not time out."""
        return self.exit_code == 0 and not self.timed_out

    @property
    def stdout_text(self) -> str:
        """stdout decoded as UTF-8 with replacement (never raises)."""
        return self.stdout.decode("utf-8", "replace")

    @property
    def stderr_text(self) -> str:
        return self.stderr.decode("utf-8", "replace")

    @classmethod
    def from_pb(cls, m: pb.ExecResult) -> ExecResult:
        return cls(
            exit_code=m.exit_code if m.HasField("exit_code") else None,
            signal=m.signal if m.HasField("signal") else None,
            timed_out=m.timed_out,
            stdout=m.stdout,
            stderr=m.stderr,
            stdout_total=m.stdout_total,
            stderr_total=m.stderr_total,
            stdout_truncated=m.stdout_truncated,
            stderr_truncated=m.stderr_truncated,
            duration=m.duration,
            replayed=m.replayed,
            shell_exited=m.shell_exited,
        )


@dataclass(frozen=True)
class FileData:
    """One file read from a sandbox; ``error`` is set when it could not be read."""

    path: str
    data: bytes
    size: int
    truncated: bool
    error: str | None = None


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    node_id: str
    pool: str
    state: str
    image: str
    mode: str
    workdir: str
    steps: int
    end_reason: str
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_pb(cls, m: pb.Session) -> SessionInfo:
        return cls(
            session_id=m.session_id,
            node_id=m.node_id,
            pool=m.pool,
            state=pb.SessionState.Name(m.state).replace("SESSION_STATE_", "").lower(),
            image=m.image,
            mode=m.mode,
            workdir=m.workdir,
            steps=m.steps,
            end_reason=m.end_reason,
            labels=dict(m.labels),
        )
