"""Result types of the client (plain frozen dataclasses; protobuf stays inside the client)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Optional, Union

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


@dataclass(frozen=True)
class BatchCommand:
    """One command of :meth:`AsyncClient.exec_batch`: ``command`` in session ``session_id`` with
    ``options`` (the keyword options of ``exec``: timeout, cwd, env, seq, ...)."""

    session_id: str
    command: Union[str, Sequence[str]]
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolStatus:
    name: str
    image: str
    oci_runtime: str
    ready: int
    in_use: int
    creating: int
    waiting: int
    min_ready: int
    max_total: int
    created_total: int
    failed_total: int
    consecutive_failures: int
    last_error: str
    acquired_total: int
    acquired_waited_total: int  # hand-outs that had to wait for a sandbox (pool misses)
    destroying: int  # released sandboxes on their way out
    recycling: int  # released sandboxes being reset for the next episode (recycling pools)
    recycled_total: int
    recycle_failures_total: int


@dataclass(frozen=True)
class TaskRef:
    """A task by reference: ``task=TaskRef("py-calc@1f2e...")`` starts a session from a task the
    node knows (from Prefetch) or fetches once from the task object store (``rlsandbox tasks push``
    prints the refs), instead of sending its workspace with every call."""

    ref: str


@dataclass(frozen=True)
class PrefetchInfo:
    """What a node keeps prepared for a task. Pass it (or its ``ref``) as ``task=`` to start
    sessions from the task without sending its workspace again."""

    ref: str
    ready: int
    preparing: int
    target: int
    last_error: str


@dataclass(frozen=True)
class EventsStatus:
    connected: bool
    published_total: int
    queued: int
    outbox_events: int
    outbox_bytes: int
    outbox_max_bytes: int
    dropped_total: int
    last_error: str


@dataclass(frozen=True)
class NodeStatus:
    """A node's pools, sessions, capacity, load and event publishing (None: events off)."""

    node_id: str
    version: str
    pools: list[PoolStatus]
    sessions: int
    max_sessions: int
    docker_reachable: bool
    serving: bool
    load1: float
    uptime: float
    execs_total: int
    events: Optional[EventsStatus]

    @classmethod
    def from_pb(cls, m: pb.NodeStatus) -> NodeStatus:
        return cls(
            **_same_names(cls, m, skip={"pools", "events"}),
            pools=[PoolStatus(**_same_names(PoolStatus, p)) for p in m.pools],
            events=EventsStatus(**_same_names(EventsStatus, m.events)) if m.HasField("events") else None,
        )


def _same_names(cls: type, message: Any, skip: frozenset[str] | set[str] = frozenset()) -> dict[str, Any]:
    """The fields of dataclass ``cls`` taken from the message's fields of the same names."""
    return {f.name: getattr(message, f.name) for f in fields(cls) if f.name not in skip}
