"""Result types of the client (plain frozen dataclasses; protobuf stays inside the client)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

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
    task_id: str = ""

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
            task_id=m.task_id,
        )


@dataclass(frozen=True)
class TestOutcome:
    id: str
    outcome: str  # passed, failed, error, skipped, or missing (listed by the task, absent from the report)
    group: str  # fail_to_pass, pass_to_pass, other


@dataclass(frozen=True)
class GradeResult:
    """The grade of a session. ``reward`` is None exactly when the status is ``infra_error`` or
    ``invalid_task``: mask those episodes, they say nothing about the agent."""

    status: str  # ok, infra_error, timeout, invalid_task
    reward: Optional[float]
    resolved: bool
    message: str
    tests: list[TestOutcome]
    counts: dict[str, int]
    exit_code: Optional[int]
    timed_out: bool
    report_complete: bool
    tampering: list[str]
    log: bytes
    duration: float
    mode: str
    task_id: str
    session_id: str
    # Limits the agent's workspace broke; the reward is then the policy's minimum (status "ok").
    limits: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @classmethod
    def from_pb(cls, m: pb.GradeResult) -> GradeResult:
        return cls(
            status=m.status,
            reward=m.reward if m.HasField("reward") else None,
            resolved=m.resolved,
            message=m.message,
            tests=[TestOutcome(t.id, t.outcome, t.group) for t in m.tests],
            counts=dict(m.counts),
            exit_code=m.exit_code if m.HasField("exit_code") else None,
            timed_out=m.timed_out,
            report_complete=m.report_complete,
            tampering=list(m.tampering),
            log=m.log,
            duration=m.duration,
            mode=m.mode,
            task_id=m.task_id,
            session_id=m.session_id,
            limits=list(m.limits),
        )


def task_message(task: Any) -> pb.Task:
    """A task for the API from: a ``pb.Task``; an object with ``spec_json()`` and ``workspace_tar``
    (``rlsandbox.daemon.grading.task.Task``, from ``load_tasks``); a spec as a JSON string or a
    mapping (workspace in the image, or pass ``(spec, workspace_tar)``)."""
    if isinstance(task, pb.Task):
        return task
    if isinstance(task, tuple) and len(task) == 2:
        spec, tar = task
        return pb.Task(spec_json=spec if isinstance(spec, str) else json.dumps(spec), workspace_tar=bytes(tar))
    if hasattr(task, "spec_json") and hasattr(task, "workspace_tar"):
        return pb.Task(spec_json=task.spec_json(), workspace_tar=task.workspace_tar)
    if isinstance(task, str):
        return pb.Task(spec_json=task)
    if isinstance(task, Mapping):
        return pb.Task(spec_json=json.dumps(dict(task)))
    raise TypeError(f"cannot send {type(task).__name__} as a task; see rlsandbox.client.task_message")
