"""A mini-swe-agent ``Environment`` on an rlsandbox session.

In a mini-swe-agent config (``environment_class`` takes an import path)::

    environment:
      environment_class: rlsandbox.integrations.minisweagent.RlsandboxEnvironment
      target: 127.0.0.1:7420
      task: {...}          # or pool: python
      timeout: 60

or in code: ``env = RlsandboxEnvironment(target=..., task=spec)``; ``DefaultAgent(model, env, ...)``
then runs its loop in the sandbox, and ``env.grade()`` is the episode's reward once it ends.

``execute(action, cwd)`` runs ``action["command"]`` through ``bash -lc`` (as mini-swe-agent's own
environments do) in the session, and returns ``{"output", "returncode", "exception_info"}``;
output that starts with ``COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`` raises mini-swe-agent's
``Submitted``, as its environments do. A lost sandbox is an ``exception_info``, and
``grade().reward is None`` for an infra error: mask the sample. ``cleanup()`` ends the session.
"""

from __future__ import annotations

import platform
from typing import Any, Dict, Optional

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel
from rlsandbox.client import Client, GradeResult, SandboxRPCError

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class RlsandboxEnvironmentConfig(BaseModel):
    target: str = "127.0.0.1:7420"
    """The node daemon's address (host:port or unix:/path)."""
    pool: str = ""
    """A pool of the node, for a session without a task."""
    task: Optional[Any] = None
    """A task spec (a dict as in docs/task.schema.json, a (spec, workspace_tar) pair, or a Prefetch ref)."""
    cwd: str = ""
    """Working directory of commands (default: the session's workdir)."""
    env: Dict[str, str] = {}
    """Environment variables of every command."""
    timeout: int = 60
    """Seconds a command may run."""
    labels: Dict[str, str] = {}
    """Labels of the session (a run id, for the aggregator)."""
    interpreter: list = ["bash", "-lc"]
    """The command is appended to this, as in mini-swe-agent's docker environment."""


class RlsandboxEnvironment:
    def __init__(self, *, config_class: type = RlsandboxEnvironmentConfig, client: Optional[Client] = None, **kwargs: Any):
        self.config = config_class(**kwargs)
        if self.config.task is None and not self.config.pool:
            raise ValueError("give a task (to grade the episode) or a pool")
        self._own_client = client is None
        self.client = client or Client(self.config.target)
        options: Dict[str, Any] = {"labels": dict(self.config.labels), "env": dict(self.config.env)}
        if self.config.task is not None:
            task = self.config.task
            self.session = self.client.create_session(task=tuple(task) if isinstance(task, list) else task, **options)
        else:
            self.session = self.client.create_session(self.config.pool, **options)
        self._closed = False

    def execute(self, action: dict, cwd: str = "", *, timeout: Optional[int] = None) -> Dict[str, Any]:
        command = action.get("command", "")
        try:
            result = self.session.exec(
                [*self.config.interpreter, command],
                cwd=cwd or self.config.cwd or self.session.info.workdir,
                timeout=float(timeout or self.config.timeout),
            )
        except SandboxRPCError as e:
            return {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {e.message}",
                "extra": {"exception_type": type(e).__name__, "exception": e.message},
            }
        output = result.stdout_text + result.stderr.decode("utf-8", errors="replace")
        if result.timed_out:
            out: Dict[str, Any] = {
                "output": output,
                "returncode": -1,
                "exception_info": f"The command timed out after {timeout or self.config.timeout} seconds",
                "extra": {"exception_type": "TimeoutExpired", "exception": "timed out"},
            }
            return out
        out = {"output": output, "returncode": result.exit_code, "exception_info": ""}
        lines = output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT and result.exit_code == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {"role": "exit", "content": submission, "extra": {"exit_status": "Submitted", "submission": submission}}
            )
        return out

    def grade(self) -> GradeResult:
        """The episode's reward from its task, graded in a clean room."""
        return self.session.grade()

    def get_template_vars(self, **kwargs: Any) -> Dict[str, Any]:
        return recursive_merge(
            self.config.model_dump(exclude={"task"}), platform.uname()._asdict(), {"session_id": self.session.id}, kwargs
        )

    def serialize(self) -> Dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json", exclude={"task"}),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                    "session_id": self.session.id,
                }
            }
        }

    def cleanup(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self.session.close()
            finally:
                if self._own_client:
                    self.client.close()

    def __del__(self) -> None:
        try:
            self.cleanup()
        except Exception:
            pass
