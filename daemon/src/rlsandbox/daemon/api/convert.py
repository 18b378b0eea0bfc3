"""Protobuf <-> domain translation and request validation. No I/O."""

from __future__ import annotations

import math
import posixpath
import time
from collections.abc import Callable
from typing import Any

from rlsandbox.daemon.config import DaemonConfig
from rlsandbox.daemon.errors import InvalidArgument
from rlsandbox.daemon.grading.rewards import GradeResult
from rlsandbox.daemon.grading.task import Task, TaskError
from rlsandbox.daemon.model import ExecRequest, ExecResult, FileWrite, check_image_reference, image_pool_name
from rlsandbox.daemon.session import Session, SessionOptions, SessionState
from rlsandbox.daemon.session.prefetch import PrefetchState
from rlsandbox.daemon.status import NodeStatus
from rlsandbox.v1 import sandbox_pb2 as pb

MAX_ARGS = 10_000
MAX_PATHS = 10_000
MAX_FILES = 10_000


def _seconds(value: float, name: str, default: float, maximum: float) -> float:
    if math.isnan(value) or value < 0:
        raise InvalidArgument(f"{name} must be a positive number of seconds (got {value})")
    if value == 0:
        return default
    if value > maximum or math.isinf(value):
        raise InvalidArgument(f"{name} of {value:g} s is over this node's limit of {maximum:g} s")
    return value


def _path(path: str, what: str, base: str = "") -> str:
    """Normalise a sandbox path; relative paths are relative to ``base`` (the session's workdir)."""
    if not path or "\x00" in path:
        raise InvalidArgument(f"{what} must be a non-empty path without NUL bytes (got {path!r})")
    if not path.startswith("/"):
        if not base:
            raise InvalidArgument(f"{what} must be absolute (got {path!r})")
        path = posixpath.join(base, path)
    normal = posixpath.normpath(path)
    if normal == "/":
        raise InvalidArgument(f"{what} cannot be the root directory")
    if normal.startswith("/.rlsandbox") or normal.startswith("/proc") or normal.startswith("/sys"):
        raise InvalidArgument(f"{what} {path!r} is outside what sandboxes may change")
    return normal


def _env(env: dict[str, str], what: str) -> dict[str, str]:
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise InvalidArgument(f"{what}: invalid environment variable name or value {key!r}")
    return env


def task(t: pb.Task, known: Callable[[str], Task] | None = None) -> Task:
    """A task received over the API, validated (INVALID_ARGUMENT saying what is wrong); a ``ref``
    is looked up with ``known`` (NOT_FOUND when the node does not know it)."""
    if t.ref:
        if t.spec_json or t.workspace_tar:
            raise InvalidArgument("a task is sent either as a ref or as spec_json (+ workspace_tar), not both")
        if known is None:
            raise InvalidArgument("a task ref is not accepted here; send the task itself")
        return known(t.ref)
    try:
        return Task.from_wire(t.spec_json, t.workspace_tar)
    except TaskError as e:
        raise InvalidArgument(str(e)) from None


def session_options(req: pb.CreateSessionRequest, config: DaemonConfig, known: Callable[[str], Task]) -> SessionOptions:
    the_task = task(req.task, known) if req.HasField("task") else None
    pool = req.pool
    image = ""
    if the_task is not None:
        if pool and pool != the_task.spec.pool_name:
            raise InvalidArgument(f"pool {pool!r} differs from the task's pool {the_task.spec.pool_name!r}; leave pool empty")
        if req.image:
            raise InvalidArgument("a session from a task runs where the task says (its pool or image); leave image empty")
        pool = the_task.spec.pool_name
        image = the_task.spec.image
    elif req.image:
        if pool:
            raise InvalidArgument("give a pool or an image, not both")
        try:
            image = check_image_reference(req.image)
        except ValueError as e:
            raise InvalidArgument(str(e)) from None
        pool = image_pool_name(image)
    if not pool:
        raise InvalidArgument("pool or image is required (GetNodeStatus lists this node's pools)")
    if req.workdir:
        _path(req.workdir, "workdir")
    return SessionOptions(
        pool=pool,
        image=image,
        task=the_task,
        task_ref=req.task.ref if req.HasField("task") else "",
        env=_env(dict(req.env), "env"),
        workdir=req.workdir,
        idle_timeout=_seconds(req.idle_timeout, "idle_timeout", config.default_idle_timeout, config.max_idle_timeout),
        max_lifetime=_seconds(req.max_lifetime, "max_lifetime", config.default_max_lifetime, config.max_lifetime_limit),
        labels=dict(req.labels),
        idempotency_key=req.idempotency_key,
        acquire_timeout=_seconds(req.acquire_timeout, "acquire_timeout", config.default_acquire_timeout, config.max_exec_timeout),
    )


