"""rLLM's ``Sandbox`` protocol (``rllm.sandbox.protocol.Sandbox``: sync ``exec``, ``upload_file``,
``upload_dir``, ``is_alive``, ``close``) on an rlsandbox session, and rLLM's per-task hooks that
give each task such a sandbox and grade it in a clean room.

rLLM (0.3) provisions a task's sandbox in its engine's task hooks and hands it to the agent flow
as ``env`` (``run(self, task, config, *, env)``); its own hooks pick backends by name. Give the
engine these hooks instead::

    from rlsandbox.integrations.rllm import RlsandboxTaskHooks

    hooks = RlsandboxTaskHooks("tasks.jsonl", target="127.0.0.1:7420", labels={"run": "my-run"})
    engine = AgentFlowEngine(agent_flow, evaluator=None, gateway=gateway, model=model, hooks=hooks)

``tasks`` finds each rLLM task's rlsandbox task by the rLLM task's ``id``: a JSONL of
``rlsandbox tasks import-*`` (Harbor folders get their folder's or ``[task]`` name as id, as
rLLM gives them), a mapping, or a function of the task. The evaluator is the session's
clean-room grade (``EvalOutput``: the reward, ``is_correct`` when resolved, ``tests_passed``);
an infra error raises, so rLLM retries the rollout and then ends it with
``TerminationReason.ERROR``. The teardown ends the session.

- ``exec(command, timeout, user)`` runs ``bash -c command`` and returns its stdout; a non-zero
  exit raises ``RuntimeError`` with the stderr's tail, as rLLM's Docker backend does. Each call
  carries a step number, so a call the client retries after a lost connection never runs twice.
  ``user`` runs it through ``runuser -u`` (a root session only).
- ``upload_file``/``upload_dir`` copy from the trainer's machine into the sandbox (a tar through
  the command's stdin: modes and symlinks kept, up to 64 MiB a call); ``download_dir`` copies a
  directory's regular files out, never writing outside the target folder (the sandbox is
  untrusted: links, devices and paths that climb out are skipped).
- ``is_alive`` asks the node (never raises); ``close`` ends the session.
- ``start_agent_process`` and ``get_endpoint`` are the earlier protocol's (rLLM <= 0.2): the first
  starts a detached process; the second raises ``NotImplementedError``, as sandboxes have no
  network for a server inside to be reached on.
- A lost sandbox raises :class:`rlsandbox.client.SandboxRPCError` naming the node.

rLLM is not on PyPI: checked by hand against rllm 0.3.0.pre's source (its ``TaskContext``,
``Evaluator``, ``Sandbox`` protocol and ``run_agent_flow``, 2026-08), and in the tests on
stand-in types with the same fields (docs/INTEGRATIONS.md).
"""

from __future__ import annotations

import shlex
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple, Union

from rlsandbox.client import Client, ExecResult, GradeResult, SandboxRPCError, Session
from rlsandbox.integrations import tools, transfer
from rlsandbox.integrations.tools import session_options, task_from_file


