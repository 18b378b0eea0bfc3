"""The client's options (typed) and the protobuf requests built from them (internal)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, Union

from rlsandbox.v1 import sandbox_pb2 as pb

Command = Union[str, Sequence[str]]  # a shell string, or an argv list
FileContents = Union[bytes, str, "tuple[bytes, int]"]  # data, or (data, mode); str is UTF-8


class ExecOptions(TypedDict, total=False):
    """Keyword options of every ``exec``: shell_session (a persistent shell by that name), cwd,
    env, stdin, timeout (seconds; 0: the node's default), stdout_cap / stderr_cap (bytes kept),
    seq (a step number: a retried step with the same seq does not run twice)."""

    shell_session: str
    cwd: str
    env: Mapping[str, str]
    stdin: bytes
    timeout: float
    stdout_cap: int
    stderr_cap: int
    seq: int


class SessionOptions(TypedDict, total=False):
    """Keyword options of ``create_session``: task (a session from a task: its workspace, setup
    and pool; a spec mapping or JSON string, ``(spec, workspace_tar)``, a loaded Task, or the
    PrefetchInfo of a prefetched task), env,
    workdir, idle_timeout and max_lifetime (seconds; 0: the node's default), labels,
    idempotency_key (a retried create returns the same session), acquire_timeout (seconds to
    wait for a sandbox), image (instead of a pool: a container image the node makes a pool for)."""

    task: Any
    image: str
    env: Mapping[str, str]
    workdir: str
    idle_timeout: float
    max_lifetime: float
    labels: Mapping[str, str]
    idempotency_key: str
    acquire_timeout: float


def exec_request(session_id: str, command: Command, **options: Any) -> pb.ExecRequest:
    o: ExecOptions = options  # type: ignore[assignment]
    msg = pb.ExecRequest(
        session_id=session_id,
        shell_session=o.get("shell_session", ""),
        cwd=o.get("cwd", ""),
        env=dict(o.get("env") or {}),
        stdin=o.get("stdin", b""),
        timeout=o.get("timeout", 0.0),
        stdout_cap=o.get("stdout_cap", 0),
        stderr_cap=o.get("stderr_cap", 0),
        seq=o.get("seq", 0),
    )
    unknown = set(options) - set(ExecOptions.__annotations__)
    if unknown:
        raise TypeError(f"unknown exec options: {', '.join(sorted(unknown))}")
    if isinstance(command, str):
        msg.shell = command
    else:
        msg.argv.args.extend(command)
    return msg


def create_session_request(pool: str, **options: Any) -> pb.CreateSessionRequest:
    unknown = set(options) - set(SessionOptions.__annotations__)
    if unknown:
        raise TypeError(f"unknown session options: {', '.join(sorted(unknown))}")
    o: SessionOptions = options  # type: ignore[assignment]
    task = o.get("task")
    return pb.CreateSessionRequest(
        pool=pool,
        env=dict(o.get("env") or {}),
        workdir=o.get("workdir", ""),
        idle_timeout=o.get("idle_timeout", 0.0),
        max_lifetime=o.get("max_lifetime", 0.0),
        labels=dict(o.get("labels") or {}),
        idempotency_key=o.get("idempotency_key", ""),
        acquire_timeout=o.get("acquire_timeout", 0.0),
        task=task_message(task) if task is not None else None,
        image=o.get("image", ""),
    )


def write_files_request(session_id: str, files: Mapping[str, FileContents]) -> pb.WriteFilesRequest:
    request = pb.WriteFilesRequest(session_id=session_id)
    for path, value in files.items():
        data, mode = value if isinstance(value, tuple) else (value, 0)
        request.files.add(path=path, data=data.encode() if isinstance(data, str) else data, mode=mode)
    return request


def evaluate_request(session_id: str, *, task: Any = None, mode: str = "clean_room", timeout: float = 0.0) -> pb.EvaluateRequest:
    if mode not in ("clean_room", "in_place"):
        raise ValueError(f"mode must be 'clean_room' or 'in_place', not {mode!r}")
    return pb.EvaluateRequest(
        session_id=session_id,
        task=task_message(task) if task is not None else None,
        mode=pb.EVALUATE_MODE_IN_PLACE if mode == "in_place" else pb.EVALUATE_MODE_CLEAN_ROOM,
        timeout=timeout,
    )


def task_message(task: Any) -> pb.Task:
    """A task for the API from: a ``pb.Task``; an object with ``spec_json()`` and ``workspace_tar``
    (``rlsandbox.daemon.grading.task.Task``, from ``load_tasks``); a spec as a JSON string or a
    mapping (workspace in the image, or pass ``(spec, workspace_tar)``)."""
    if isinstance(task, pb.Task):
        return task
    if isinstance(getattr(task, "ref", None), str) and not hasattr(task, "spec_json"):
        return pb.Task(ref=task.ref)  # a PrefetchInfo: the node knows the task by its ref
    if isinstance(task, tuple) and len(task) == 2:
        spec, tar = task
        return pb.Task(spec_json=spec if isinstance(spec, str) else json.dumps(spec), workspace_tar=bytes(tar))
    if hasattr(task, "spec_json") and hasattr(task, "workspace_tar"):
        return pb.Task(spec_json=task.spec_json(), workspace_tar=task.workspace_tar)
    if isinstance(task, str):
        return pb.Task(spec_json=task)
    if isinstance(task, Mapping):
        return pb.Task(spec_json=json.dumps(dict(task)))
    raise TypeError(
        f"cannot send {type(task).__name__} as a task; pass a spec mapping or JSON string, (spec, workspace_tar) or a Task"
    )