def exec_request(req: pb.ExecRequest, config: DaemonConfig, time_left: float | None) -> ExecRequest:
    """Validate an Exec request; the call's remaining deadline caps the command's timeout."""
    which = req.WhichOneof("command")
    if which is None:
        raise InvalidArgument("exec needs a command: set argv (a list of strings) or shell (a string)")
    argv: tuple[str, ...] | None = None
    shell: str | None = None
    if which == "argv":
        argv = tuple(req.argv.args)
        if not argv or not argv[0]:
            raise InvalidArgument("argv is empty: give the program and its arguments, e.g. ['ls', '-l']")
        if len(argv) > MAX_ARGS or any("\x00" in a for a in argv):
            raise InvalidArgument(f"argv must have at most {MAX_ARGS} arguments without NUL bytes")
        if req.shell_session:
            raise InvalidArgument("a persistent shell_session runs shell strings: use shell, not argv")
    else:
        shell = req.shell
        if not shell.strip():
            raise InvalidArgument("shell command is empty")
    if req.shell_session and (len(req.shell_session) > 64 or not req.shell_session.replace("-", "").replace("_", "").isalnum()):
        raise InvalidArgument("shell_session must be 1-64 letters, digits, '-' or '_'")
    timeout = _seconds(req.timeout, "timeout", config.default_exec_timeout, config.max_exec_timeout)
    if time_left is not None:
        if time_left <= 0.05:
            raise InvalidArgument("the call's deadline leaves no time to run the command")
        timeout = min(timeout, max(0.05, time_left - 0.05))  # answer before the caller gives up
    caps = []
    for name, value in (("stdout_cap", req.stdout_cap), ("stderr_cap", req.stderr_cap)):
        if value > config.max_output_cap:
            raise InvalidArgument(f"{name} of {value} bytes is over this node's limit of {config.max_output_cap}")
        caps.append(value or config.default_output_cap)
    return ExecRequest(
        argv=argv,
        shell=shell,
        shell_session=req.shell_session or None,
        cwd=_path(req.cwd, "cwd") if req.cwd else None,
        env=_env(dict(req.env), "env"),
        stdin=req.stdin,
        timeout=timeout,
        stdout_cap=caps[0],
        stderr_cap=caps[1],
    )


def exec_result(result: ExecResult, replayed: bool = False) -> pb.ExecResult:
    msg = pb.ExecResult(
        timed_out=result.timed_out,
        stdout=result.stdout,
        stderr=result.stderr,
        stdout_total=result.stdout_total,
        stderr_total=result.stderr_total,
        stdout_truncated=result.stdout_truncated,
        stderr_truncated=result.stderr_truncated,
        duration=result.duration,
        replayed=replayed,
        shell_exited=result.shell_exited,
    )
    if result.exit_code is not None:
        msg.exit_code = result.exit_code
    if result.signal is not None:
        msg.signal = result.signal
    return msg


def file_writes(req: pb.WriteFilesRequest, workdir: str) -> list[FileWrite]:
    if not req.files:
        raise InvalidArgument("no files to write")
    if len(req.files) > MAX_FILES:
        raise InvalidArgument(f"at most {MAX_FILES} files per call")
    out = []
    for f in req.files:
        mode = f.mode or 0o644
        if mode > 0o7777:
            raise InvalidArgument(f"mode {oct(mode)} of {f.path!r} is not a permission mode (0 to 0o7777)")
        out.append(FileWrite(path=_path(f.path, "file path", workdir), data=f.data, mode=mode))
    return out


def read_paths(req: pb.ReadFilesRequest, config: DaemonConfig, workdir: str) -> tuple[list[str], int]:
    if not req.paths:
        raise InvalidArgument("no paths to read")
    if len(req.paths) > MAX_PATHS:
        raise InvalidArgument(f"at most {MAX_PATHS} paths per call")
    if req.max_bytes > config.max_read_bytes:
        raise InvalidArgument(f"max_bytes {req.max_bytes} is over this node's limit of {config.max_read_bytes}")
    max_bytes = req.max_bytes or min(config.max_read_bytes, 16 << 20)
    if max_bytes * len(req.paths) > config.max_message_bytes:
        raise InvalidArgument(
            f"{len(req.paths)} files of up to {max_bytes} bytes could exceed the {config.max_message_bytes}-byte "
            "response limit: lower max_bytes or read fewer files per call"
        )
    return [_path(p, "path", workdir) for p in req.paths], max_bytes


_STATES = {
    SessionState.CREATING: pb.SESSION_STATE_CREATING,
    SessionState.READY: pb.SESSION_STATE_READY,
    SessionState.CLOSING: pb.SESSION_STATE_CLOSING,
    SessionState.CLOSED: pb.SESSION_STATE_CLOSED,
    SessionState.FAILED: pb.SESSION_STATE_FAILED,
}