class RlsandboxSandbox:
    def __init__(
        self,
        name: str = "",
        image: str = "",
        *,
        target: str = "127.0.0.1:7420",
        pool: str = "",
        task: Any = None,
        labels: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        workdir: str = "",
        client: Optional[Client] = None,
        **_backend_kwargs: Any,
    ) -> None:
        labels = {**({"sandbox": name} if name else {}), **dict(labels or {})}
        options = session_options(image=image, pool=pool, task=task, labels=labels, env=env, workdir=workdir)
        self.name = name
        self._own_client = client is None
        self.client = client or Client(target)
        try:
            self.session: Optional[Session] = self.client.create_session(pool, **options)
        except BaseException:
            self._close_client()
            raise
        self._seq = 0

    def _open(self) -> Session:
        if self.session is None:
            raise RuntimeError(f"sandbox {self.name or '(unnamed)'} is closed")
        return self.session

    def _run(self, argv: List[str], *, timeout: Optional[float] = None, user: Optional[str] = None, **options: Any) -> ExecResult:
        """Runs argv: its result when it exits 0, RuntimeError otherwise."""
        if user not in (None, "", "root"):
            argv = ["runuser", "-u", str(user), "--", *argv]
        self._seq += 1
        try:
            result = self._open().exec(argv, timeout=float(timeout or 0), seq=self._seq, **options)
        except SandboxRPCError as e:
            died = tools.died(e)  # the episode killed its sandbox: a failed command, graded 0 later
            if died is None:
                raise
            result = died
        if not result.ok:
            if result.timed_out:
                status = "timed out"
            elif result.exit_code is None:
                status = f"killed by signal {result.signal}"
            else:
                status = f"exit {result.exit_code}"
            tail = result.stderr_text[-600:]
            where = self.name or self._open().id
            raise RuntimeError(f"Command failed ({status}) in sandbox {where}: {argv[-1][:200]}\nstderr (tail):\n{tail}")
        return result

    def exec(self, command: str, timeout: Optional[float] = None, user: Optional[str] = None) -> str:
        return self._run(["bash", "-c", command], timeout=timeout, user=user).stdout_text

    def upload_file(self, local_path: str, remote_path: str) -> None:
        self.upload_dir(local_path, remote_path)

    def upload_dir(self, local_path: str, remote_path: str) -> None:
        """Copies a file or a directory tree to ``remote_path`` (created, parents too)."""
        argv, data = transfer.upload(local_path, remote_path)
        self._run(argv, stdin=data)

    def download_dir(self, remote_path: str, local_path: str) -> List[str]:
        """Copies the regular files under ``remote_path`` into ``local_path``; returns their paths."""
        result = self._run(transfer.download(remote_path), stdout_cap=transfer.MAX_TRANSFER)
        return transfer.downloaded(result, remote_path, local_path)

    def start_agent_process(self, command: str, port: int) -> None:
        """Starts ``command`` detached (its output in /tmp/agent-<port>.log); returns at once."""
        log = f"/tmp/agent-{int(port)}.log"
        self._run(["bash", "-c", f"setsid nohup bash -c {shlex.quote(command)} > {log} 2>&1 < /dev/null &"])

    def get_endpoint(self, port: int) -> Tuple[str, Dict[str, str]]:
        raise NotImplementedError(
            "rlsandbox sandboxes have no network: nothing outside can reach a port inside. Run the agent "
            "flow in the trainer with this sandbox as its env (RlsandboxTaskHooks) instead of a server inside the sandbox."
        )

    def is_alive(self) -> bool:
        if self.session is None:
            return False
        try:
            return self.client.get_session(self.session.id).state == "ready"
        except Exception:
            return False

    def grade(self) -> GradeResult:
        """The session's grade by its task, in a clean room (reward None: an infra error)."""
        return self._open().grade()

    def close(self) -> None:
        session, self.session = self.session, None
        try:
            if session is not None:
                session.close()
        finally:
            if session is not None:
                self._close_client()

    def _close_client(self) -> None:
        if self._own_client:
            self.client.close()

    def __enter__(self) -> RlsandboxSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create_rlsandbox_sandbox(name: str, image: str = "", **kwargs: Any) -> RlsandboxSandbox:
    """A factory with rLLM's backend factories' signature (``sandbox_factory(name=, image=)``)."""
    return RlsandboxSandbox(name=name, image=image, **kwargs)


try:  # rLLM's per-task types (rllm >= 0.3: AgentFlowEngine(..., hooks=...)); the same fields otherwise
    from rllm.engine.agentflow_engine import TaskContext
    from rllm.eval.types import EvalOutput, Signal
except ImportError:  # pragma: no cover - rllm is not on PyPI

    @dataclass
    class Signal:  # type: ignore[no-redef]
        name: str
        value: float
        metadata: dict = field(default_factory=dict)

    @dataclass
    class EvalOutput:  # type: ignore[no-redef]
        reward: float
        is_correct: bool
        signals: list = field(default_factory=list)
        metadata: dict = field(default_factory=dict)

    @dataclass
    class TaskContext:  # type: ignore[no-redef]
        evaluator: Any
        env: Any = None
        env_backend: Optional[str] = None
        teardown: Any = None


TaskSource = Union[str, Path, Mapping[str, Any], Callable[[Any], Any]]


class CleanRoomEvaluator:
    """rLLM's ``Evaluator`` for one task's sandbox: ``evaluate(task, episode)`` is the session's
    clean-room grade. An infra error (no reward: not the agent's doing) raises, so rLLM retries
    the rollout and, past its retry limit, ends the episode with ``TerminationReason.ERROR``."""

    def __init__(self, sandbox: RlsandboxSandbox) -> None:
        self.sandbox = sandbox

    def evaluate(self, task: Any, episode: Any) -> EvalOutput:
        grade = self.sandbox.grade()
        if grade.reward is None:
            raise RuntimeError(f"rlsandbox could not grade session {grade.session_id} ({grade.status}): {grade.message}")
        listed = [t for t in grade.tests if t.group in ("fail_to_pass", "pass_to_pass")]
        signals = [Signal(name="tests_passed", value=sum(t.outcome == "passed" for t in listed) / len(listed))] if listed else []
        metadata = {
            "rlsandbox_status": grade.status,
            "rlsandbox_session": grade.session_id,
            "rlsandbox_tampering": len(grade.tampering),
        }
        return EvalOutput(reward=float(grade.reward), is_correct=grade.resolved, signals=signals, metadata=metadata)


class RlsandboxTaskHooks:
    """rLLM's task hooks (``AgentFlowEngine(agent_flow, hooks=RlsandboxTaskHooks(...))``): each
    task's sandbox is an rlsandbox session started from its rlsandbox task, handed to the flow as
    ``env``, scored by :class:`CleanRoomEvaluator` and closed at the task's teardown.

    ``tasks`` finds an rLLM task's rlsandbox task: a JSONL file of ``rlsandbox tasks import-*``
    (by the rLLM task's ``id``: the importers give Harbor folders their folder's or ``[task]``
    name, as rLLM does), a mapping of ids to specs, or a function of the rLLM task.
    """

    warm_queue = None  # rLLM's prefetch queue: the node's Prefetch does this (Client.prefetch)

    def __init__(
        self,
        tasks: TaskSource,
        *,
        target: str = "127.0.0.1:7420",
        labels: Optional[Mapping[str, str]] = None,
        client: Optional[Client] = None,
    ) -> None:
        self.tasks = tasks
        self.target = target
        self.labels = {str(k): str(v) for k, v in dict(labels or {}).items()}
        self.client = client
        self._lock = threading.Lock()  # rLLM runs setup from its executor's threads at once

    def spec(self, task: Any) -> Any:
        """The rlsandbox task of an rLLM task (or of a task id)."""
        task_id = str(getattr(task, "id", task))
        if callable(self.tasks):
            return self.tasks(task)
        if isinstance(self.tasks, Mapping):
            if task_id not in self.tasks:
                raise LookupError(f"task {task_id!r} has no rlsandbox task among the {len(self.tasks)} given")
            return self.tasks[task_id]
        return task_from_file(self.tasks, task_id)

    def close(self) -> None:
        """Close the hooks' client (the tasks' sessions end at their teardown)."""
        with self._lock:
            client, self.client = self.client, None
        if client is not None:
            client.close()

    def setup(self, task: Any, agent_flow: Any, uid: str) -> TaskContext:
        with self._lock:
            if self.client is None:
                self.client = Client(self.target)  # shared by the tasks' sandboxes (thread-safe)
            client = self.client
        sandbox = RlsandboxSandbox(name=uid, task=self.spec(task), labels={**self.labels, "rllm_uid": uid}, client=client)
        return TaskContext(evaluator=CleanRoomEvaluator(sandbox), env=sandbox, teardown=sandbox.close)