def grade_result(r: GradeResult, *, task_id: str, session_id: str) -> pb.GradeResult:
    return pb.GradeResult(
        status=r.status.value,
        reward=r.reward,
        resolved=r.resolved,
        message=r.message,
        tests=[pb.TestOutcome(id=t.id, outcome=t.outcome, group=t.group.value) for t in r.tests],
        counts=r.counts(),
        exit_code=r.exit_code,
        timed_out=r.timed_out,
        report_complete=r.report_complete,
        tampering=r.tampering,
        limits=r.limits,
        log=r.log,
        duration=r.duration,
        mode=r.mode,
        task_id=task_id,
        session_id=session_id,
    )


def session(s: Session, node_id: str) -> pb.Session:
    spec = s.pool.spec.container
    return pb.Session(
        session_id=s.id,
        node_id=node_id,
        pool=s.pool.name,
        state=_STATES[s.state],  # type: ignore[arg-type]
        labels=dict(s.options.labels),
        image=spec.image,
        mode=s.sandbox.mode if s.sandbox else "",
        oci_runtime=spec.runtime,
        workdir=s.workdir,
        created_at=s.created_at,
        last_used_at=s.last_used_at,
        idle_timeout=s.options.idle_timeout,
        max_lifetime=s.options.max_lifetime,
        steps=s.steps,
        container_name=s.sandbox.name if s.sandbox else "",
        end_reason=s.end_reason,
        task_id=s.options.task.id if s.options.task else "",
    )


def node_status(st: NodeStatus) -> pb.NodeStatus:
    events = None
    if st.events is not None:
        e = st.events
        events = pb.EventsStatus(
            connected=e.connected,
            published_total=e.published_total,
            queued=e.queued,
            outbox_events=e.outbox_events,
            outbox_bytes=e.outbox_bytes,
            outbox_max_bytes=e.outbox_max_bytes,
            dropped_total=e.dropped_total,
            last_error=e.last_error,
        )
    return pb.NodeStatus(
        node_id=st.node_id,
        version=st.version,
        pools=[
            pb.PoolStatus(
                name=p.stats.name,
                image=p.image,
                ready=p.stats.ready,
                in_use=p.stats.in_use,
                creating=p.stats.creating,
                waiting=p.stats.waiting,
                min_ready=p.stats.min_ready,
                max_total=p.stats.max_total,
                created_total=p.stats.created_total,
                failed_total=p.stats.failed_total,
                consecutive_failures=p.stats.consecutive_failures,
                last_error=p.stats.last_error or "",
                oci_runtime=p.oci_runtime,
                acquired_total=p.stats.acquired_total,
                acquired_waited_total=p.stats.acquired_waited_total,
                destroying=p.stats.destroying,
                recycling=p.stats.recycling,
                recycled_total=p.stats.recycled_total,
                recycle_failures_total=p.stats.recycle_failures_total,
            )
            for p in st.pools
        ],
        sessions=st.sessions,
        max_sessions=st.max_sessions,
        docker_reachable=st.docker_reachable,
        serving=st.serving,
        load1=st.load1,
        uptime=st.uptime,
        execs_total=st.execs_total,
        events=events,
    )


def prefetch_response(state: PrefetchState) -> pb.PrefetchResponse:
    return pb.PrefetchResponse(
        ref=state.ref, ready=state.ready, preparing=state.preparing, target=state.target, last_error=state.last_error
    )


def cluster(records: list[dict[str, Any]], node_id: str) -> pb.Cluster:
    """The node table's records as the API's Cluster (records of another version: their fields that fit)."""
    now = time.time()
    nodes: list[pb.ClusterNode] = []
    for r in records:
        raw = r.get("pools")
        pools: dict[str, Any] = raw if isinstance(raw, dict) else {}
        nodes.append(
            pb.ClusterNode(
                node_id=str(r.get("node", "")),
                address=str(r.get("address", "")),
                sessions=max(int(r.get("sessions") or 0), 0),
                max_sessions=max(int(r.get("max_sessions") or 0), 0),
                free=max(int(r.get("free") or 0), 0),
                ready={str(k): max(int((v or {}).get("ready") or 0), 0) for k, v in pools.items() if isinstance(v, dict)},
                load1=float(r.get("load1") or 0.0),
                serving=bool(r.get("serving")),
                age=max(now - float(r.get("ts") or now), 0.0),
                draining=bool(r.get("draining")),
            )
        )
    nodes.sort(key=lambda n: str(n.node_id))
    return pb.Cluster(nodes=nodes, answered_by=node_id)
